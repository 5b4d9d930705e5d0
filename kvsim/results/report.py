"""A run's self-contained HTML report and the terminal comparison table.

`write_report_html` turns a results folder's summaries and CSVs into one HTML page with plotly.js
inlined; `comparison_table` puts the headline figures of every policy side by side for the terminal. Figures are plain plotly.js JSON (data and layout dicts): plotly's
Python object model would add half a second to every run and nothing to the page.
"""

from __future__ import annotations

import csv
import html
import json
from array import array
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
from rich.table import Table

from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS

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

    def value(self, summary: dict):
        x = summary
        for key in self.path:
            if not isinstance(x, dict) or x.get(key) is None:
                return None
            x = x[key]
        return x * self.scale

    def text(self, summary: dict) -> str:
        v = self.value(summary)
        return "–" if v is None else f"{v:,.{self.digits}f}"


FIGURES = (
    _Figure("req/s", ("throughput", "requests_per_s"), digits=2),
    _Figure("out tok/s", ("throughput", "output_tokens_per_s"), digits=0),
    _Figure("goodput req/s", ("goodput_rps",), digits=2),
    _Figure("TTFT p50 ms", ("ttft_s", "p50"), 1e3),
    _Figure("TTFT p99 ms", ("ttft_s", "p99"), 1e3),
    _Figure("ITL p99 ms", ("itl_s", "p99"), 1e3),
    _Figure("E2E p99 s", ("e2e_s", "p99"), digits=2),
    _Figure("peak KV %", ("kv", "peak_used_fraction"), 100.0),
    _Figure("preemptions", ("preemptions",), digits=0),
    _Figure("prefix hit %", ("prefix_hit_rate",), 100.0),
)
BAR_FIGURES = tuple(f for f in FIGURES if f.label not in ("E2E p99 s", "prefix hit %"))


