"""Capacity: how much traffic the scenario serves, from `kvsim.plan` and `kvsim.deploy` (what
`python -m kvsim plan` prints and writes to plan.json): each policy's safe rate beside the mean and
95% interval of its knee, the SLO figures against the rate, what binds and the headroom at the
scenario's own rate; then the cheapest deployments (GPU, TP × replicas, policy) that meet the SLO at
a target rate, with $/hour and $ per million tokens.

A search runs with `kvsim plan`'s own settings unless the search settings say otherwise, with a
progress bar, and is cached by the scenario and the settings (kvdash.plans): the first visit shows
the plan the Answer page made, so the numbers are the command line's.
"""

import os

import streamlit as st

from kvdash import charts, errors, plans, runs, settings
from kvsim.errors import KvsimError
from kvsim.planning.capacity import DEFAULT_REQUESTS
from kvsim.planning.output import deploy_lines, plan_files, plan_lines, tied_with
from kvsim.planning.points import REQ_RATE, base_rate, load_unit
from kvsim.results.figures import policy_colors, policy_dashes
from kvsim.results.report import slo_text
from kvsim.results.verdict import LABELS, percentile_label
from kvsim.scenario.catalog import GPUS

RESOLUTIONS = (0.01, 0.02, 0.05, 0.1, 0.2)
TP_DEGREES = (1, 2, 4, 8)
SEARCH_PHASES = ("search", "safe_check")  # not the long runs, nor the what-ifs with twice the FLOP/s or bandwidth
SLO_RED = "#d62728"

cur = settings.current()


def search_settings(cli_requests: int) -> tuple[plans.Settings, int]:
    cols = st.columns(4)
    seeds = cols[0].number_input("seeds", 1, 20, plans.DEFAULT.seeds, key="kvsim.capacity.seeds",
                                 help="Independent replications of the workload per rate (`kvsim plan --seeds`, "
                                      "default 3): the 95% interval comes from their spread.")
    res = cols[1].selectbox("rate resolution", RESOLUTIONS, index=RESOLUTIONS.index(plans.DEFAULT.resolution),
                            format_func=lambda r: f"±{r:.0%}", key="kvsim.capacity.resolution",
                            help="Each seed's search stops when the knee is bracketed this finely "
                                 "(`--resolution`; the command line's default is ±2%).")
    n = cols[2].number_input("requests per point", 10, 100_000, cli_requests, step=500,
                             key="kvsim.capacity.requests",
                             help="Requests simulated at each rate tried (`--requests`; the command line's "
                                  "default: the scenario's, at most 3000). Fewer run faster but put the knee "
                                  "higher: a queue needs time to grow.")
    workers = cols[3].number_input("worker processes", 1, 256, os.cpu_count() or 1, key="kvsim.capacity.workers",
                                   help="Local processes running the simulations (`--workers`); the answers are "
                                        "the same whatever the number.")
    chosen = plans.Settings(int(seeds), float(res), None if int(n) == cli_requests else int(n))
    return chosen, int(workers)


