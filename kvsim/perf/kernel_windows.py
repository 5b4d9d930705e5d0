"""Attention of windowed layers (sliding-window, chunked-local) from the measured tables, and the prefill
grids' fast lookup, for kvsim.perf.kernel_curves.ModelKernels.

A windowed kind's layers (kvsim.perf.kernel_plan.WindowPlan) are priced from the tables' rows timed with
that window when the release has them (the kernel at the whole context, reading the window), else from
the full-attention rows at what the layer reads: min(context, window) keys a decode, the window's share
of a prompt's query-key pairs a prefill. Decode attention stays piecewise linear in the keys (the union
of the grids' knots), so runs of decode steps still sum in closed form (kvsim.perf.measured).
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np


def context_table(c) -> tuple:
    """A prefill grid as per batch row and length segment: log t = a + b log(length), and its flag."""
    log_s, log_t = np.log(c.length), np.log(c.s)
    slope = np.diff(log_t, axis=1) / np.diff(log_s)
    flag = c.flags[:, :-1] | c.flags[:, 1:]
    return (c.batch.tolist(), c.length.tolist(), (log_t[:, :-1] - slope * log_s[:-1]).tolist(), slope.tolist(),
            flag.tolist())


def context_at(table: tuple, grid, batch: float, isl: float) -> tuple[float, bool]:
    """One layer's prefill attention of `batch` prompts of `isl` tokens from a context_table: log-log along
    the prompt, linear along the batch; past the grid, its roofline's ratio (flagged)."""
    b, s, a, slope, flags = table
    bq = b[0] if batch < b[0] else b[-1] if batch > b[-1] else batch
    sq = s[0] if isl < s[0] else s[-1] if isl > s[-1] else isl
    p = bisect_right(s, sq) - 1
    p = 0 if p < 0 else len(s) - 2 if p > len(s) - 2 else p
    i = bisect_right(b, bq) - 1
    i = 0 if i < 0 else len(b) - 1 if i > len(b) - 1 else i
    ls = math.log(sq)
    t = math.exp(a[i][p] + slope[i][p] * ls)
    flag = flags[i][p]
    if bq != b[i]:  # between two batch rows: linear in the batch
        wb = (bq - b[i]) / (b[i + 1] - b[i])
        t = (1 - wb) * t + wb * math.exp(a[i + 1][p] + slope[i + 1][p] * ls)
        flag = flag or flags[i + 1][p]
    if bq != batch or sq != isl:
        t *= grid.ratio(batch, isl, bq, sq)
        flag = True
    return t, flag


def windowed_prefill_s(windows, batch: int, full: float, full_s: float, window_pairs) -> tuple[float, bool]:
    """Every windowed layer's prefill attention (seconds, all of them; `windows`: ModelKernels.windows) for
    `batch` chunks of mean full length `full` computing `window_pairs` query-key pairs per window plan
    (kvsim.batch.Batch.window_reads): the window's rows at the whole prompt, times the share of its pairs the
    chunks compute; else the full rows' one-layer `full_s` times the share of a whole prompt's pairs the
    windowed chunks compute."""
    total, flag, whole = 0.0, False, batch * full * (full + 1) / 2
    for (plan, grids), pairs in zip(windows, window_pairs):
        if grids is None:
            total += plan.count * full_s * (pairs / whole if pairs < whole else 1.0)
            continue
        t, f = context_at(grids[1], grids[0], batch, full)
        w = plan.window
        per = full * (full + 1) / 2 if full <= w else w * (w + 1) / 2 + (full - w) * w
        total += plan.count * t * min(pairs / (batch * per), 1.0)
        flag |= f
    return total, flag


def blend_windows(windows, full_layers: int, layers: int, batch: float, knots, t, flags) -> tuple:
    """ModelKernels.decode_knots with windowed layers: the mean over the layers of the full layers' decode at
    the keys and each windowed kind's (its rows at the whole context, flat past them; else the full rows at
    min(keys, window)), on the union of their knots (those past the full grid's last left out)."""
    xs = set(knots.tolist())
    for plan, grids in windows:
        xs |= set(grids[2].length.tolist()) if grids else {float(plan.window)}
    x = np.array(sorted(v for v in xs if v <= knots[-1]), dtype=float)
    total = full_layers * np.interp(x, knots, t)
    flag = np.interp(x, knots, flags.astype(float)) > 0
    for plan, grids in windows:
        if grids is None:
            total = total + plan.count * np.interp(np.minimum(x, plan.window), knots, t)
            continue
        kw, tw, fw = grids[2].knots(batch)
        total = total + plan.count * np.interp(x, kw, tw)  # flat past the rows: the window caps the reads
        flag = flag | (np.interp(x, kw, fw.astype(float)) > 0)
    return x, total / layers, flag