def _table_rows(summaries: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Header and one row of text cells per policy."""
    header = ["policy", "finished/rejected", *(f.label for f in FIGURES)]
    rows = []
    for name, s in summaries.items():
        req = s.get("requests", {})
        rows.append([name, f"{req.get('finished', 0)}/{req.get('rejected', 0)}", *(f.text(s) for f in FIGURES)])
    return header, rows


def comparison_table(summaries: dict[str, dict], transpose: bool = False) -> Table:
    """A rich table with one row per policy, or (`transpose`, for narrow terminals) one column per policy."""
    header, rows = _table_rows(summaries)
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
    rows: dict[tuple[str, int], list[list[float]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None) or list(TIMESERIES_COLUMNS)
        for row in reader:
            rows.setdefault((row[0], int(row[1])), []).append([float(x) for x in row[2:]])
    return {key: dict(zip(header[2:], np.asarray(vals).T)) for key, vals in rows.items()}


def cdf_points(values: np.ndarray, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF (x sorted, y = fraction <= x), thinned to at most `max_points` evenly spaced ranks."""
    x = np.sort(values)
    n = len(x)
    if n == 0:
        return x, x
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    return x[idx], (idx + 1) / n


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


def _colors(policies: list[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)}


def _bars_figure(summaries: dict[str, dict], colors: dict[str, str]) -> _Plot:
    ncols = 4
    nrows = -(-len(BAR_FIGURES) // ncols)
    fig = _subplots(nrows, ncols, [f.label for f in BAR_FIGURES], "Policy comparison", 300 * nrows)
    names = list(summaries)
    for i, f in enumerate(BAR_FIGURES):
        values = [f.value(summaries[p]) for p in names]
        fig.add({"type": "bar", "x": names, "y": values, "marker": {"color": [colors[p] for p in names]},
                 "showlegend": False, "hovertemplate": "%{x}: %{y}<extra>" + f.label + "</extra>"}, i + 1)
    return fig


def _cdf_figure(latencies: dict[str, dict[str, np.ndarray]], colors: dict[str, str]) -> _Plot:
    panels = (("ttft_s", "TTFT (s)"), ("mean_itl_s", "per-request mean ITL (s)"), ("e2e_s", "E2E latency (s)"))
    fig = _subplots(1, len(panels), [t for _, t in panels], "Latency CDFs (finished requests)", 420)
    for policy, cols in latencies.items():
        for j, (col, _) in enumerate(panels):
            x, y = cdf_points(cols[col])
            fig.add({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": policy, "legendgroup": policy,
                     "showlegend": j == 0, "line": {"color": colors.get(policy)}}, j + 1)
    for j, (_, title) in enumerate(panels):
        fig.axis("x", j + 1, title={"text": title})
    fig.axis("y", 1, title={"text": "fraction of requests"})
    return fig


def _timeseries_figure(series: dict[tuple[str, int], dict[str, np.ndarray]], policies: list[str],
                       lines: tuple[tuple[str, str], ...], title: str, colors: dict[str, str]) -> _Plot:
    """One panel per policy; each of `lines` (column, dash style) drawn per replica."""
    fig = _subplots(len(policies), 1, policies, title, max(320, 240 * len(policies)), shared_x=True,
                    vertical_spacing=min(0.08, 0.3 / max(1, len(policies))))
    replicas = {p: sorted(r for q, r in series if q == p) for p in policies}
    for row, policy in enumerate(policies, start=1):
        for replica in replicas[policy]:
            data = series[(policy, replica)]
            suffix = f" r{replica}" if len(replicas[policy]) > 1 else ""
            for col, dash in lines:
                fig.add({"type": "scatter", "x": data["time_s"], "y": data[col], "mode": "lines",
                         "name": f"{policy}{suffix} {col}", "line": {"dash": dash, "color": colors.get(policy)}}, row)
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
table{border-collapse:collapse;font-size:13px;margin-bottom:24px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#f3f3f3}"""


def _report_plots(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path,
                  latencies: dict[str, dict[str, np.ndarray]] | None = None) -> list[_Plot]:
    policies = list(summaries)
    colors = _colors(policies)
    series = _read_timeseries(Path(timeseries_csv_path))
    if latencies is None:
        latencies = _read_latencies(Path(requests_csv_path))
    figures = [_bars_figure(summaries, colors), _cdf_figure(latencies, colors)]
    if policies:
        figures += [
            _timeseries_figure(series, policies, (("kv_blocks_used", "solid"), ("kv_blocks_cached", "dash")),
                               "KV blocks used (solid) and cached (dashed) over time", colors),
            _timeseries_figure(series, policies, (("running", "solid"), ("waiting", "dot")),
                               "Running (solid) and waiting (dotted) requests over time", colors),
        ]
    return figures


def report_figures(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path) -> list[dict]:
    """The report's figures as plotly.js `{"data": [...], "layout": {...}}` dicts (the dashboard shows these)."""
    return [{"data": f.data, "layout": f.layout}
            for f in _report_plots(summaries, requests_csv_path, timeseries_csv_path)]


def write_report_html(path, scenario_name: str, summaries: dict[str, dict], requests_csv_path,
                      timeseries_csv_path, latencies: dict[str, dict[str, np.ndarray]] | None = None) -> None:
    """One self-contained HTML page (plotly.js inlined once) comparing the policies of a run.

    `latencies` (per policy, as `Metrics.latencies()`) saves reading requests.csv back."""
    figures = _report_plots(summaries, requests_csv_path, timeseries_csv_path, latencies)
    plotly_js = (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    divs = [f"<script>{plotly_js}</script>"] + [_figure_html(fig, f"kvsim-fig-{i}") for i, fig in enumerate(figures)]
    name = html.escape(scenario_name)
    page = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>kvsim: {name}</title>'
            f"<style>{_STYLE}</style></head><body>\n<h1>kvsim report: {name}</h1>\n"
            f"{_summary_table_html(summaries)}\n" + "\n".join(divs) + "\n</body></html>\n")
    Path(path).write_text(page, encoding="utf-8")