def capacity_figure(result, colors: dict) -> dict:
    """Each policy's safe rate (a bar), the mean of its knee with the 95% interval (a marker), and
    the scenario's own rate (a line)."""
    ps = result.policies
    names = [p.policy for p in ps]
    unit = result.meta.get("load_unit") or "req/s"
    data = [{"type": "bar", "x": names, "y": [p.safe_rate for p in ps], "name": "safe rate",
             "marker": {"color": [colors[n] for n in names]},
             "text": [f"{p.safe_rate:.3g}" for p in ps], "textposition": "inside", "insidetextanchor": "end",
             "customdata": [[p.binding or "–"] for p in ps],
             "hovertemplate": "%{x}: safe at %{y:.3g} " + unit + "; binds: %{customdata[0]}<extra></extra>"},
            {"type": "scatter", "mode": "markers", "x": names, "y": [p.mean_rate for p in ps],
             "name": "knee: mean of the seeds (95% CI)", "marker": {"color": "#333", "symbol": "diamond", "size": 9},
             "error_y": {"type": "data", "symmetric": False, "array": [p.ci_high - p.mean_rate for p in ps],
                         "arrayminus": [p.mean_rate - p.ci_low for p in ps], "color": "#333"},
             "text": [(">" if p.censored else "") + f"{p.mean_rate:.3g}" for p in ps],
             "hovertemplate": "%{x}: knee %{text} " + unit + "<extra></extra>"}]
    r0 = result.meta["scenario_rate"]
    rates = [0, len(names) - 1] if names else [0, 0]
    data.append({"type": "scatter", "mode": "lines", "x": [names[rates[0]], names[rates[1]]] if names else [],
                 "y": [r0, r0], "name": f"the scenario's {r0:.3g} {unit}", "line": {"dash": "dash", "color": "#444"}})
    return {"data": data, "layout": {"height": 400, "title": {"text": "Safe rate per policy, and the knee it is below"},
                                     "yaxis": {"title": {"text": AXIS.get(unit, unit)}, "rangemode": "tozero"},
                                     "legend": {"orientation": "h", "y": -0.15}}}


AXIS = {"req/s": "requests/s", "sessions/s": "sessions/s", "clients": "clients"}
LOAD = {"req/s": "arrival rate", "sessions/s": "session arrival rate", "clients": "concurrency (closed loop)"}


def curve_figure(result, colors: dict, column: str, title: str, bound) -> dict:
    """One figure at the percentile against the arrival rate, per policy: the mean over the seeds tried
    at each rate (open markers: some seed not sustainable there; a star: the safe rate)."""
    data = []
    unit = result.meta.get("load_unit") or "req/s"
    dashes = policy_dashes(list(colors))
    for policy, color in colors.items():
        by_rate: dict = {}
        for pt in result.points:  # a seed's search and the safe check may simulate one rate twice: the same point
            if pt["policy"] == policy and pt["phase"] in SEARCH_PHASES:
                by_rate.setdefault(pt["rate"], {})[pt["seed"]] = pt
        by_rate = {r: list(seeds.values()) for r, seeds in by_rate.items()}
        rates = sorted(by_rate)
        ys = [_mean(pt[column] for pt in by_rate[r]) for r in rates]
        ok = [all(pt["sustainable"] for pt in by_rate[r]) for r in rates]
        safe = next(p.safe_rate for p in result.policies if p.policy == policy)
        data.append({"type": "scatter", "mode": "lines+markers", "name": policy, "legendgroup": policy,
                     "x": rates, "y": ys, "line": {"color": color, "dash": dashes[policy]},
                     "marker": {"symbol": ["star" if r == safe else "circle" if good else "circle-open"
                                           for r, good in zip(rates, ok)],
                                "size": [14 if r == safe else 8 for r in rates]},
                     "hovertemplate": policy + ": %{y:,.4g} at %{x:.3g} " + unit + "<extra></extra>"})
    rates = [pt["rate"] for pt in result.points if pt["phase"] in SEARCH_PHASES]
    if bound is not None and rates:
        data.append({"type": "scatter", "mode": "lines", "x": [min(rates), max(rates)], "y": [bound, bound],
                     "name": f"SLO {bound:g} ms", "line": {"dash": "dash", "color": SLO_RED}})
    yaxis = {"title": {"text": title}}
    if column.startswith("ttft"):
        yaxis["type"] = "log"
    return {"data": data, "layout": {"height": 380, "title": {"text": f"{title} against the {LOAD.get(unit, 'load')}"},
                                     "xaxis": {"title": {"text": f"{LOAD.get(unit, 'load')} ({AXIS.get(unit, unit)})"}},
                                     "yaxis": yaxis}}


def _mean(values):
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None  # None: beyond every finite value (a gap in the curve)


