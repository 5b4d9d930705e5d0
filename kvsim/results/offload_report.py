"""The report's KV offload part: a row per offloaded policy (hits per tier beside the optimal bound,
bytes and seconds per direction, evictions) and, over time, each tier's hit tokens, the bytes each
direction moved and the seconds its transfers took (summary.json's kv_offload, kvsim.results.offload)."""

from __future__ import annotations

import html

from kvsim.results.figures import _subplots, policy_colors


def offloaded(summaries: dict[str, dict]) -> dict[str, dict]:
    return {name: s["kv_offload"] for name, s in summaries.items() if s.get("kv_offload")}


def _pct(x) -> str:
    return "–" if x is None else f"{x:.1%}"


def offload_table_html(summaries: dict[str, dict]) -> str:
    rows = offloaded(summaries)
    if not rows:
        return ""
    head = ["policy", "connector", "GPU hits", "CPU hits", "disk hits", "CPU hits, optimal eviction",
            "GB loaded (s)", "GB stored (s)", "CPU evictions", "H2D / D2H busy"]
    body = []
    for name, o in rows.items():
        opt = (o.get("optimal") or {}).get("cpu_hit_rate")
        links = o["links"]
        cells = [name, f"{o['backend']} {o['kv_offloading_size_gib']:g} GiB {o['eviction_policy']}",
                 _pct(o["hit_rate"]["gpu"]), _pct(o["hit_rate"]["cpu"]), _pct(o["hit_rate"]["disk"]), _pct(opt),
                 f"{o['loads']['bytes'] / 1e9:,.1f} ({o['loads']['transfer_s']:,.1f})",
                 f"{o['stores']['bytes'] / 1e9:,.1f} ({o['stores']['transfer_s']:,.1f})",
                 f"{o['evictions']['cpu']:,}",
                 f"{_pct(links['h2d_busy_fraction'])} / {_pct(links['d2h_busy_fraction'])}"]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<h2>KV offload tiers</h2><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def offload_figures(summaries: dict[str, dict], meta: dict | None = None) -> list:
    """Per interval: tokens hit per tier, GB/s loaded and stored, transfer seconds per direction."""
    rows = offloaded(summaries)
    if not rows:
        return []
    colors = policy_colors((meta or {}).get("policy_order") or list(summaries))
    fig = _subplots(3, 1, ["tokens hit in the CPU tier (dashed: disk) per second", "GB/s loaded (solid) and "
                           "stored (dotted)", "transfer seconds per second, loads (solid) and stores (dotted)"],
                    "KV offload tiers over time", 720, shared_x=True)
    for name, o in rows.items():
        ts, width, color = o["timeseries"], o["timeseries"]["interval_s"], colors.get(name, "#444444")
        traces = ((1, "cpu_hit_tokens", 1, "solid"), (1, "disk_hit_tokens", 1, "dash"),
                  (2, "loaded_bytes", 1e9, "solid"), (2, "stored_bytes", 1e9, "dot"),
                  (3, "load_s", 1, "solid"), (3, "store_s", 1, "dot"))
        for cell, col, scale, dash in traces:
            if col == "disk_hit_tokens" and o["hit_rate"]["disk"] is None:
                continue
            fig.add({"type": "scatter", "mode": "lines", "x": ts["time_s"], "y": [v / scale / width for v in ts[col]],
                     "name": name, "legendgroup": name, "showlegend": cell == 1 and dash == "solid",
                     "line": {"color": color, "dash": dash}}, cell)
    fig.axis("x", 3, title={"text": "simulated time (s)"})
    return [fig]
