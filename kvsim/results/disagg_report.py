"""The `disaggregation` section on the terminal and in report.html: the pools, the link, where the
time to first token went, what crossed the link, and what binds each pool.

`deployment_line(meta)` names the pools; `disaggregation_lines(summaries)` gives a few lines per
disaggregated policy (terminal and report); `disaggregation_table_html` and `disaggregation_figures`
are the report's table and figures (TTFT split, link use over time).
"""

from __future__ import annotations

import html

from kvsim.results.disaggregation import SPLIT
from kvsim.results.figures import _subplots, policy_colors

SPLIT_LABELS = {"queued": "queued (prefill pool)", "prefill": "prefill", "decode_wait": "decode admission",
                "transfer": "KV transfer", "first_token": "decode's first step", "api_server": "API server"}
SPLIT_COLORS = {"queued": "#B0B0B0", "prefill": "#636EFA", "decode_wait": "#FFA15A", "transfer": "#EF553B",
                "first_token": "#00CC96", "api_server": "#AB63FA"}


def disaggregated(summaries: dict[str, dict]) -> dict[str, dict]:
    """The policies served disaggregated: {name: its disaggregation section}."""
    return {name: s["disaggregation"] for name, s in summaries.items() if s.get("disaggregation")}


def pool_text(pool: dict) -> str:
    """e.g. '2 × H100-SXM TP 1'."""
    return f"{pool['num_replicas']} × {pool['gpu']} TP {pool['tensor_parallel_size']}"


def deployment_line(meta: dict) -> str:
    """The pools and link of meta's disaggregation, for the verdict's opening lines."""
    d = meta["disaggregation"]
    return (f"disaggregated ({', '.join(d['policies'])}): prefill {pool_text(d['prefill'])}, decode "
            f"{pool_text(d['decode'])}, KV over {d['link']} ({d['bandwidth_gbps']:g} GB/s a GPU), "
            f"{d['kv_transfer'].replace('_', ' ')}")


def _ms(stats: dict) -> str:
    return "–" if stats.get("mean") is None else f"{stats['mean'] * 1e3:,.1f}"


def disaggregation_lines(summaries: dict[str, dict]) -> list[str]:
    """Per disaggregated policy: the TTFT split (means), the link, and each pool's use and binding."""
    lines = []
    for name, d in disaggregated(summaries).items():
        split = d["ttft_split_s"]
        parts = ", ".join(f"{SPLIT_LABELS[k]} {_ms(split[k])}" for k in SPLIT)
        tr = d["transfers"]
        busy = tr["link_busy_fraction"]
        total = {"mean": sum(split[k]["mean"] for k in SPLIT) if all(split[k].get("mean") is not None for k in SPLIT)
                 else None}
        lines.append(f"{name}: TTFT mean {_ms(total)} ms = {parts}")
        lines.append(f"{name}: {tr['count']:,} transfers, {tr['bytes_all_links'] / 1e9:,.1f} GB over the link "
                     f"({tr['tokens']:,} tokens; {tr['decode_prefix_hit_tokens']:,} found in decode caches), link busy "
                     + ("–" if busy is None else f"{busy:.1%}"))
        for role, pool in d["pools"].items():
            lines.append(f"{name}: {role} {pool_text(pool)}: busy {pool['busy_fraction']:.0%}, KV peak "
                         f"{pool['kv_peak_used_fraction']:.0%}; binds: {pool['binding']}")
    return lines


def disaggregation_table_html(summaries: dict[str, dict]) -> str:
    """A row per disaggregated policy: the TTFT split, the link and the pools."""
    rows = disaggregated(summaries)
    if not rows:
        return ""
    head = ["policy", *(f"{SPLIT_LABELS[k]} ms (mean)" for k in SPLIT), "transfers", "GB moved", "link busy",
            "prefill busy / KV peak / binds", "decode busy / KV peak / binds"]
    body = []
    for name, d in rows.items():
        tr, busy = d["transfers"], d["transfers"]["link_busy_fraction"]
        cells = [name, *(_ms(d["ttft_split_s"][k]) for k in SPLIT), f"{tr['count']:,}",
                 f"{tr['bytes_all_links'] / 1e9:,.1f}", "–" if busy is None else f"{busy:.1%}",
                 *(f"{p['busy_fraction']:.0%} / {p['kv_peak_used_fraction']:.0%} / {p['binding']}"
                   for p in d["pools"].values())]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<h2>Disaggregation</h2><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def disaggregation_figures(summaries: dict[str, dict], meta: dict | None = None) -> list:
    """The TTFT split (stacked mean seconds per policy) and the link's use over time."""
    rows = disaggregated(summaries)
    if not rows:
        return []
    colors = policy_colors((meta or {}).get("policy_order") or list(summaries))
    names = list(rows)
    split = _subplots(1, 1, [], "Where the time to first token went (mean seconds), disaggregated policies",
                      160 + 40 * len(names))
    for key in SPLIT:
        split.add({"type": "bar", "orientation": "h", "y": names, "name": SPLIT_LABELS[key],
                   "x": [rows[n]["ttft_split_s"][key]["mean"] for n in names], "marker": {"color": SPLIT_COLORS[key]},
                   "hovertemplate": SPLIT_LABELS[key] + ": %{x:.4f} s<extra>%{y}</extra>"})
    split.layout.update(barmode="stack", yaxis={"autorange": "reversed", "automargin": True},
                        xaxis={"title": {"text": "seconds (mean)"}}, legend={"orientation": "h", "y": -0.3})
    link = _subplots(2, 1, ["busy share of the prefill instances' links", "GB/s on the busiest GPU link"],
                     "KV link over time", 480, shared_x=True)
    for name in names:
        ts = rows[name]["link_timeseries"]
        for cell, col in ((1, "busy_fraction"), (2, "gbytes_per_s")):
            link.add({"type": "scatter", "mode": "lines", "x": ts["time_s"], "y": ts[col], "name": name,
                      "legendgroup": name, "showlegend": cell == 1, "line": {"color": colors.get(name, "#444444")}}, cell)
    link.axis("x", 2, title={"text": "simulated time (s)"})
    return [split, link]
