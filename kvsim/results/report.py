"""A run's self-contained HTML report and the terminal comparison table.

`write_report_html` turns a results folder's summaries and CSVs into one HTML page with plotly.js
inlined; `comparison_table` puts the headline figures of every policy side by side for the terminal. Figures are plain plotly.js JSON (data and layout dicts): plotly's
Python object model would add half a second to every run and nothing to the page.

Both open with the verdict (`verdict_lines`: model, GPU, TP x replicas, offered rate and SLO, then
which policies meet the SLO, by how much and what binds, from kvsim.results.verdict), and every
table shows the figures the SLO judges. `policy_colors` gives each policy its colour on every page.
"""

from __future__ import annotations

import csv
import html
import json
from array import array
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from kvsim.results.metrics import REQUEST_COLUMNS, SLO_KEYS, TIMESERIES_COLUMNS
from kvsim.results.verdict import LABELS, judge, percentile_label

MAX_CDF_POINTS = 2000
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880",
           "#FF97FF", "#FECB52")  # plotly's default colour sequence


# ---- headline figures, shared by the terminal table, the HTML table and the bar charts

@dataclass(frozen=True, slots=True)
class _Figure:
    label: str
    path: tuple[str, ...]  # keys into a policy's summary
    scale: float = 1.0
    digits: int = 1
    unbounded: bool = False  # None means "beyond every finite value" (an SLO figure: too many rejected)

    def value(self, summary: dict):
        x = summary
        for key in self.path:
            if not isinstance(x, dict) or x.get(key) is None:
                return None
            x = x[key]
        return x * self.scale

    def text(self, summary: dict) -> str:
        v = self.value(summary)
        if v is None:
            return "∞" if self.unbounded and (summary.get("requests") or {}).get("received") else "–"
        return f"{v:,.{self.digits}f}"


HEAD_FIGURES = (
    _Figure("req/s", ("throughput", "requests_per_s"), digits=2),
    _Figure("out tok/s", ("throughput", "output_tokens_per_s"), digits=0),
    _Figure("goodput req/s", ("goodput_rps",), digits=2),
    _Figure("SLO attain %", ("slo_attainment",), 100.0),
    _Figure("TTFT p50 ms", ("ttft_s", "p50"), 1e3),
)
TAIL_FIGURES = (
    _Figure("ITL p99 ms", ("itl_s", "p99"), 1e3),
    _Figure("E2E p99 s", ("e2e_s", "p99"), digits=2),
    _Figure("peak KV %", ("kv", "peak_used_fraction"), 100.0),
    _Figure("preemptions", ("preemptions",), digits=0),
    _Figure("prefix hit %", ("prefix_hit_rate",), 100.0),
)
FIGURES = HEAD_FIGURES + TAIL_FIGURES  # and, between them, the SLO's figures (slo_figures)
BAR_EXCLUDED = ("E2E p99 s", "prefix hit %", "SLO attain %")


def slo_figures(summaries: dict[str, dict]) -> tuple[_Figure, ...]:
    """The figures the SLO judges, at its percentile (ms), labelled with their bounds; TTFT and
    TPOT at p99 when the SLO bounds neither."""
    first = next(iter(summaries.values()), {})
    slo = first.get("slo") or {}
    q, bounds = slo.get("percentile", 99.0), slo.get("bounds") or {}
    keys = [k for k in SLO_KEYS if bounds.get(k) is not None] or ["ttft_ms", "tpot_ms"]
    return tuple(_Figure(f"{LABELS[k]} {percentile_label(q)} ms" + (f" (≤{bounds[k]:g})" if bounds.get(k) else ""),
                         ("slo", "at_percentile", k), unbounded=True) for k in keys)


def table_figures(summaries: dict[str, dict]) -> tuple[_Figure, ...]:
    return HEAD_FIGURES + slo_figures(summaries) + TAIL_FIGURES


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


def _rate_text(arrival: dict, offered) -> str:
    process = arrival.get("process")
    if process == "trace":
        scale = arrival.get("time_scale", 1.0)
        text = "trace replay" + (f" (time × {scale:g})" if scale != 1.0 else "")
    else:
        text = f"{process} {arrival.get('rate', 0):g} req/s" + (f" (cv {arrival['cv']:g})" if process == "gamma" else "")
    return text + ("" if offered is None else f", offered {offered:.2f} req/s")


def slo_text(slo: dict) -> str:
    """e.g. 'SLO at p99: TTFT ≤ 2000 ms, TPOT ≤ 60 ms'."""
    bounds = [f"{LABELS[k]} ≤ {slo[k]:g} ms" for k in SLO_KEYS if slo.get(k) is not None]
    return f"SLO at {percentile_label(slo.get('percentile', 99.0))}: " + (", ".join(bounds) or "no latency bound")


