"""The day of an autoscaled pool (summary.json's `autoscaling` section) in words and figures.

`autoscaling_lines`: per policy, a few lines for the terminal and the report's opening (`kvsim run`):
the autoscaler, the replicas it ran, SLO attainment overall and per window, replica-hours and $.

`day_figure`, for the report, `plan --autoscale`'s page and the dashboard: one column of panels sharing
the time axis (hours):

- load: requests per second offered in each window;
- replicas: the pool's spec (starting and ready) and ready replicas as steps, and beside them, when
  known, the lower bound (the fewest replicas per window meeting the SLO with instant, perfect
  scaling) and the static pool that meets it at the peak;
- TTFT and TPOT per window at p90 and p99 (log axis), each SLO bound a dashed red line;
- SLO attainment per window against the target.
"""

from __future__ import annotations

from typing import Optional

from kvsim.results.figures import SLO_RED, _Plot, _subplots

HOUR = 3600.0
AUTOSCALERS = {"hpa": "a Kubernetes HPA", "keda": "KEDA", "wva": "llm-d's Workload Variant Autoscaler",
               "slo_aware": "llm-d's SLO-aware loop", "fixed": "a fixed pool"}


def autoscaler_text(described: dict) -> str:
    """e.g. 'a Kubernetes HPA on num_requests_running (target 30)', 'a fixed pool of 3'."""
    policy = described.get("policy")
    name = AUTOSCALERS.get(policy, str(policy))
    if policy == "fixed":
        return f"{name} of {described.get('replicas')}"
    metric = described.get("metric")
    target = described.get("target", described.get("threshold"))
    if metric is None:
        return name
    return f"{name} on {metric}" + ("" if target is None else f" (target {target:g})")


def _hours(windows: list[dict]) -> str:
    """e.g. 'hours 0.00-24.00' of the windows' span."""
    if not windows:
        return "none"
    return f"hours {windows[0]['start_s'] / HOUR:.2f}-{windows[-1]['end_s'] / HOUR:.2f}"


def _money(x) -> str:
    return "–" if x is None else f"${x:,.2f}"


def autoscaling_lines(summaries: dict[str, dict]) -> list[str]:
    """Per policy that ran on an autoscaled pool: the autoscaler and its replicas, SLO attainment
    overall and per window against the target, and the bill."""
    lines = []
    for name, s in summaries.items():
        a = s.get("autoscaling")
        if not a:
            continue
        reps, startup = a["replicas"], a.get("startup")
        lines.append(f"{name}: {autoscaler_text(a['autoscaler'])}: {reps['min']}-{reps['peak']} replicas"
                     + ("" if reps["mean"] is None else f", {reps['mean']:.1f} on average")
                     + (f", {reps['created'] - reps['spec'][0]} added, {reps['scale_decisions']} scale decisions" if startup else "")
                     + ("" if startup is None else f"; a replica serves {startup['total_s']:.0f} s after it is asked for"))
        attained = "–" if a["attainment"] is None else f"{a['attainment']:.2%}"
        lines.append(f"{name}: SLO attainment {attained} of requests (target {a['attainment_target']:.2%}); "
                     f"{a['windows_meeting_target']} of {a['num_windows']} windows of {a['window_s']:g} s "
                     f"({_hours(a['windows'])}) meet it")
        price = "" if a["usd_per_gpu_hour"] is None else f" at ${a['usd_per_gpu_hour']:g} a GPU-hour"
        lines.append(f"{name}: {a['replica_hours']:,.1f} replica-hours = {a['gpu_hours']:,.1f} GPU-hours, "
                     f"{_money(a['usd'])}{price}, {_money(a['usd_per_m_tokens'])} per million tokens")
    return lines
SPEC, READY, LOWER, STATIC = "#636EFA", "#00CC96", "#AB63FA", "#7F7F7F"


def _window_mids(windows: list[dict]) -> list[float]:
    return [(w["start_s"] + w["end_s"]) / 2 / HOUR for w in windows]


def _steps(windows: list[dict], values: list) -> tuple[list, list]:
    """A per-window value as a step line over the windows' spans (hours)."""
    xs, ys = [], []
    for w, v in zip(windows, values):
        xs += [w["start_s"] / HOUR, w["end_s"] / HOUR]
        ys += [v, v]
    return xs, ys


