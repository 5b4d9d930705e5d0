"""`plan --autoscale`'s answer for the terminal and its files: plan.json (everything), plan.csv (a row
per setting), windows.csv (the lower bound per window) and autoscale.html (the table, and the day's
figures of the cheapest passing setting beside the lower bound and the static pool)."""

from __future__ import annotations

import html

from kvsim.planning.autoscale import AutoscalePlan
from kvsim.planning.output import csv_text, json_text

COLUMNS = ("setting", "meets_target", "attainment", "usd", "replica_hours", "usd_per_m_tokens", "peak_replicas",
           "mean_replicas", "windows_meeting_target", "stopped_early")


def _money(x) -> str:
    return "–" if x is None else f"${x:,.2f}"


def _pct(x) -> str:
    return "–" if x is None else f"{x:.2%}"


def setting_text(settings: dict) -> str:
    return ", ".join(f"{k.removeprefix('autoscaling.')}={v}" for k, v in settings.items())


def rows(result: AutoscalePlan) -> list[dict]:
    out = []
    for c in result.candidates:
        reps = c.get("replicas") or {}
        out.append({"setting": setting_text(c["settings"]), "meets_target": c["meets_target"],
                    "attainment": c.get("attainment"), "usd": c.get("usd"), "replica_hours": c.get("replica_hours"),
                    "usd_per_m_tokens": c.get("usd_per_m_tokens"), "peak_replicas": reps.get("peak"),
                    "mean_replicas": reps.get("mean"), "windows_meeting_target": c.get("windows_meeting_target"),
                    "stopped_early": c["stopped_early"]})
    return out


def autoscale_lines(result: AutoscalePlan) -> list[str]:
    """The answer in a few lines: the cheapest passing setting, the static pool, the lower bound."""
    r, lines = result, []
    lines.append(f"{r.requests:,} requests over {r.meta['span_s'] / 3600:.1f} h, policy {r.policy}; target: "
                 f"{r.target:.2%} of requests meeting every per-request SLO bound")
    if r.best is None:
        lines.append(f"no setting of the {len(r.candidates)} searched meets the target")
    else:
        c = r.candidates[r.best]
        lines.append(f"cheapest meeting it: {setting_text(c['settings'])}: {_money(c['usd'])} "
                     f"({c['replica_hours']:.1f} replica-hours, {_money(c['usd_per_m_tokens'])}/M tokens), "
                     f"attainment {_pct(c['attainment'])}, replicas {c['replicas']['min']}-{c['replicas']['peak']}")
    s = r.static
    plural = "s" if s["replicas"] != 1 else ""
    lines.append(f"static pool at the peak: {s['replicas']} replica{plural} all day: {_money(s['usd'])} "
                 f"({s['replica_hours'] or 0:.1f} replica-hours), attainment {_pct(s['attainment'])}")
    lo = r.lower
    lines.append(f"lower bound (instant, perfect scaling, fewest replicas per {r.window_s:g} s window): "
                 f"{_money(lo['usd'])} ({lo['replica_hours']:.1f} replica-hours)"
                 + ("" if lo["complete"] else "; some windows unmet even at the most replicas searched"))
    if r.best is not None and lo["usd"] and s["usd"]:
        c = r.candidates[r.best]
        lines.append(f"the autoscaler costs {c['usd'] / lo['usd']:.2f}x the lower bound and "
                     f"{c['usd'] / s['usd']:.2f}x the static pool")
    return lines


def autoscale_table(result: AutoscalePlan):
    from rich.table import Table

    table = Table(title="kvsim: autoscaler settings over the day (cheapest first)")
    for col in ("setting", "meets", "attainment", "$", "replica-h", "$/M tok", "replicas", "windows ok"):
        table.add_column(col, justify="left" if col == "setting" else "right")
    for i, row in sorted(enumerate(rows(result)), key=lambda ir: (ir[1]["usd"] is None, ir[1]["usd"] or 0, ir[0])):
        mark = "✓" if row["meets_target"] else ("✗ stopped" if row["stopped_early"] else "✗")
        table.add_row(row["setting"] + (" ← cheapest" if i == result.best else ""), mark, _pct(row["attainment"]),
                      _money(row["usd"]), "–" if row["replica_hours"] is None else f"{row['replica_hours']:.1f}",
                      _money(row["usd_per_m_tokens"]),
                      "–" if row["peak_replicas"] is None else f"{row['mean_replicas']:.1f} (peak {row['peak_replicas']})",
                      "–" if row["windows_meeting_target"] is None else str(row["windows_meeting_target"]))
    return table


def autoscale_page(result: AutoscalePlan, slo: dict) -> str:
    from kvsim.results.fleet_figures import day_figure
    from kvsim.results.report import figures_page

    figures = []
    if result.best is not None:
        best = result.candidates[result.best]
        figures.append(day_figure(best, slo, result.windows, result.static["replicas"],
                                  title=f"cheapest meeting the target: {setting_text(best['settings'])}"))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(row[c]))}</td>" for c in COLUMNS) + "</tr>"
                   for row in rows(result))
    return figures_page(f"kvsim plan --autoscale: {result.meta.get('scenario')}", autoscale_lines(result), figures,
                        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def autoscale_files(result: AutoscalePlan, slo: dict) -> dict[str, str]:
    return {"plan.json": json_text(result.to_dict()), "plan.csv": csv_text(rows(result), COLUMNS),
            "windows.csv": csv_text([{k: v for k, v in w.items() if k != "tried"} for w in result.windows]),
            "autoscale.html": autoscale_page(result, slo)}
