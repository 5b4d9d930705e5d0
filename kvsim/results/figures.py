"""The report's figures as plotly.js JSON (data and layout dicts; plotly's Python object model
would add half a second to every run and nothing to the page), and the data they are drawn from.

- Policy comparison: a panel per headline figure, one bar per policy in its colour (a legend, no
  rotated labels); latencies on a log axis (one slow policy would squash the rest to slivers),
  each SLO bound a dashed red line in its panel.
- Latency CDFs: TTFT (log), TPOT and E2E, the bounds dashed, the percentile dotted; each policy
  its own dash too, so identical curves (fp8 and int8 KV often are) do not hide one another.
- KV memory over time: a panel per policy, blocks in use (solid) and, shaded above them, blocks
  that only hold prefix-cache content (reclaimable: taken back whenever a request needs them, so
  not memory pressure); the capacity as a grey line in the legend; replicas as shades of the
  policy's colour, one legend entry per policy.
- Running and waiting requests over time, shaded the same way.
- Why requests missed: where the time of the requests that missed a per-request bound went
  (queued, prefill, decode; preempted inside those), against the requests that met it.

`policy_colors` gives a policy its colour by its *name*, the same on every page and scenario.
"""

from __future__ import annotations

import csv
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.results.cells import csv_value
from kvsim.results.headline import BAR_EXCLUDED, _Figure, slo_bounds, table_figures
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS
from kvsim.results.verdict import LABELS, percentile_label

MAX_CDF_POINTS = 2000
SLO_RED = "#d62728"
CAPACITY_GREY = "#555555"
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880",
           "#FF97FF", "#FECB52", "#1F77B4", "#8C564B", "#2CA02C", "#9467BD", "#E377C2", "#7F7F7F",
           "#BCBD22", "#17BECF", "#D62728", "#FF7F0E")  # plotly's default sequence, then D3's
# The shipped scenarios' policy names, each its own colour; other names hash into PALETTE.
NAMED_COLORS = {
    "paged": "#636EFA", "paged-bf16": "#636EFA", "paged-prefix-cache": "#636EFA",
    "contiguous": "#EF553B", "paged-chunked": "#00CC96", "paged-fp8": "#AB63FA", "paged-fp8-prefix-cache": "#AB63FA",
    "paged-int8": "#FFA15A", "paged-fp8-chunked": "#19D3F3", "paged-int4-chunked": "#FF6692",
    "paged-whole-prefill": "#B6E880", "paged-no-prefix-cache": "#8C564B",
}
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
PHASES = (("queued_s", "queued", "#B0B0B0"), ("prefill_s", "prefill (first scheduled to first token)", "#636EFA"),
          ("decode_s", "decode (first token to last)", "#00CC96"))


def policy_colors(policies: list[str]) -> dict[str, str]:
    """A colour per policy name: the shipped names' own, others by a hash of the name; a name whose
    colour another on the same page already has takes the next free one."""
    out: dict[str, str] = {}
    for name in policies:
        want = NAMED_COLORS.get(name) or PALETTE[zlib.crc32(name.encode("utf-8")) % len(PALETTE)]
        start = PALETTE.index(want) if want in PALETTE else 0
        for k in range(len(PALETTE) + 1):
            if want not in out.values():
                break
            want = PALETTE[(start + k + 1) % len(PALETTE)]
        out[name] = want
    return out


def policy_dashes(policies: list[str]) -> dict[str, str]:
    """A dash style per policy, by its place on the page: identical curves stay visible."""
    return {p: DASHES[i % len(DASHES)] for i, p in enumerate(policies)}