def verdict_lines(summaries: dict[str, dict], meta: dict | None = None) -> list[str]:
    """What ran and against which SLO, then per policy: meets the SLO or not, by how much, what binds."""
    meta = meta or {}
    lines = []
    if meta.get("model"):
        tp, replicas = meta.get("tensor_parallel_size", 1), meta.get("num_replicas", 1)
        offered = next((s.get("arrivals", {}).get("offered_rps") for s in summaries.values()), None)
        lines.append(f"{meta['model']} on {meta.get('gpu')}, TP {tp} × {replicas} replica{'s' if replicas > 1 else ''}; "
                     f"{_rate_text(meta.get('arrival') or {}, offered)}")
    if meta.get("slo"):
        lines.append(slo_text(meta["slo"]))
    verdicts = {name: judge(s) for name, s in summaries.items() if s.get("slo")}
    passing = [n for n, v in verdicts.items() if v.sustainable]
    if verdicts:
        lines.append(f"{len(passing)} of {len(verdicts)} policies meet the SLO" + (f": {', '.join(passing)}" if passing else ""))
    for name, v in verdicts.items():
        lines.append(f"{'✓' if v.sustainable else '✗'} {name}: {v.summary_text()}; binds: {v.binding_detail}")
    return lines


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


# ---- data for the plots, read back from the CSVs