def slo_columns(slo: dict) -> list[tuple[str, str, float]]:
    """(point column, label, bound) of each figure the SLO bounds."""
    q = percentile_label(slo.get("percentile", 99.0))
    return [(f"{k}_at_pct", f"{LABELS[k]} {q} ms", slo[k]) for k in LABELS if slo.get(k) is not None]


def plan_rows(result) -> list[dict]:
    cols = slo_columns(result.meta["slo"])
    tied = tied_with(result.policies)
    return [{"policy": p.policy, "safe req/s": p.safe_rate,
             "real, held-out range": "–" if not p.safe_rate_interval else
             f"{p.safe_rate_interval['low']:.3g}–{p.safe_rate_interval['high']:.3g}",
             "knee (95% CI)": f"{p.mean_rate:.3g} ({p.ci_low:.3g}–{p.ci_high:.3g})" + (" >" if p.censored else ""),
             "tied with": ", ".join(tied[p.policy]) or "–", "headroom": p.headroom * 100,
             f"at {result.meta['scenario_rate']:.3g}/s": "✓" if p.sustainable_at_scenario_rate else "✗",
             **{label: p.at_safe_rate.get(f"worst_{col}") for col, label, _ in cols},
             "binds": p.binding} for p in result.policies]


def deploy_rows(result) -> list[dict]:
    """`kvsim plan --target-rate`'s table: the cheapest passing layouts, each with its own safe rate."""
    r = result.target_rate
    return [{"GPU": d.gpu, "TP × replicas": f"{d.layout} × {d.num_replicas}", "GPUs": d.num_gpus,
             "policy": d.policy, "safe req/s": f"{d.safe_rate:.3g}" if d.safe_rate is not None else f"≥{r:g}",
             "knee (95% CI)": "–" if d.mean_rate is None else f"{d.mean_rate:.3g} ({d.ci_low:.3g}–{d.ci_high:.3g})",
             "$/hour": d.usd_per_hour, "$/M input": d.usd_per_m_input, "$/M output": d.usd_per_m_output,
             "headroom": "–" if d.headroom is None else f"{d.headroom:+.0%}", "binds": d.binding,
             "priced": f"{d.pricing}: {d.pricing_why}"}
            for d in result.deployments]


def cost_figure(result) -> dict:
    ds = [d for d in result.deployments if d.meets_target]
    labels = [d.label for d in ds]
    return {"data": [{"type": "bar", "orientation": "h", "y": labels, "x": [d.usd_per_m_output for d in ds],
                      "marker": {"color": "#00CC96"}, "customdata": [[d.usd_per_hour, d.num_gpus] for d in ds],
                      "hovertemplate": "%{y}: $%{x:.3f} per M output tokens, $%{customdata[0]:.2f}/h on "
                                       "%{customdata[1]} GPUs<extra></extra>"}],
            "layout": {"height": 120 + 28 * len(ds), "title": {"text": "Passing deployments: $ per million output tokens"},
                       "yaxis": {"autorange": "reversed"}, "xaxis": {"title": {"text": "$ per M output tokens"}},
                       "margin": {"l": 160}}}


def show(fig: dict, key: str) -> None:
    charts.plot(fig, f"kvsim.capacity_{key}")


def downloads(result, prefix: str) -> None:
    cols = st.columns(3)
    for col, (name, text) in zip(cols, plan_files(result).items()):
        col.download_button(name, text, file_name=name, mime="application/json" if name.endswith("json") else "text/csv",
                            on_click="ignore", key=f"kvsim.dl_{prefix}_{name}")


