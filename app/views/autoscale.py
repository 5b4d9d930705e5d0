"""Autoscaling: a day of traffic on the scenario's autoscaled pool (its [autoscaling] section).

Simulate: the first hours of the day (or all of it) through `kvsim.run`: replicas, latency and SLO
attainment over time, replica-hours, $ and $ per million tokens. Plan: `kvsim plan --autoscale`'s
search of the autoscaler's main knob and min_replicas over the same hours, the cheapest setting that
meets the attainment target beside the static pool at the peak and the lower bound (the fewest
replicas per window with instant, perfect scaling). Shipped days: scenarios/autoscale/*.toml.
"""

import plotly.graph_objects as go
import streamlit as st

from kvdash import errors, runs, settings
from kvsim.planning.autoscale import plan_autoscale
from kvsim.planning.autoscale_report import autoscale_lines, rows
from kvsim.results.fleet_figures import day_figure
from kvsim.results.report import slo_text
from kvdash.source import SCENARIO_DIR
from kvsim.scenario.config import load_scenario, scenario_from_toml
from kvsim.scenario.load_curve import rate_curve
from kvsim.scenario.workload import arrival_window

cur = settings.current()


def chart(fig, key: str) -> None:
    st.plotly_chart(go.Figure({"data": fig.data, "layout": fig.layout}), theme=None, key=key)


@st.cache_data(max_entries=4, show_spinner="Searching the autoscaler's settings…")
def planned(toml_text: str, source: str, base_dir: str, inputs_digest: str):
    from pathlib import Path

    return plan_autoscale(scenario_from_toml(toml_text, source, Path(base_dir)), workers=1)


def rate_line(scenario) -> tuple[list, list] | None:
    """The offered rate over time (hours, req/s): the curve's, or the constant rate (None for traces
    and closed loops)."""
    arrival = scenario.workload.arrival
    if arrival.curve is not None:
        curve = rate_curve(arrival.curve)
        return ([float(t) / 3600 for t in curve.start] + [curve.end_s / 3600],
                [float(r) for r in curve.r0] + [float(curve.r1[-1])])
    if arrival.rate is not None and arrival.process != "immediate":
        end = max(arrival_window(scenario), 1.0) / 3600
        return [0.0, end], [arrival.rate, arrival.rate]
    return None


def load_figure(scenario) -> go.Figure:
    """The scenario's offered load over time; beside it, without an [autoscaling] section, the
    shipped days' (scenarios/autoscale/day_hpa.toml)."""
    fig = go.Figure()
    line = rate_line(scenario)
    if line is not None:
        fig.add_scatter(x=line[0], y=line[1], mode="lines", name=f"{scenario.name or 'this scenario'}",
                        line={"width": 3})
    if scenario.autoscaling is None:
        day = load_scenario(SCENARIO_DIR / "autoscale" / "day_hpa.toml")
        xs, ys = rate_line(day)
        fig.add_scatter(x=xs, y=ys, mode="lines", name="the shipped autoscaled days", fill="tozeroy", fillcolor="#5B3FA8",
                        line={"color": "#AB63FA"})
    fig.update_layout(title="Offered load (req/s)", height=600, xaxis={"title": "hours"},
                      yaxis={"rangemode": "tozero"}, legend={"orientation": "h", "y": -0.2})
    return fig


def shipped_days() -> list[dict]:
    """The shipped autoscaled days (scenarios/autoscale/): their autoscaler, bounds and what it reads."""
    rows = []
    for path in sorted((SCENARIO_DIR / "autoscale").glob("*.toml")):
        sc = load_scenario(path)
        a = sc.autoscaling
        reads = {"hpa": lambda: f"{a.hpa.metric} (per pod), target {a.hpa.target:g}",
                 "keda": lambda: f"sum({a.keda.metric}), threshold {a.keda.threshold:g} per replica",
                 "wva": lambda: "KV usage and queue per replica (saturation)",
                 "slo_aware": lambda: "P90 TTFT and TPOT over the SLO"}.get(a.policy, lambda: "–")()
        rows.append({"scenario": f"autoscale/{path.stem}", "autoscaler": a.policy,
                     "replicas": f"{a.min_replicas}-{a.max_replicas}", "reads": reads,
                     "model": f"{sc.model.name} TP {sc.hardware.tensor_parallel_size} on {sc.hardware.gpu}"})
    return rows


with errors.caught(st):
    scenario = cur.scenario
    auto = scenario.autoscaling
    if auto is None:
        st.plotly_chart(load_figure(scenario), theme=None, key="kvsim.auto.load")
        st.dataframe(shipped_days(), hide_index=True)
        st.info("This scenario's replicas are fixed (hardware.num_replicas): pick an autoscaled day under "
                "Advanced → Scenario (autoscale/day_hpa, autoscale/day_keda, autoscale/day_wva, "
                "autoscale/day_slo_aware) or upload a scenario with an [autoscaling] section.")
        st.stop()
    st.plotly_chart(load_figure(scenario), theme=None, key="kvsim.auto.load")
    day_h = arrival_window(scenario) / 3600
    st.caption(f"{settings.workload_text(scenario)} · {slo_text(scenario.slo.model_dump())} · autoscaler "
               f"{auto.policy}, {auto.min_replicas}-{auto.max_replicas} replicas")
    cols = st.columns([1, 1, 2], vertical_alignment="bottom")
    hours = cols[0].number_input("hours to simulate", 0.05, max(day_h, 0.05), min(2.0, max(day_h, 0.05)), step=0.5,
                                 key=f"kvsim.auto.hours:{cur.base.digest}",
                                 help="The day's first hours (a whole day of 1.7 million requests takes minutes).")
    toml, _ = cur.validated((f"workload.duration_s={hours * 3600:g}",))
    if cols[1].button("Simulate", type="primary", key="kvsim.auto.run"):
        st.session_state["kvsim.auto.result"] = (toml, runs.run_to_memory(toml, cur.base.source, cur.base.base_dir))
    last = st.session_state.get("kvsim.auto.result")
    if last and last[0] == toml:
        result = last[1]
        for name, s in result.summaries.items():
            a = s["autoscaling"]
            st.markdown(f"**{name}**: SLO attainment {a['attainment']:.2%} (target {a['attainment_target']:.2%}; "
                        f"{a['windows_meeting_target']} of {a['num_windows']} windows meet it) · "
                        f"{a['replica_hours']:.1f} replica-hours · ${a['usd'] or 0:,.2f} · "
                        f"${a['usd_per_m_tokens'] or 0:,.3f} per million tokens · replicas "
                        f"{a['replicas']['min']}-{a['replicas']['peak']}")
            chart(day_figure(a, scenario.slo.model_dump(), title=f"{name}: {hours:g} h on {auto.policy}"),
                  f"kvsim.auto.day.{name}")
    with st.expander("Plan the autoscaler's settings (kvsim plan --autoscale)"):
        if st.button("Search", key="kvsim.auto.plan"):
            plan = planned(toml, cur.base.source, str(cur.base.base_dir), cur.base.digest)
            st.markdown("  \n".join(autoscale_lines(plan)))
            st.dataframe(rows(plan), hide_index=True)
            if plan.best is not None:
                chart(day_figure(plan.candidates[plan.best], scenario.slo.model_dump(), plan.windows,
                                 plan.static["replicas"], title="cheapest setting meeting the target"),
                      "kvsim.auto.plan_fig")
            st.caption(f"Same numbers: `python -m kvsim plan {cur.arguments(policies=False) or 'SCENARIO.toml'} "
                       f"--set workload.duration_s={hours * 3600:g} --autoscale --workers 1`.")