def day_figure(auto: dict, slo: Optional[dict] = None, lower: Optional[list[dict]] = None,
               static_replicas: Optional[int] = None, title: str = "A day of traffic") -> _Plot:
    """The day's panels (module docstring). `lower`: the lower bound's windows ({start_s, end_s,
    replicas}); `static_replicas`: the static pool at the peak."""
    windows, reps, slo = auto["windows"], auto["replicas"], slo or {}
    fig = _subplots(5, 1, ["offered load (req/s)", "replicas", "TTFT per window (ms)", "TPOT per window (ms)",
                           "SLO attainment per window"], title, 1250, shared_x=True, vertical_spacing=0.05)
    x = _window_mids(windows)
    fig.add({"type": "scatter", "mode": "lines", "x": x, "y": [w["offered_rps"] for w in windows],
             "name": "offered req/s", "line": {"color": SPEC}, "showlegend": False}, 1)
    t = [v / HOUR for v in reps["times_s"]] + [auto["horizon_s"] / HOUR]
    for key, color, name in (("spec", SPEC, "replicas (spec)"), ("ready", READY, "ready")):
        fig.add({"type": "scatter", "mode": "lines", "x": t, "y": reps[key] + reps[key][-1:], "name": name,
                 "line": {"color": color, "shape": "hv"}}, 2)
    if lower:
        xs, ys = _steps(lower, [w["replicas"] for w in lower])
        fig.add({"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": "lower bound (perfect scaling)",
                 "line": {"color": LOWER, "dash": "dash"}}, 2)
    if static_replicas:
        fig.add({"type": "scatter", "mode": "lines", "x": [0, t[-1]], "y": [static_replicas] * 2,
                 "name": f"static pool at the peak ({static_replicas})", "line": {"color": STATIC, "dash": "dot"}}, 2)
    for cell, fig_key, bound in ((3, "ttft", slo.get("ttft_ms")), (4, "tpot", slo.get("tpot_ms"))):
        for q, dash in ((90, "dot"), (99, "solid")):
            fig.add({"type": "scatter", "mode": "lines", "x": x, "y": [w[f"{fig_key}_p{q}_ms"] for w in windows],
                     "name": f"{fig_key.upper()} p{q}", "line": {"color": "#EF553B" if fig_key == "ttft" else "#19D3F3",
                                                                  "dash": dash}}, cell)
        if bound:
            fig.add({"type": "scatter", "mode": "lines", "x": [0, t[-1]], "y": [bound, bound], "showlegend": False,
                     "name": f"{fig_key.upper()} bound", "line": {"color": SLO_RED, "dash": "dash"}}, cell)
        fig.axis("y", cell, type="log")
    fig.add({"type": "bar", "x": x, "y": [w["attainment"] for w in windows], "name": "attainment",
             "marker": {"color": [READY if w["meets_target"] else SLO_RED for w in windows]}, "showlegend": False}, 5)
    fig.add({"type": "scatter", "mode": "lines", "x": [0, t[-1]], "y": [auto["attainment_target"]] * 2,
             "name": "attainment target", "line": {"color": SLO_RED, "dash": "dash"}}, 5)
    fig.axis("y", 5, range=[max(0.0, min((w["attainment"] or 1.0) for w in windows) - 0.05), 1.0])
    fig.axis("x", 5, title={"text": "hours"})
    fig.layout["legend"] = {"orientation": "h", "y": -0.06}
    for key, axis in fig.layout.items():  # rounding leaves a domain a hair outside [0, 1], which plotly refuses
        if key[1:5] == "axis" and "domain" in axis:
            axis["domain"] = [min(1.0, max(0.0, round(v, 9))) for v in axis["domain"]]
    return fig


def autoscale_figures(summaries: dict[str, dict], slo: Optional[dict] = None) -> list[_Plot]:
    """A day figure per policy that ran on an autoscaled pool."""
    return [day_figure(s["autoscaling"], slo, title=f"{name}: a day on {s['autoscaling']['autoscaler']['policy']}")
            for name, s in summaries.items() if s.get("autoscaling")]