def number_columns(rows: list[dict]) -> dict:
    """Display formats of a table's numeric columns, by their names; short columns narrow, so the
    table fits the page."""
    out = {}
    for name, value in (rows[0] if rows else {}).items():
        if name.startswith("at ") and name.endswith("/s"):
            out[name] = st.column_config.TextColumn(width="small")
        if not isinstance(value, float):
            continue
        if name == "headroom":
            out[name] = st.column_config.NumberColumn(format="%+.0f%%", width="small")
        elif name.startswith("$"):
            out[name] = st.column_config.NumberColumn(format="%.3f", width="small")
        elif " ms " in name:
            out[name] = st.column_config.NumberColumn(format="%.0f", width="small")
        else:
            out[name] = st.column_config.NumberColumn(format="%.3g", width="small")
    return out


def show_plan(result) -> None:
    st.markdown("  \n".join(plan_lines(result)))  # the command line's summary
    colors = policy_colors(result.meta["policy_order"])
    colors = {p.policy: colors[p.policy] for p in result.policies}
    show(capacity_figure(result, colors), "max_rate")
    rows = plan_rows(result)
    st.dataframe(rows, hide_index=True, column_config=number_columns(rows), width="stretch")
    st.caption("at r/s: every seed sustainable at the scenario's own rate; the SLO figures: the worst of the seeds and "
               "the long run at the safe rate; binds: at the knee.")
    with st.expander("What binds at each policy's knee"):
        st.markdown("  \n".join(f"**{p.policy}**: {p.binding_detail}" for p in result.policies))
    for i, (col, label, bound) in enumerate(slo_columns(result.meta["slo"])):
        show(curve_figure(result, colors, col, label, bound), f"curve_{i}")
    downloads(result, "plan")


def show_deploy(result) -> None:
    st.markdown("  \n".join(deploy_lines(result)))
    rows = deploy_rows(result)
    st.dataframe(rows, hide_index=True, column_config=number_columns(rows), height="content", width="stretch")
    sources = sorted({d.price_source for d in result.deployments})
    if sources:
        st.caption("Prices: " + "; ".join(sources))
    if any(d.meets_target for d in result.deployments):
        show(cost_figure(result), "cost")
    if result.skipped:
        with st.expander(f"{len(result.skipped)} layouts left out"):
            st.dataframe(result.skipped, hide_index=True)
    downloads(result, "deploy")


def deploy_targets(scenario) -> plans.Targets | None:
    """The deployment search's form; its targets when submitted, else None."""
    with st.form("kvsim.capacity.deploy_form", border=True):
        cols = st.columns([1, 1, 2, 1, 1])
        own = load_unit(scenario) == REQ_RATE  # a closed loop's load is clients, sessions come in sessions/s
        default = float(f"{base_rate(scenario):.4g}") if own else 1.0  # keyed by it too: it follows the question
        rate = cols[0].number_input("target rate (req/s)", 0.01, 1e6, default, step=1.0, format="%g",
                                    key=f"kvsim.capacity.target_rate:{cur.base.digest}:{default:g}",
                                    help="The SLO must be met at this arrival rate (`--target-rate R`). Default: the "
                                         "scenario's own rate (a trace's: its mean rate). A closed loop is planned as "
                                         "its requests arriving at this rate (Poisson, no client limit); multi-turn "
                                         "sessions are planned by their concurrency only.")
        names = [None] + [p.name for p in scenario.policies]
        policy = cols[1].selectbox("policy", names, key="kvsim.capacity.policy",
                                   format_func=lambda n: "the best for each layout" if n is None else n,
                                   help="The policy every layout runs (`--policy`); default: every policy is tried "
                                        "on one replica of each layout, which keeps the best.")
        gpus = cols[2].multiselect("candidate GPUs", list(GPUS), default=list(GPUS), key="kvsim.capacity.gpus",
                                   help="GPU presets to price (`--gpu`, repeatable; default: all).")
        tps = cols[3].multiselect("TP degrees", TP_DEGREES, default=list(TP_DEGREES), key="kvsim.capacity.tps",
                                  help="tensor_parallel_size values to try (`--tp`; default 1, 2, 4, 8).")
        most = cols[4].number_input("max replicas", 1, 4096, 64, key="kvsim.capacity.max_replicas",
                                    help="Layouts needing more replicas are left out (`--max-replicas`).")
        go_ = st.form_submit_button("Search deployments", type="primary")
    if not go_:
        return None
    if not gpus or not tps:
        raise KvsimError("deployment search: choose at least one candidate GPU and one TP degree")
    return plans.Targets(float(rate), policy, tuple(g for g in GPUS if g in gpus), tuple(sorted(tps)), int(most))


