"""Disaggregation: aggregated or disaggregated serving for the question above, and which
prefill:decode ratio. For a target rate (default: the scenario's own; a trace's mean rate), the
cheapest count of prefill and decode instances for each pool layout (the GPUs and TP degrees chosen,
for each pool), beside the cheapest aggregated deployment of the same GPUs, each priced, with its
latency at the target and what binds each pool. The numbers are `kvsim plan --target-rate R
--disaggregated`'s with its default search settings (kvdash.answers.CLI), cached by scenario; the
pools' other keys (link, routers, memory share) are the scenario's [disaggregation] section's. The
table is the command line's own (kvsim.planning.output.pd_table), every column as it heads and rounds
it, so a column the library adds shows here too.
"""

import plotly.graph_objects as go
import streamlit as st

from kvdash import answers, charts, errors, plans, settings
from kvsim.planning.capacity import default_requests
from kvsim.planning.output import pd_table
from kvsim.planning.points import base_rate
from kvsim.results.report import slo_text
from kvsim.results.verdict import LABELS, percentile_label
from kvsim.scenario.catalog import GPUS
from kvsim.scenario.links import LINKS

cur = settings.current()
KIND_COLORS = {"disaggregated": "#636EFA", "aggregated": "#EF553B"}


def question(scenario, r0: float):
    """The target, the candidates and the link: (PDTargets, the scenario overrides they need)."""
    section = scenario.disaggregation
    own = [scenario.hardware.gpu] if section is None else list(dict.fromkeys(
        p.gpu or scenario.hardware.gpu for p in (section.prefill, section.decode)))
    cols = st.columns([1, 2, 1.3, 1.5, 1.3], vertical_alignment="bottom")
    key = cur.base.digest
    default = float(f"{r0:.4g}")  # keyed by it too: a new question's rate is the new default
    rate = cols[0].number_input("target rate (req/s)", 0.01, 1e6, default, step=1.0, format="%g",
                                key=f"kvsim.pd.target:{key}:{default:g}", help="The SLO must be met at this arrival rate.")
    gpus = cols[1].multiselect("GPUs, each pool", list(GPUS), default=[g for g in own if g in GPUS],
                               key=f"kvsim.pd.gpus:{key}", help="Candidates for the prefill pool and for the decode "
                               "pool (H100 prefill with H200 decode is one layout); the aggregated search takes them too.")
    tps = cols[2].multiselect("TP degrees", [1, 2, 4, 8], default=[scenario.hardware.tensor_parallel_size],
                              key=f"kvsim.pd.tp:{key}", help="vLLM's NixlConnector needs decode TP to be a multiple "
                              "of prefill TP.")
    link = cols[3].selectbox("KV link", list(LINKS), index=list(LINKS).index(
        section.link.preset if section else "infiniband-ndr"), key=f"kvsim.pd.link:{key}",
        format_func=lambda n: f"{n} ({LINKS[n].bandwidth_gbps:g} GB/s)", help=LINKS["infiniband-ndr"].source)
    mode = cols[4].selectbox("KV transfer", ["whole_request", "layerwise"], index=0 if section is None else
                             ["whole_request", "layerwise"].index(section.kv_transfer), key=f"kvsim.pd.mode:{key}")
    if not gpus or not tps:
        st.warning("Choose at least one GPU and one TP degree.")
        st.stop()
    extra = (f"disaggregation.link.preset={link}", f"disaggregation.kv_transfer={mode}")
    return plans.PDTargets(float(rate), tuple(gpus), tuple(sorted(tps))), extra


def latency_hover(result) -> tuple[list[str], str]:
    """(record keys, hover text) of every latency figure the records hold at the target, at the SLO's
    percentile: 'TTFT p99 %{customdata[0]:,.0f} ms, ...'."""
    q = percentile_label(result.meta["slo"].get("percentile", 99.0))
    keys = [f"at_target_{k}_at_pct" for k in LABELS if any(f"at_target_{k}_at_pct" in r for r in result.rows())]
    text = ", ".join(f"{LABELS[k[len('at_target_'):-len('_at_pct')]]} {q} %{{customdata[{i}]:,.1f}} ms"
                     for i, k in enumerate(keys))
    return keys, text


def options_figure(result) -> go.Figure:
    """$/hour of each option at the target, the answer first; the latencies at the target on hover."""
    rows = result.rows()
    keys, latencies = latency_hover(result)
    fig = go.Figure()
    for kind in ("disaggregated", "aggregated"):
        mine = [r for r in rows if r["kind"] == kind]
        fig.add_bar(x=[r["usd_per_hour"] for r in mine], y=[r["label"] for r in mine], orientation="h", name=kind,
                    marker_color=KIND_COLORS[kind], customdata=[[r.get(k) for k in keys] for r in mine],
                    hovertemplate=f"%{{y}}: $%{{x:,.2f}}/h; {latencies}<extra></extra>")
    fig.update_layout(title="Cheapest layouts meeting the SLO at the target ($/hour)", height=180 + 40 * len(rows),
                      yaxis={"autorange": "reversed", "automargin": True}, xaxis={"title": "$ per hour"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def table(result) -> tuple[list[dict], dict]:
    """The command line's table (pd_table) as rows, each cell as it prints it, and each column's alignment."""
    columns = list(pd_table(result).columns)
    cells = [[str(c) for c in col.cells] for col in columns]
    rows = [{str(col.header): cells[j][i] for j, col in enumerate(columns)} for i in range(len(cells[0]) if cells else 0)]
    config = {str(col.header): st.column_config.TextColumn(alignment="right" if col.justify == "right" else "left")
              for col in columns}
    return rows, config


with errors.caught(st):
    scenario = cur.scenario
    st.caption(f"{settings.workload_text(scenario)} · {slo_text(scenario.slo.model_dump())} · "
               "prefill instances run each prompt, decode instances pull its KV over the link and generate "
               "(vLLM v0.11.0, NixlConnector)")
    r0 = base_rate(scenario, default_requests(scenario))  # a trace's mean rate, as the plan replays it
    targets, extra = question(scenario, r0)
    text, _ = cur.validated(extra)
    result = plans.pd_deploy(text, cur.base.source, str(cur.base.base_dir), cur.base.digest, answers.CLI, targets)
    verdict = result.verdict()
    (st.success if result.deployments or result.aggregated.deployments else st.warning)(f"**{verdict}**")
    if result.estimated_note():
        st.warning(result.estimated_note())
    charts.plot(options_figure(result), "kvsim.pd_options")
    rows, config = table(result)
    st.dataframe(rows, hide_index=True, column_config=config)
    st.caption(f"Each pool layout's cheapest prefill:decode counts whose every seed and a "
               f"{result.meta['long_run_requests']:,}-request run meet the SLO at {targets.target_rate:g} req/s; "
               f"$/M tokens at that rate; latencies: the {percentile_label(result.meta['slo'].get('percentile', 99.0))} "
               "of the seeds' requests there (their mean); binds: what held the pool's admission back at the target, "
               "else its step time. Same numbers: "
               f"`python -m kvsim plan {cur.arguments(policies=False) or 'SCENARIO.toml'} "
               + "".join(f"--set {e} " for e in extra) + f"{targets.cli()}`.")
