"""Answer: the dashboard's first screen. For the question above it (model, GPU, TP x replicas,
arrival rate, SLO), a card per policy: does it meet the SLO at that rate, its safe rate (every seed
and a run four times longer sustainable there), $/hour and $ per million output tokens at the safe
rate, and what binds (a closed loop: its clients, the safe concurrency and the req/s it gets); then what serves a target rate on this GPU ("N × GPU as TP t × r replicas,
$X/h") with the best policy. The numbers are `kvsim plan`'s and `kvsim plan --target-rate`'s with
their default settings (kvdash.answers.CLI), cached by scenario. Every $ figure counts every GPU of the
layout and says at which rate it is priced. When the scenario cannot run, the page shows the library's
one line and what fixes it (kvdash.diagnosis): where the memory goes and the layouts that fit best, or
the setting to change.
"""

import streamlit as st

from kvdash import answers, diagnosis, errors, plans, settings
from kvsim.planning.output import tied_with
from kvsim.scenario.catalog import GPUS
from kvsim.results.figures import policy_colors
from kvsim.results.report import slo_text

cur = settings.current()
CARDS_PER_ROW = 5


def card(c: answers.Card, r0: float) -> None:
    box = st.container(border=True)
    star = "★ " if c.best else ""
    box.markdown(f"<span style='color:{c.color};font-size:1.3em'>■</span> **{star}{c.policy}**",
                 unsafe_allow_html=True)
    verdict = "✓ meets the SLO" if c.meets else "✗ misses the SLO"
    there = f", {c.throughput:.3g} req/s" if c.unit == "clients" and c.throughput else ""
    box.markdown(f"{verdict} at {answers.load_label(c.unit, r0)}  \n"
                 f"safe up to **{answers.load_label(c.unit, c.safe_rate)}**{there} ({c.headroom:+.0%})  \n"
                 + (f"{c.real_range}  \n" if c.real_range else "")
                 + f"knee {c.knee}" + (f"  \n= tie with {', '.join(c.tied)}" if c.tied else ""))
    money = ("no price: set cost.gpu_hour_usd" if c.usd_per_hour is None else
             f"**${c.usd_per_hour:,.2f}/hour** for {c.gpus}" + ("" if c.usd_per_m_output is None else
                                                               f" · ${c.usd_per_m_output:,.3f} per M output tokens "
                                                               f"at {c.throughput:.3g} req/s"))
    box.markdown(f"{money}  \nbinds: **{c.binding}**", help=c.binding_detail or None)
    if c.note:
        box.caption(c.note)


def target_answer(scenario, plan_result, here: tuple, r0: float) -> None:
    st.subheader("What serves a target rate")
    if scenario.workload.sessions is not None:
        st.caption("Multi-turn sessions are planned by their concurrency (the cards above): a rate of requests "
                   "is not what their users set (`kvsim plan --target-rate` refuses them).")
        return
    names = [p.policy for p in plan_result.policies]
    best_answer = max(plan_result.policies, key=lambda p: (p.safe_rate, p.mean_rate))
    best = best_answer.policy
    closed = plan_result.meta.get("load_unit") == "clients"
    if closed:  # a closed loop's rate: what its safe clients get from the best policy
        r0 = best_answer.at_safe_rate.get("throughput_rps") or 1.0
    cols = st.columns([1, 1.4, 3], vertical_alignment="bottom")
    default = float(f"{r0:.4g}")  # keyed by it too: a new question's rate is the new default
    rate = cols[0].number_input("target rate (req/s)", 0.01, 1e6, default, step=1.0, format="%g",
                                key=f"kvsim.answer.target:{cur.base.digest}:{default:g}",
                                help="The SLO must be met at this arrival rate (`kvsim plan --target-rate R`). "
                                     + ("A closed loop is planned as its requests arriving at this rate (Poisson, "
                                        "no client limit). Default: the requests/s the best policy's safe clients get."
                                        if closed else "Default: the scenario's own rate (a trace's: its mean rate)."))
    policy = cols[1].selectbox("policy", names, index=names.index(best), key=f"kvsim.answer.policy:{cur.base.digest}",
                               format_func=lambda n: f"{n} (best)" if n == best else n,
                               help="Default: the policy with the highest safe rate above.")
    gpu = scenario.hardware.gpu
    targets = plans.Targets(float(rate), policy, (gpu,), plans.TP_DEGREES, top=1, headroom=False)
    result = plans.deploy(*here, answers.CLI, targets)
    if result.deployments:
        d = result.deployments[0]
        shown = cols[2].warning if d.pricing == "estimated" else cols[2].success
        shown(f"**{d.answer()}**  \n${d.usd_per_m_output:,.3f} per M output tokens at {rate:g} req/s; every seed "
              f"and a {result.meta['long_run_requests']:,}-request run meet the SLO there  \n"
              f"{d.pricing.capitalize()}: {d.pricing_why}")
    else:
        cols[2].warning(f"No layout of {gpu} (TP 1, 2, 4, 8; up to {targets.max_replicas} replicas) meets the SLO "
                        f"at {rate:g} req/s with {policy}; the Capacity page searches every GPU.")
    st.caption("Same numbers: `python -m kvsim plan "
               f"{cur.arguments(policies=False) or 'SCENARIO.toml'} {targets.cli(tuple(GPUS))}`; other GPUs: the "
               "Capacity page's deployment search.")