def _read_latencies(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per policy, the finished requests' ttft_s, mean_itl_s and e2e_s columns (empty cells skipped)."""
    cols = ("ttft_s", "mean_itl_s", "e2e_s")
    out: dict[str, dict[str, array]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None) or list(REQUEST_COLUMNS)
        idx = [header.index(c) for c in cols]
        i_policy, i_status = header.index("policy"), header.index("status")
        for row in reader:
            if row[i_status] != "finished":
                continue
            per = out.setdefault(row[i_policy], {c: array("d") for c in cols})
            for c, i in zip(cols, idx):
                if row[i]:
                    per[c].append(float(row[i]))
    return {p: {c: np.frombuffer(a, dtype=np.float64) for c, a in per.items()} for p, per in out.items()}


def _read_timeseries(path: Path) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Per (policy, replica), each numeric column of timeseries.csv as an array."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None) or list(TIMESERIES_COLUMNS)
        rows = [(row[0], int(row[1]), *map(float, row[2:])) for row in reader]
    return timeseries_arrays(rows, header)


def timeseries_arrays(rows: list[tuple], header=TIMESERIES_COLUMNS) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Per (policy, replica), each numeric column of time-series rows (as `Metrics.timeseries_rows`,
    or as read back from timeseries.csv: the numbers are the same) as a float64 array."""
    if not rows:
        return {}
    policies = [row[0] for row in rows]
    replicas = np.fromiter((row[1] for row in rows), np.int64, len(rows))
    values = np.array([row[2:] for row in rows], dtype=np.float64)
    out = {}
    for policy in dict.fromkeys(policies):
        mine = np.fromiter((p == policy for p in policies), bool, len(rows))
        for replica in dict.fromkeys(replicas[mine].tolist()):
            cols = values[mine & (replicas == replica)].T
            out[(policy, replica)] = dict(zip(header[2:], cols))
    return out


def cdf_points(values: np.ndarray, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF (x sorted, y = fraction <= x), thinned to at most `max_points` evenly spaced ranks."""
    x = np.sort(values)
    n = len(x)
    if n == 0:
        return x, x
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    return x[idx], (idx + 1) / n


def _package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it (plotly's import costs more than
    reading its plotly.min.js)."""
    return Path(find_spec(name).submodule_search_locations[0])


# ---- figures, as plotly.js data and layout

def _suffix(cell: int) -> str:
    """plotly's axis-name suffix of subplot `cell` (1-based): x, x2, x3, ..."""
    return "" if cell == 1 else str(cell)


@dataclass(slots=True)
class _Plot:
    layout: dict
    data: list

    def add(self, trace: dict, cell: int = 1) -> None:
        """Add a trace to subplot `cell` (1-based, row by row)."""
        trace["xaxis"], trace["yaxis"] = "x" + _suffix(cell), "y" + _suffix(cell)
        self.data.append(trace)

    def axis(self, kind: str, cell: int, **props) -> None:
        self.layout[f"{kind}axis{_suffix(cell)}"].update(props)


def _subplots(rows: int, cols: int, titles: list[str], title: str, height: int, shared_x: bool = False,
              vertical_spacing: float | None = None) -> _Plot:
    """A grid of subplots as make_subplots lays it out: axis domains and one title above each cell."""
    h_gap = 0.2 / cols if cols > 1 else 0.0
    v_gap = (0.3 / rows if rows > 1 else 0.0) if vertical_spacing is None else vertical_spacing
    width, tall = (1 - h_gap * (cols - 1)) / cols, (1 - v_gap * (rows - 1)) / rows
    layout: dict = {"title": {"text": title}, "height": height, "annotations": [], "hovermode": "closest"}
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        x0, y1 = c * (width + h_gap), 1 - r * (tall + v_gap)
        n = _suffix(i + 1)
        layout[f"xaxis{n}"] = {"domain": [x0, x0 + width], "anchor": f"y{n}"}
        layout[f"yaxis{n}"] = {"domain": [y1 - tall, y1], "anchor": f"x{n}"}
        if shared_x and i:
            layout[f"xaxis{n}"]["matches"] = "x"
        if shared_x and r < rows - 1:
            layout[f"xaxis{n}"]["showticklabels"] = False
        if i < len(titles):
            layout["annotations"].append({"text": titles[i], "x": x0 + width / 2, "y": y1, "xref": "paper",
                                          "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                                          "showarrow": False, "font": {"size": 16}})
    return _Plot(layout, [])


def policy_colors(policies: list[str]) -> dict[str, str]:
    """One colour per policy, by its place in the scenario's list of policies (pass them all, in the
    scenario's order, even when a page shows some): the same policy has the same colour on every
    report, plan and sweep page and in the dashboard."""
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)}


def bar_figures(summaries: dict[str, dict]) -> list[_Figure]:
    """The bar chart's panels: the table's figures less BAR_EXCLUDED and any no policy has (no empty
    panel, e.g. preemptions when there are none)."""
    return [f for f in table_figures(summaries) if f.label not in BAR_EXCLUDED
            and any(f.value(s) for s in summaries.values())]


def _bars_figure(summaries: dict[str, dict], colors: dict[str, str]) -> _Plot:
    names = list(summaries)
    figures = bar_figures(summaries)
    ncols = 4
    nrows = max(1, -(-len(figures) // ncols))
    fig = _subplots(nrows, ncols, [f.label for f in figures], "Policy comparison", 300 * nrows)
    for i, f in enumerate(figures):
        values = [f.value(summaries[p]) for p in names]
        fig.add({"type": "bar", "x": names, "y": values, "marker": {"color": [colors[p] for p in names]},
                 "showlegend": False, "hovertemplate": "%{x}: %{y}<extra>" + f.label + "</extra>"}, i + 1)
    return fig


def _cdf_figure(latencies: dict[str, dict[str, np.ndarray]], colors: dict[str, str], slo: dict) -> _Plot:
    """TTFT (log axis), TPOT and E2E CDFs, with the SLO's bounds (dashed) and its percentile (dotted)."""
    panels = (("ttft_s", "TTFT (s, log)", "ttft_ms"), ("mean_itl_s", "TPOT: per-request mean ITL (s)", "tpot_ms"),
              ("e2e_s", "E2E latency (s)", "e2e_ms"))
    q = slo.get("percentile", 99.0)
    fig = _subplots(1, len(panels), [t for _, t, _ in panels], "Latency CDFs (finished requests)", 420)
    for policy, cols in latencies.items():
        for j, (col, _, _) in enumerate(panels):
            x, y = cdf_points(cols[col])
            fig.add({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": policy, "legendgroup": policy,
                     "showlegend": j == 0, "line": {"color": colors.get(policy)}}, j + 1)
    shapes = fig.layout.setdefault("shapes", [])
    for j, (_, title, key) in enumerate(panels):
        fig.axis("x", j + 1, title={"text": title}, **({"type": "log"} if key == "ttft_ms" else {}))
        axes = {"xref": "x" + _suffix(j + 1), "yref": "y" + _suffix(j + 1)}
        shapes.append({"type": "line", "x0": 0, "x1": 1, "y0": q / 100, "y1": q / 100, **axes, "xref": axes["xref"] + " domain",
                       "line": {"dash": "dot", "color": "#888", "width": 1}})
        if slo.get(key) is not None:  # a trace, not a shape: data coordinates on a log axis too
            bound = slo[key] / 1e3
            fig.add({"type": "scatter", "x": [bound, bound], "y": [0, 1], "mode": "lines", "showlegend": False,
                     "name": f"SLO {LABELS[key]} ≤ {slo[key]:g} ms", "hoverinfo": "name",
                     "line": {"dash": "dash", "color": "#d62728", "width": 1.5}}, j + 1)
    fig.axis("y", 1, title={"text": f"fraction of requests (dotted: {percentile_label(q)})"})
    return fig


def _timeseries_figure(series: dict[tuple[str, int], dict[str, np.ndarray]], policies: list[str],
                       lines: tuple[tuple[str, str], ...], title: str, colors: dict[str, str],
                       scale: dict[str, float] | None = None, ceiling: tuple[float, str] | None = None) -> _Plot:
    """One panel per policy; each of `lines` (column, dash style) drawn per replica, times the
    policy's `scale` when given; `ceiling` (value, label) is drawn as a line in every panel."""
    fig = _subplots(len(policies), 1, policies, title, max(320, 240 * len(policies)), shared_x=True,
                    vertical_spacing=min(0.08, 0.3 / max(1, len(policies))))
    replicas = {p: sorted(r for q, r in series if q == p) for p in policies}
    for row, policy in enumerate(policies, start=1):
        for replica in replicas[policy]:
            data = series[(policy, replica)]
            suffix = f" r{replica}" if len(replicas[policy]) > 1 else ""
            for col, dash in lines:
                y = data[col] * scale[policy] if scale else data[col]
                fig.add({"type": "scatter", "x": data["time_s"], "y": y, "mode": "lines",
                         "name": f"{policy}{suffix} {col}", "line": {"dash": dash, "color": colors.get(policy)}}, row)
        if ceiling is not None:
            fig.layout.setdefault("shapes", []).append(
                {"type": "line", "xref": "x" + _suffix(row) + " domain", "yref": "y" + _suffix(row), "x0": 0, "x1": 1,
                 "y0": ceiling[0], "y1": ceiling[0], "line": {"dash": "dash", "color": "#d62728", "width": 1.5}})
            fig.axis("y", row, title={"text": ceiling[1]}, rangemode="tozero")
    fig.axis("x", len(policies), title={"text": "simulated time (s)"})
    return fig


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


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
ul.verdict{font-size:15px;line-height:1.5;list-style:none;padding-left:0}
table{border-collapse:collapse;font-size:13px;margin-bottom:24px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}"""


def _report_plots(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path,
                  latencies: dict[str, dict[str, np.ndarray]] | None = None, meta: dict | None = None,
                  series: dict[tuple[str, int], dict[str, np.ndarray]] | None = None) -> list[_Plot]:
    meta = meta or {}
    policies = list(summaries)
    colors = policy_colors(meta.get("policy_order") or policies)
    if series is None:
        series = _read_timeseries(Path(timeseries_csv_path))
    if latencies is None:
        latencies = _read_latencies(Path(requests_csv_path))
    first = next(iter(summaries.values()), {}).get("slo") or {}
    slo = meta.get("slo") or {**(first.get("bounds") or {}), "percentile": first.get("percentile", 99.0)}
    figures = [_bars_figure(summaries, colors), _cdf_figure(latencies, colors, slo)]
    if policies:
        kv_pct = {}  # blocks of one replica as % of its capacity (fp8 blocks hold twice the tokens)
        for p, s in summaries.items():
            blocks = (s.get("kv") or {}).get("num_blocks") or 0
            kv_pct[p] = 100.0 * (s.get("num_replicas") or 1) / blocks if blocks else 0.0
        figures += [
            _timeseries_figure(series, policies, (("kv_blocks_used", "solid"), ("kv_blocks_cached", "dash")),
                               "KV cache used (solid) and cached (dashed), % of capacity", colors, kv_pct,
                               (100.0, "% of KV capacity")),
            _timeseries_figure(series, policies, (("running", "solid"), ("waiting", "dot")),
                               "Running (solid) and waiting (dotted) requests over time", colors),
        ]
    return figures


def report_figures(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path,
                   meta: dict | None = None) -> list[dict]:
    """The report's figures as plotly.js `{"data": [...], "layout": {...}}` dicts (the dashboard shows these);
    `meta` (summary.json's, or `ScenarioResult.meta`) gives the policy colours and SLO lines."""
    return [{"data": f.data, "layout": f.layout}
            for f in _report_plots(summaries, requests_csv_path, timeseries_csv_path, meta=meta)]


def write_report_html(path, scenario_name: str, summaries: dict[str, dict], requests_csv_path,
                      timeseries_csv_path, latencies: dict[str, dict[str, np.ndarray]] | None = None,
                      meta: dict | None = None,
                      series: dict[tuple[str, int], dict[str, np.ndarray]] | None = None) -> None:
    """One self-contained HTML page (plotly.js inlined once) comparing the policies of a run.

    `latencies` (per policy, as `Metrics.latencies()`) saves reading requests.csv back, `series` (as
    `timeseries_arrays`) timeseries.csv; `meta` (as summary.json's) names model, GPU, layout, arrivals
    and SLO for the verdict."""
    figures = _report_plots(summaries, requests_csv_path, timeseries_csv_path, latencies, meta, series)
    page = figures_page(f"kvsim report: {scenario_name}", verdict_lines(summaries, meta), figures,
                        _summary_table_html(summaries))
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
