"""The sweep's HTML page: each policy's SLO figures and goodput against the arrival rate (the knee),
or against the first numeric swept key, one curve per policy and combination of the other keys."""

from __future__ import annotations

from kvsim.results.figures import _subplots, policy_colors
from kvsim.results.report import figures_page, slo_text
from kvsim.results.verdict import LABELS, percentile_label

DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def x_key(result) -> str:
    from kvsim.planning.sweep import RATE_KEY

    if RATE_KEY in result.keys:
        return RATE_KEY
    for key in result.keys:
        if all(isinstance(r[key], (int, float)) and not isinstance(r[key], bool) for r in result.rows):
            return key
    return "point"


def sweep_page(result) -> str:
    slo = result.meta.get("slo") or {}
    q = percentile_label(slo.get("percentile", 99.0))
    bounded = [k for k in LABELS if slo.get(k) is not None] or ["ttft_ms", "tpot_ms"]
    panels = [(f"{k}_at_pct", f"{LABELS[k]} {q} (ms)", slo.get(k)) for k in bounded]
    panels += [("goodput_rps", "goodput (req/s)", None), ("throughput_rps", "throughput (req/s)", None)]
    xk = x_key(result)
    others = [k for k in result.keys if k != xk and len({repr(r[k]) for r in result.rows}) > 1]
    colors = policy_colors(result.meta.get("policy_order") or sorted({r["policy"] for r in result.rows}))
    cols = 2
    rows = -(-len(panels) // cols)
    fig = _subplots(rows, cols, [t for _, t, _ in panels], f"Sweep: figures against {xk}", 360 * rows)
    curves: dict = {}
    for r in result.rows:
        curves.setdefault((r["policy"], tuple(r[k] for k in others)), []).append(r)
    combos = list(dict.fromkeys(key[1] for key in curves))
    for (policy, combo), members in curves.items():
        members.sort(key=lambda r: r[xk])
        name = policy + "".join(f" {k}={v}" for k, v in zip(others, combo))
        for j, (col, _, _) in enumerate(panels):
            fig.add({"type": "scatter", "mode": "lines+markers", "x": [r[xk] for r in members],
                     "y": [r[col] for r in members], "name": name, "legendgroup": name, "showlegend": j == 0,
                     "line": {"color": colors.get(policy), "dash": DASHES[combos.index(combo) % len(DASHES)]}}, j + 1)
    xs = [r[xk] for r in result.rows]
    for j, (col, title, bound) in enumerate(panels):
        fig.axis("x", j + 1, title={"text": xk})
        fig.axis("y", j + 1, **({"type": "log"} if col.startswith("ttft") else {}))
        if bound is not None and xs:
            fig.add({"type": "scatter", "mode": "lines", "x": [min(xs), max(xs)], "y": [bound, bound],
                     "name": f"SLO {bound:g} ms", "showlegend": False, "hoverinfo": "name",
                     "line": {"dash": "dash", "color": "#d62728", "width": 1.5}}, j + 1)
    lines = [f"{len(result.points)} points × {len(colors)} policies; " + slo_text(slo),
             "SLO figures at the percentile count rejected requests as infinitely late (blank: beyond every finite value)"]
    return figures_page(f"kvsim sweep: {result.scenario}", lines, [fig])