with errors.caught(st):
    scenario = cur.scenario
    st.caption(f"{settings.layout_text(scenario)} · {settings.workload_text(scenario)} · "
               f"{slo_text(scenario.slo.model_dump())} · policies compared: {', '.join(cur.policies)} (change them "
               "under Advanced)")
    diag = diagnosis.diagnose(scenario)
    if diag is not None:
        st.error(errors.one_line(diag.message))
        diagnosis.buttons(diag, cur.base.digest, "answer")
        if diag.kind == diagnosis.MEMORY:
            diagnosis.memory_view(scenario, "answer")
        st.stop()
    toml = cur.toml()
    here = (toml, cur.base.source, str(cur.base.base_dir), cur.base.digest)
    result = plans.plan(*here, answers.CLI)
    r0 = result.meta["scenario_rate"]
    cost = answers.hourly_cost(scenario)
    _, out_tokens = answers.mean_tokens(*here)
    colors = policy_colors(result.meta["policy_order"])
    per_policy = {p.name: answers.hourly_cost(scenario, p) for p in scenario.policies}
    shown = answers.cards(result, colors, tied_with(result.policies),
                          {name: c[0] if c else None for name, c in per_policy.items()}, out_tokens,
                          {p.name: answers.gpus_text(scenario, p) for p in scenario.policies})
    st.subheader(f"Each policy at {answers.load_label(result.meta.get('load_unit') or 'req/s', r0)}, "
                 "and how far it goes")
    for start in range(0, len(shown), CARDS_PER_ROW):
        for col, c in zip(st.columns(CARDS_PER_ROW), shown[start:start + CARDS_PER_ROW]):
            with col:
                card(c, r0)
    closed_loop = result.meta.get("load_unit") == "clients"
    st.caption(f"Safe: every one of {len(result.meta['seeds'])} seeds × {result.meta['num_requests']:,} requests "
               f"and a {result.meta['long_run_requests']:,}-request run meet the SLO"
               + (" with that many clients (a closed loop: each client sends its next request when its last one "
                  "ended, as vllm bench serve --max-concurrency; req/s: what they get there)" if closed_loop
                  else " and keep up there") + "; the knee is the seeds' mean, ties overlap in their 95% intervals. "
               + (f"$ per M output tokens at the safe rate's req/s; $/hour from {cost[1]}. " if cost else "")
               + f"Same numbers: `python -m kvsim plan {cur.arguments() or 'SCENARIO.toml'}`.")
    target_answer(scenario, result, here, r0)  # a trace's own mean rate, as the plan replays it