def shade(color: str, amount: float) -> str:
    """`color` (#RRGGBB) mixed with white by `amount` in [0, 1]."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02X}" for c in rgb)


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# ---- data for the plots, read back from the CSVs

def _float(text: str) -> float:
    return float(text) if text else 0.0


def _read_latencies(path: Path, bounds: dict | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per policy, the finished requests' columns as `Metrics.latencies()` gives them (ttft_s, mean_itl_s,
    e2e_s; queued_s, prefill_s, decode_s, preempted_s and missed against the SLO's `bounds` in ms)."""
    bounds = bounds or {}
    limit = {k: (bounds.get(k) or np.inf) / 1e3 for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    out: dict[str, dict[str, array]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None) or list(REQUEST_COLUMNS)
        col = {name: header.index(name) for name in header}
        i_pre = col.get("preempted_s")
        for row in reader:
            if row[col["status"]] != "finished":
                continue
            per = out.setdefault(csv_value(row[col["policy"]]), {c: array("d") for c in (
                "ttft_s", "mean_itl_s", "e2e_s", "queued_s", "prefill_s", "decode_s", "preempted_s", "missed")})
            ttft, e2e, itl = float(row[col["ttft_s"]]), float(row[col["e2e_s"]]), row[col["mean_itl_s"]]
            queued = float(row[col["first_scheduled_s"]]) - float(row[col["arrival_s"]])
            per["ttft_s"].append(ttft)
            per["e2e_s"].append(e2e)
            if itl:
                per["mean_itl_s"].append(float(itl))
            per["queued_s"].append(queued)
            per["prefill_s"].append(ttft - queued)
            per["decode_s"].append(e2e - ttft)
            per["preempted_s"].append(_float(row[i_pre]) if i_pre is not None else 0.0)
            per["missed"].append(float(ttft > limit["ttft_ms"] or e2e > limit["e2e_ms"]
                                       or (bool(itl) and float(itl) > limit["tpot_ms"])))
    arrays = {p: {c: np.frombuffer(a, dtype=np.float64) for c, a in per.items()} for p, per in out.items()}
    for per in arrays.values():
        per["missed"] = per["missed"].astype(bool)
    return arrays


def _read_timeseries(path: Path) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Per (policy, replica), each numeric column of timeseries.csv as an array."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None) or list(TIMESERIES_COLUMNS)
        rows = [(csv_value(row[0]), int(row[1]), *map(float, row[2:])) for row in reader]
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


# ---- plots

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
        # clamped: the last row's bottom comes out as -5.6e-17 with three rows, which plotly refuses
        layout[f"xaxis{n}"] = {"domain": [max(0.0, x0), min(1.0, x0 + width)], "anchor": f"y{n}"}
        layout[f"yaxis{n}"] = {"domain": [max(0.0, y1 - tall), min(1.0, y1)], "anchor": f"x{n}"}
        if shared_x and i:
            layout[f"xaxis{n}"]["matches"] = "x"
        if shared_x and r < rows - 1:
            layout[f"xaxis{n}"]["showticklabels"] = False
        if i < len(titles):
            layout["annotations"].append({"text": titles[i], "x": x0 + width / 2, "y": y1, "xref": "paper",
                                          "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                                          "showarrow": False, "font": {"size": 14}})
    return _Plot(layout, [])


def bar_figures(summaries: dict[str, dict]) -> list[_Figure]:
    """The bar chart's panels: the table's figures less BAR_EXCLUDED and any no policy has (no empty
    panel, e.g. preemptions when there are none)."""
    return [f for f in table_figures(summaries) if f.label not in BAR_EXCLUDED
            and any(f.value(s) for s in summaries.values())]


def _bars_figure(summaries: dict[str, dict], colors: dict[str, str]) -> _Plot:
    names = list(summaries)
    figures = bar_figures(summaries)
    bounds = slo_bounds(summaries)
    ncols = 4
    nrows = max(1, -(-len(figures) // ncols))
    fig = _subplots(nrows, ncols, [f.label + (" (log)" if f.latency else "") for f in figures],
                    "Policy comparison", 280 * nrows + 60)
    slo_shown = False
    for i, f in enumerate(figures):
        for p in names:
            fig.add({"type": "bar", "x": [p], "y": [f.value(summaries[p])], "name": p, "legendgroup": p,
                     "showlegend": i == 0, "marker": {"color": colors[p]},
                     "hovertemplate": p + ": %{y:,.4g}<extra>" + f.label + "</extra>"}, i + 1)
        fig.axis("x", i + 1, showticklabels=False)
        bound = bounds.get(f.slo_key) if f.slo_key else None
        values = [v for v in (f.value(summaries[p]) for p in names) if v is not None and v > 0] + [bound or 0]
        values = [v for v in values if v > 0]
        if f.latency and values:  # bars a decade and more tall: heights compare orders of magnitude
            fig.axis("y", i + 1, type="log", range=[float(np.log10(min(values) / 10)), float(np.log10(max(values) * 1.5))])
        if bound:  # a shape spans the panel, in data coordinates
            fig.layout.setdefault("shapes", []).append(
                {"type": "line", "xref": "x" + _suffix(i + 1) + " domain", "x0": 0, "x1": 1, "yref": "y" + _suffix(i + 1),
                 "y0": bound, "y1": bound, "line": {"dash": "dash", "color": SLO_RED, "width": 2}})
            if not f.latency:
                fig.axis("y", i + 1, range=[0, max(values) * 1.1])
            if not slo_shown:  # the shapes' legend entry
                fig.add({"type": "scatter", "mode": "lines", "x": [None], "y": [None], "name": "SLO bound",
                         "line": {"dash": "dash", "color": SLO_RED, "width": 2}}, i + 1)
            slo_shown = True
    fig.layout.update(barmode="group", legend={"orientation": "h", "y": -0.08, "yanchor": "top"})
    return fig


def _cdf_figure(latencies: dict[str, dict[str, np.ndarray]], colors: dict[str, str], slo: dict) -> _Plot:
    """TTFT (log axis), TPOT and E2E CDFs, with the SLO's bounds (dashed) and its percentile (dotted)."""
    panels = (("ttft_s", "TTFT (s, log)", "ttft_ms"), ("mean_itl_s", "TPOT: per-request mean ITL (s)", "tpot_ms"),
              ("e2e_s", "E2E latency (s)", "e2e_ms"))
    q = slo.get("percentile", 99.0)
    dashes = policy_dashes(list(latencies))
    fig = _subplots(1, len(panels), [t for _, t, _ in panels], "Latency CDFs (finished requests)", 420)
    for policy, cols in latencies.items():
        for j, (col, _, _) in enumerate(panels):
            x, y = cdf_points(cols[col])
            fig.add({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": policy, "legendgroup": policy,
                     "showlegend": j == 0, "line": {"color": colors.get(policy), "dash": dashes[policy], "width": 2}},
                    j + 1)
    shapes = fig.layout.setdefault("shapes", [])
    for j, (_, title, key) in enumerate(panels):
        fig.axis("x", j + 1, title={"text": title}, **({"type": "log"} if key == "ttft_ms" else {}))
        axes = {"xref": "x" + _suffix(j + 1) + " domain", "yref": "y" + _suffix(j + 1)}
        shapes.append({"type": "line", "x0": 0, "x1": 1, "y0": q / 100, "y1": q / 100, **axes,
                       "line": {"dash": "dot", "color": "#888", "width": 1}})
        if slo.get(key) is not None:  # a trace, not a shape: data coordinates on a log axis too
            bound = slo[key] / 1e3
            fig.add({"type": "scatter", "x": [bound, bound], "y": [0, 1], "mode": "lines", "legendgroup": "slo",
                     "name": f"SLO {LABELS[key]} ≤ {slo[key]:g} ms", "showlegend": False, "hoverinfo": "name",
                     "line": {"dash": "dash", "color": SLO_RED, "width": 1.5}}, j + 1)
    fig.axis("y", 1, title={"text": f"fraction of requests (dotted: {percentile_label(q)})"})
    return fig


def _replica_shade(color: str, replica: int, count: int) -> str:
    return color if count <= 1 else shade(color, 0.55 * replica / (count - 1))


def kv_percent(summary: dict) -> float | dict[int, float]:
    """A block of one replica as % of its capacity (fp8 blocks hold twice the tokens); a disaggregated
    policy's per replica, its pools' caches differing."""
    pools = (summary.get("disaggregation") or {}).get("pools")
    if pools:
        return {r: 100.0 / p["num_blocks_per_replica"] for p in pools.values() for r in p["replicas"]}
    blocks = (summary.get("kv") or {}).get("num_blocks") or 0
    return 100.0 * (summary.get("num_replicas") or 1) / blocks if blocks else 0.0


def _kv_figure(series: dict[tuple[str, int], dict[str, np.ndarray]], policies: list[str], colors: dict[str, str],
               scale: dict[str, float | dict[int, float]]) -> _Plot:
    """KV blocks in use (solid) and, shaded above, blocks holding only prefix-cache content, as % of a
    replica's capacity; the capacity a grey line."""
    fig = _subplots(len(policies), 1, policies, "KV cache per replica: in use (solid), prefix-cache content "
                    "(shaded, reclaimable), % of capacity", max(320, 240 * len(policies)), shared_x=True,
                    vertical_spacing=min(0.08, 0.3 / max(1, len(policies))))
    replicas = {p: sorted(r for q, r in series if q == p) for p in policies}
    for row, policy in enumerate(policies, start=1):
        n = len(replicas[policy])
        for k, replica in enumerate(replicas[policy]):
            data, color = series[(policy, replica)], _replica_shade(colors.get(policy, "#444444"), k, n)
            suffix = f" replica {replica}" if n > 1 else ""
            pct = scale[policy] if isinstance(scale[policy], float) else scale[policy].get(replica, 0.0)
            used = data["kv_blocks_used"] * pct
            fig.add({"type": "scatter", "x": data["time_s"], "y": used, "mode": "lines",
                     "name": f"{policy} in use", "legendgroup": f"{policy} used", "showlegend": k == 0,
                     "hovertemplate": f"{policy}{suffix} in use: %{{y:.1f}}%<extra></extra>",
                     "line": {"color": color, "width": 1.5}}, row)
            fig.add({"type": "scatter", "x": data["time_s"], "y": used + data["kv_blocks_cached"] * pct,
                     "mode": "lines", "fill": "tonexty", "fillcolor": _rgba(color, 0.18),
                     "name": f"{policy} prefix cache (reclaimable)", "legendgroup": f"{policy} cached",
                     "showlegend": k == 0, "line": {"color": _rgba(color, 0.35), "width": 0.5},
                     "hovertemplate": f"{policy}{suffix} in use + cached: %{{y:.1f}}%<extra></extra>"}, row)
        times = [float(series[(policy, r)]["time_s"][i]) for r in replicas[policy] for i in (0, -1)
                 if len(series[(policy, r)]["time_s"])]
        if times:
            fig.add({"type": "scatter", "mode": "lines", "x": [min(times), max(times)], "y": [100, 100],
                     "name": "KV capacity (100%)", "legendgroup": "capacity", "showlegend": row == 1,
                     "hoverinfo": "name", "line": {"dash": "dot", "color": CAPACITY_GREY, "width": 1}}, row)
        fig.axis("y", row, title={"text": "% of KV capacity"}, rangemode="tozero")
    fig.axis("x", len(policies), title={"text": "simulated time (s)"})
    return fig


def _queue_figure(series: dict[tuple[str, int], dict[str, np.ndarray]], policies: list[str],
                  colors: dict[str, str]) -> _Plot:
    fig = _subplots(len(policies), 1, policies, "Running (solid) and waiting (dotted) requests per replica",
                    max(320, 240 * len(policies)), shared_x=True, vertical_spacing=min(0.08, 0.3 / max(1, len(policies))))
    replicas = {p: sorted(r for q, r in series if q == p) for p in policies}
    for row, policy in enumerate(policies, start=1):
        n = len(replicas[policy])
        for k, replica in enumerate(replicas[policy]):
            data, color = series[(policy, replica)], _replica_shade(colors.get(policy, "#444444"), k, n)
            suffix = f" replica {replica}" if n > 1 else ""
            for col, dash in (("running", "solid"), ("waiting", "dot")):
                fig.add({"type": "scatter", "x": data["time_s"], "y": data[col], "mode": "lines",
                         "name": f"{policy} {col}", "legendgroup": f"{policy} {col}", "showlegend": k == 0,
                         "hovertemplate": f"{policy}{suffix} {col}: %{{y}}<extra></extra>",
                         "line": {"dash": dash, "color": color}}, row)
    fig.axis("x", len(policies), title={"text": "simulated time (s)"})
    return fig


def why_missed(latencies: dict[str, dict[str, np.ndarray]]) -> list[dict]:
    """Per policy and group (requests that missed a per-request SLO bound, those that met every one):
    how many, the mean seconds queued, in prefill and in decode (and preempted, inside those two),
    and how many had each phase as their longest."""
    rows = []
    for policy, cols in latencies.items():
        missed = cols.get("missed")
        if missed is None or not len(missed):
            continue
        for group, mask in (("missed", missed), ("met", ~missed)):
            if not mask.any():
                continue
            phases = np.stack([cols[c][mask] for c, _, _ in PHASES])
            longest = np.bincount(np.argmax(phases, axis=0), minlength=len(PHASES))
            rows.append({"policy": policy, "group": group, "requests": int(mask.sum()),
                         **{c: float(phases[i].mean()) for i, (c, _, _) in enumerate(PHASES)},
                         "preempted_s": float(cols["preempted_s"][mask].mean()),
                         **{f"longest_{c}": int(longest[i]) for i, (c, _, _) in enumerate(PHASES)}})
    return rows


def _why_figure(rows: list[dict]) -> _Plot:
    """Stacked bars: where the time of the requests that missed went, against those that met the SLO."""
    fig = _subplots(1, 1, [], "Where the time went: requests that missed a per-request SLO bound vs those that "
                    "met it (mean seconds)", 160 + 36 * len(rows))
    labels = [f"{r['policy']} · {r['group']} ({r['requests']:,})" for r in rows]
    for col, name, color in PHASES:
        fig.add({"type": "bar", "orientation": "h", "y": labels, "x": [r[col] for r in rows], "name": name,
                 "marker": {"color": color}, "customdata": [[r["preempted_s"], r[f"longest_{col}"], r["requests"]]
                                                           for r in rows],
                 "hovertemplate": name + ": %{x:.3f} s (longest phase of %{customdata[1]} of %{customdata[2]}; "
                                         "preempted %{customdata[0]:.3f} s)<extra>%{y}</extra>"})
    fig.layout.update(barmode="stack", yaxis={"autorange": "reversed", "automargin": True},
                      xaxis={"title": {"text": "seconds (mean)"}}, legend={"orientation": "h", "y": -0.25})
    return fig


def report_plots(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path,
                 latencies: dict[str, dict[str, np.ndarray]] | None = None, meta: dict | None = None,
                 series: dict[tuple[str, int], dict[str, np.ndarray]] | None = None) -> list[_Plot]:
    meta = meta or {}
    policies = list(summaries)
    colors = policy_colors(meta.get("policy_order") or policies)
    first = next(iter(summaries.values()), {}).get("slo") or {}
    slo = meta.get("slo") or {**(first.get("bounds") or {}), "percentile": first.get("percentile", 99.0)}
    if series is None:
        series = _read_timeseries(Path(timeseries_csv_path))
    if latencies is None or any("missed" not in v for v in latencies.values()):
        latencies = _read_latencies(Path(requests_csv_path), slo)
    figures = [_bars_figure(summaries, colors), _cdf_figure(latencies, colors, slo)]
    if policies:
        figures += [_kv_figure(series, policies, colors, {p: kv_percent(s) for p, s in summaries.items()}),
                    _queue_figure(series, policies, colors)]
    rows = why_missed(latencies)
    if any(r["group"] == "missed" for r in rows):
        figures.append(_why_figure(rows))
    return figures


def report_figures(summaries: dict[str, dict], requests_csv_path, timeseries_csv_path,
                   meta: dict | None = None) -> list[dict]:
    """The report's figures as plotly.js `{"data": [...], "layout": {...}}` dicts (the dashboard shows these);
    `meta` (summary.json's, or `ScenarioResult.meta`) gives the policy colours and SLO lines."""
    return [{"data": f.data, "layout": f.layout}
            for f in report_plots(summaries, requests_csv_path, timeseries_csv_path, meta=meta)]
