"""A run's self-contained HTML report and the terminal comparison table.

`write_report_html` turns a results folder's summaries and CSVs into one HTML page with plotly.js
inlined (the figures: kvsim/results/figures.py); `comparison_table` puts the headline figures of
every policy side by side for the terminal (kvsim/results/headline.py).

Both open with the verdict (`verdict_lines`: model, GPU, TP x replicas, offered rate and SLO, then
which policies meet the SLO, by how much and what binds, from kvsim.results.verdict), and every
table shows the figures the SLO judges. `policy_colors` gives each policy its colour on every page.
"""

from __future__ import annotations

import html
import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError
from kvsim.results.energy import energy_line
from kvsim.results.speculative import speculation_line
from kvsim.results.offload_report import offload_figures, offload_table_html
from kvsim.results.disagg_report import deployment_line, disaggregation_figures, disaggregation_table_html
from kvsim.results.fleet_figures import AUTOSCALERS, autoscale_figures, autoscaling_lines
from kvsim.results.figures import PHASES, _Plot, _read_latencies, report_plots, why_missed
from kvsim.results.headline import table_figures
from kvsim.results.metrics import SLO_KEYS
from kvsim.results.verdict import LABELS, judge, percentile_label
from kvsim.scenario.load_curve import curve_text
from kvsim.scenario.layout import deployment_text, layout_text, replica_gpus


def _verdict_cell(summary: dict) -> str:
    if not summary.get("slo"):
        return "–"
    v = judge(summary)
    if not v.stable:
        return "✗ unstable"
    margin = v.margin  # the share of the tightest bound to spare (negative: over it)
    return ("✓" if v.met else "✗") + ("" if margin is None else f" {margin:+.0%}")