def same_numbers(args: str, policies: bool) -> str:
    """'Same numbers: `python -m kvsim plan ...`' with `args` on the sidebar's scenario."""
    scenario = cur.arguments(policies)
    note = "" if scenario else " (SCENARIO.toml: the scenario file above)"
    return f"Same numbers: `python -m kvsim plan {scenario or 'SCENARIO.toml'} {args}`{note}"


def remembered(name: str, key: tuple, pressed: bool, first_visit: bool = False, ready: bool = False):
    """The search to show: this one when its button was pressed, it is `ready` (cached: no search to wait
    for) or on a first visit (if allowed), else the session's last one of `name` if it searched this very
    scenario."""
    state = f"kvsim.capacity.{name}"
    if pressed or ready or (first_visit and state not in st.session_state):
        st.session_state[state] = key
    last = st.session_state.get(state)
    return last if last is not None and last[0] == key[0] else None


scenario, base = cur.scenario, cur.base
toml = cur.toml()
here = (toml, base.source, str(base.base_dir), base.digest)
st.caption(f"{scenario.name}: {settings.layout_text(scenario)}; {slo_text(scenario.slo.model_dump())}. "
           "Sustainable = the SLO met at its percentile and the engine keeping up with the arrivals.")
st.download_button("scenario TOML", cur.download_toml(), file_name=f"{scenario.name or 'scenario'}.toml",
                   mime="application/toml", on_click="ignore", key="kvsim.capacity.dl_toml",
                   help="These settings as a scenario file for `python -m kvsim plan`")
with st.expander("Search settings (default: `kvsim plan`'s)"):
    count = runs.request_count(*here)  # None: a duration, not a count
    search, workers = search_settings(min(count or DEFAULT_REQUESTS, DEFAULT_REQUESTS))

st.subheader("Safe rate per policy")
with errors.caught(st):
    pressed = st.button("Search the safe rates", type="primary", key="kvsim.capacity.plan_button",
                        help="Bracket and bisect each policy's arrival rate under the SLO, then check the safe rate "
                             "on every seed and a longer run (`kvsim plan`).")
    want = remembered("plan", (here, search), pressed, first_visit=True, ready=plans.planned(*here, search))
    if want is None:
        st.info("No search of these settings yet (a plan of the Answer page's, or an earlier search, shows at once): "
                "press **Search the safe rates**.")
    else:
        (_, settings_used) = want
        result = plans.plan(*here, settings_used, _workers=workers)
        st.caption(same_numbers(" ".join(filter(None, (settings_used.cli(), "--out DIR"))), policies=True)
                   + ("" if settings_used == search else " (these are the last settings searched)"))
        show_plan(result)

st.subheader("Deployment search: the cheapest layouts at a target rate")
with errors.caught(st):
    targets = deploy_targets(scenario)
    key = (here, search, targets)
    want = remembered("deploy", key, targets is not None)
    if want is None:
        st.info("Pick the target rate and the candidates, then press **Search deployments**.")
    else:
        (_, settings_used, targets_used) = want
        result = plans.deploy(*here, settings_used, targets_used, _workers=workers)
        st.caption(same_numbers(" ".join(filter(None, (targets_used.cli(tuple(GPUS)), settings_used.cli(), "--out DIR"))),
                                policies=False))
        show_deploy(result)

from kvdash import extras  # noqa: E402  (speculative decoding's k search, when the scenario has it)

extras.speculation_section(scenario, *here[:3], search, workers)