def _table_rows(summaries: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Header and one row of text cells per policy."""
    figures = table_figures(summaries)
    header = ["policy", "SLO margin", "finished/rejected", *(f.label for f in figures)]
    rows = []
    for name, s in summaries.items():
        req = s.get("requests", {})
        rows.append([name, _verdict_cell(s), f"{req.get('finished', 0)}/{req.get('rejected', 0)}",
                     *(f.text(s) for f in figures)])
    return header, rows


def _rate_text(arrival: dict, offered, clients: dict | None = None) -> str:
    """How the load came: e.g. 'poisson 14 req/s, offered 13.9 req/s', or a closed loop's clients."""
    process, clients = arrival.get("process"), clients or {}
    n, sessions, think = clients.get("max_concurrency"), clients.get("sessions"), clients.get("think_time_s")
    unit = "sessions/s" if sessions else "req/s"
    if process == "trace":
        scale = arrival.get("time_scale", 1.0)
        text = "trace replay" + (f" (time × {scale:g})" if scale != 1.0 else "")
    elif process == "immediate":
        text = f"closed loop of {n:,} clients" if n else "every request at t = 0"
    elif arrival.get("curve"):
        text = f"{process} {curve_text(arrival['curve'])}"
    else:
        text = f"{process} {arrival.get('rate', 0):g} {unit}" + (f" (cv {arrival['cv']:g})" if process == "gamma" else "")
    if n and process != "immediate":
        text += f", at most {n:,} in flight"
    if sessions:
        text += f", sessions of {_dist_text(sessions.get('turns') or {})} turns"
    if think:
        text += f", think time {_dist_text(think)} s"
    if offered is None:
        return text
    return text + (f", sent {offered:.2f} req/s (first to last request sent)" if n and process == "immediate"
                   else f", offered {offered:.2f} req/s (first to last arrival)")


def _dist_text(dist: dict) -> str:
    kind = dist.get("dist")
    if kind == "fixed":
        return f"{dist['value']:g}"
    if kind == "uniform":
        return f"{dist['min']:g}–{dist['max']:g}"
    if kind in ("exponential", "lognormal"):
        return f"{kind} mean {dist['mean']:g}"
    return str(kind)


def slo_text(slo: dict) -> str:
    """e.g. 'SLO at p99: TTFT ≤ 2000 ms, TPOT ≤ 60 ms'."""
    bounds = [f"{LABELS[k]} ≤ {slo[k]:g} ms" for k in SLO_KEYS if slo.get(k) is not None]
    return f"SLO at {percentile_label(slo.get('percentile', 99.0))}: " + (", ".join(bounds) or "no latency bound")


def meta_deployment_text(meta: dict) -> str:
    """The deployment a run's (or plan's) meta names, e.g. '2 × H100-SXM as TP 1 × DP 2 + EP × 1 replica';
    an autoscaled pool's, e.g. 'H100-SXM TP 4 replicas (4 GPUs each), 2 to 14 under a Kubernetes HPA'."""
    auto = meta.get("autoscaling")
    if auto and auto["policy"] != "fixed":
        tp, dp = meta.get("tensor_parallel_size", 1), meta.get("data_parallel_size", 1)
        gpus = replica_gpus(tp, dp)
        return (f"{meta.get('gpu')} {layout_text(tp, dp, bool(meta.get('enable_expert_parallel')))} replicas "
                f"({gpus} GPU{'s' if gpus != 1 else ''} each), {auto['min_replicas']} to {auto['max_replicas']} "
                f"under {AUTOSCALERS.get(auto['policy'], auto['policy'])}")
    return deployment_text(meta.get("gpu"), meta.get("tensor_parallel_size", 1), meta.get("num_replicas", 1),
                           meta.get("data_parallel_size", 1), bool(meta.get("enable_expert_parallel")))


def verdict_lines(summaries: dict[str, dict], meta: dict | None = None) -> list[str]:
    """What ran and against which SLO, then per policy: meets the SLO or not, by how much, what binds."""
    meta = meta or {}
    lines = []
    if meta.get("model"):
        offered = next((s.get("arrivals", {}).get("offered_rps") for s in summaries.values()), None)
        pools = meta.get("disaggregation")
        where = ("" if pools and set(pools["policies"]) >= set(meta.get("policy_order") or summaries) else
                 f" on {meta_deployment_text(meta)}")
        lines.append(f"{meta['model']}{where}; {_rate_text(meta.get('arrival') or {}, offered, meta.get('clients'))}")
        if pools:
            lines.append(deployment_line(meta))
    basis = meta.get("pricing_basis")
    if basis:  # measured or estimated, and why (kvsim.perf.basis)
        label = basis["label"].upper() if basis["label"] == "estimated" else basis["label"]
        lines.append(f"step times {label}: {basis['why']}")
    if meta.get("slo"):
        lines.append(slo_text(meta["slo"]))
    verdicts = {name: judge(s) for name, s in summaries.items() if s.get("slo")}
    passing = [n for n, v in verdicts.items() if v.sustainable]
    if verdicts:
        lines.append(f"{len(passing)} of {len(verdicts)} policies meet the SLO" + (f": {', '.join(passing)}" if passing else ""))
    for name, v in verdicts.items():
        lines.append(f"{'✓' if v.sustainable else '✗'} {name}: {v.summary_text()}; binds: {v.binding_detail}")
        lines += speculation_line(name, summaries[name]) + energy_line(name, summaries[name])
    lines += error_bar_lines(summaries, (meta.get("slo") or {}).get("percentile", 99.0))
    return lines


def error_bar_lines(summaries: dict[str, dict], percentile: float = 99.0) -> list[str]:
    """Per policy with error bars (kvsim.results.intervals): its TTFT, TPOT and E2E at the SLO's percentile
    (p50, p90 or p99, the nearest kept) with the range real runs like it fell in around kvsim's figures;
    first, once, what the held-out runs were where these runs differ from them, and how."""
    from kvsim.results.intervals import figure_text, runs_text, unlike_text

    stat = min(("p50", "p90", "p99"), key=lambda k: abs(float(k[1:]) - percentile))
    lines, unlike = [], {}
    for name, s in summaries.items():
        bars = s.get("prediction_intervals")
        texts = [t for m in ("ttft", "tpot", "e2e") if (t := figure_text(s, m, stat, brief=True))]
        if bars and texts:
            unlike.setdefault(tuple(bars.get("unlike", ())), []).append(name)
            lines.append(f"  {name}, held-out error bars ({bars['basis']} pricing, {bars['band']} load): "
                         + "; ".join(texts))
    caveats = [f"  error bars{'' if len(unlike) == 1 else ' of ' + ', '.join(names)} from held-out real runs "
               f"({runs_text()}){unlike_text(differs)}" for differs, names in unlike.items() if differs]
    return caveats + lines


def comparison_table(summaries: dict[str, dict], transpose: bool = False):
    """A rich table with one row per policy, or (`transpose`, for narrow terminals) one column per policy."""
    header, rows = _table_rows(summaries)
    from rich.table import Table  # the terminal's table only: a quiet run does not load rich

    table = Table(title="kvsim: policy comparison")
    if transpose:
        table.add_column(header[0], no_wrap=True)
        for row in rows:
            table.add_column(row[0], justify="right", overflow="fold")
        for i, label in enumerate(header[1:], start=1):
            table.add_row(label, *(row[i] for row in rows))
        return table
    for i, label in enumerate(header):
        table.add_column(label, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*row)
    return table


def _package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it (plotly's import costs more than
    reading its plotly.min.js)."""
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise KvsimError(f"the report needs the {name} package, which is not installed: pip install {name} "
                         "(or reinstall kvsim)")
    return Path(spec.submodule_search_locations[0])


def _json(value) -> str:
    """JSON for a <script> block: arrays as lists, and no '</' that could close the script."""
    text = json.dumps(value, default=lambda a: a.tolist() if hasattr(a, "tolist") else str(a),
                      separators=(",", ":"))
    return text.replace("</", "<\\/")


def _figure_html(fig: _Plot, div_id: str) -> str:
    return (f'<div id="{div_id}" style="height:{fig.layout["height"]}px;width:100%"></div>\n'
            f'<script>Plotly.newPlot("{div_id}",{_json(fig.data)},{_json(fig.layout)},{{"responsive":true}});</script>')


def _summary_table_html(summaries: dict[str, dict]) -> str:
    header, rows = _table_rows(summaries)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _why_table_html(rows: list[dict]) -> str:
    """Why requests missed: per policy and group, mean seconds per phase and how often each was the longest."""
    head = ["policy", "requests", *(f"{name.split(' (')[0]} s (mean)" for _, name, _ in PHASES),
            "of which preempted s", *(f"longest: {name.split(' (')[0]}" for _, name, _ in PHASES)]
    body = []
    for r in rows:
        cells = [f"{r['policy']} · {r['group']}", f"{r['requests']:,}", *(f"{r[c]:.3f}" for c, _, _ in PHASES),
                 f"{r['preempted_s']:.3f}", *(f"{r['longest_' + c]:,}" for c, _, _ in PHASES)]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<h2>Why requests missed the SLO</h2><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
ul.verdict{font-size:15px;line-height:1.5;list-style:none;padding-left:0}
table{border-collapse:collapse;font-size:13px;margin-bottom:24px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}"""


def write_report_html(path, scenario_name: str, summaries: dict[str, dict], requests_csv_path,
                      timeseries_csv_path, latencies: dict[str, dict[str, np.ndarray]] | None = None,
                      meta: dict | None = None,
                      series: dict[tuple[str, int], dict[str, np.ndarray]] | None = None) -> None:
    """One self-contained HTML page (plotly.js inlined once) comparing the policies of a run.

    `latencies` (per policy, as `Metrics.latencies()`) saves reading requests.csv back, `series` (as
    `timeseries_arrays`) timeseries.csv; `meta` (as summary.json's) names model, GPU, layout, arrivals
    and SLO for the verdict."""
    if latencies is None or any("missed" not in v for v in latencies.values()):
        first = next(iter(summaries.values()), {}).get("slo") or {}
        latencies = _read_latencies(Path(requests_csv_path), (meta or {}).get("slo") or first.get("bounds"))
    figures = report_plots(summaries, requests_csv_path, timeseries_csv_path, latencies, meta, series)
    figures += disaggregation_figures(summaries, meta)
    figures += disaggregation_figures(summaries, meta) + offload_figures(summaries, meta)
    figures += autoscale_figures(summaries, (meta or {}).get("slo"))
    rows = why_missed(latencies)
    why = _why_table_html(rows) if any(r["group"] == "missed" for r in rows) else ""
    page = figures_page(f"kvsim report: {scenario_name}", verdict_lines(summaries, meta) + autoscaling_lines(summaries),
                        figures,
                        _summary_table_html(summaries) + disaggregation_table_html(summaries)
                        + offload_table_html(summaries) + why)
    Path(path).write_text(page, encoding="utf-8")


def figures_page(title: str, lines: list[str], figures: list[_Plot], table_html: str = "") -> str:
    """A self-contained HTML page: a title, lines of text, an HTML table and plotly figures (plotly.js inlined once)."""
    plotly_js = (_package_dir("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    divs = [f"<script>{plotly_js}</script>"] + [_figure_html(fig, f"kvsim-fig-{i}") for i, fig in enumerate(figures)]
    name = html.escape(title)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{name}</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>{name}</h1>\n"
            f'<ul class="verdict">{items}</ul>\n'
            f"{table_html}\n" + "\n".join(divs) + "\n</body></html>\n")
