"""Kernel tables against themselves: whole shapes held out, predicted by the pricer's interpolation.

The pricer's builders (kvsim.perf.kernel_curves: gemm_curve, AttentionGrid.build, allreduce_curve) are fed
a kernel-table file with whole shapes removed and predict them from what is left; the error is against
the removed measurements (benchmarks/kernel_holdout.py prints it for every shipped file, `kvsim calibrate`
for a file it converts):

- GEMM (bfloat16): every row whose n or k is a model size that is not a power of two, 3584, 5120,
  7168, 10240 or 51200, for n, k >= 512, at every token count m timed;
- prefill and decode attention (every KV dtype timed): every row of 24 and of 40 query heads per GPU
  (whole head configurations, for every KV-head count and head size), at every batch and length timed;
- attention past the heads timed: each KV-head count's largest head configuration (8-head MHA, 64 heads
  over 8 KV heads, ...), predicted from the configuration with 1/f the heads over f x the sequences
  (kvsim.perf.kernel_curves.head_fold), as a model with more heads than the tables time is priced;
- all-reduce (graph and eager, every GPU count): every message of an odd power of two elements,
  predicted from the even ones either side (a factor 4 apart).

Points whose prediction had to extrapolate (a neighbour missing, scaled by the roofline) are kept apart.
"""

from __future__ import annotations

import numpy as np

from kvsim.errors import KvsimError
from kvsim.perf.kernel_curves import AttentionGrid, Roofline, allreduce_curve, at, gemm_curve, head_fold
from kvsim.perf.kernels import Grid, KernelTables

GEMM_HELD = (3584, 5120, 7168, 10240, 51200)
HEADS_HELD = (24, 40)
TARGET = 0.05


def without(grid: Grid, axis: str, values) -> Grid:
    """The grid with the slices at `values` along `axis` removed."""
    names = list(grid.axes)
    keep = ~np.isin(grid.axes[axis], values)
    axes = dict(grid.axes, **{axis: grid.axes[axis][keep]})
    return Grid(axes, np.compress(keep, grid.ms, axis=names.index(axis)))


def gemm_errors(grid: Grid, roof) -> tuple[list, list]:
    train = without(without(grid, "n", GEMM_HELD), "k", GEMM_HELD)
    inside, outside = [], []
    n_axis, k_axis, m_axis = list(grid.axes["n"]), list(grid.axes["k"]), grid.axes["m"]
    for n in n_axis:
        for k in k_axis:
            if (n not in GEMM_HELD and k not in GEMM_HELD) or n < 512 or k < 512:
                continue
            curve = gemm_curve(train, n, k, roof)
            truth = grid.ms[:, n_axis.index(n), k_axis.index(k)] * 1e-3
            for i, m in enumerate(m_axis):
                if np.isnan(truth[i]):
                    continue
                t, flag = at(curve, float(m), True, True, lambda x, a: 1.0)
                (outside if flag else inside).append(t / truth[i] - 1)
    return inside, outside


def attention_errors(grid: Grid, family: str, kv_bytes: float, roof) -> tuple[list, list]:
    train = without(grid, "heads", HEADS_HELD)
    inside, outside = [], []
    ax = grid.axes
    heads_axis = list(ax["heads"])
    for ki, kv_key in enumerate(ax["kv"]):
        for di, hd in enumerate(ax["head_dim"]):
            for heads in HEADS_HELD:
                if heads not in heads_axis:
                    continue
                truth = grid.ms[ki, di, heads_axis.index(heads)] * 1e-3
                if family == "context":
                    truth = truth.T  # as [batch, length]
                if np.isnan(truth).all():
                    continue
                kv = heads if kv_key == 0 else int(kv_key)
                if kv > heads:
                    continue
                try:
                    pred = AttentionGrid.build(train, family, heads, kv, int(hd), kv_bytes, roof)
                except KvsimError:  # nothing timed for this KV-head count and head size: nothing to predict from
                    continue
                for bi in range(truth.shape[0]):
                    for si in range(truth.shape[1]):
                        if np.isnan(truth[bi, si]):
                            continue
                        err = pred.s[bi, si] / truth[bi, si] - 1
                        (outside if pred.flags[bi, si] else inside).append(err)
    return inside, outside


def fold_errors(grid: Grid, family: str, kv_bytes: float, roof) -> tuple[list, list]:
    """Each KV-head count's largest head configuration timed (8-head MHA; 64 heads over 8 KV heads),
    removed and predicted from the configuration with half or a quarter of the heads over as many times
    the sequences (kvsim.perf.kernel_curves.head_fold): the extrapolation past the tables' heads."""
    ax = grid.axes
    inside = []
    for ki, kv_key in enumerate(ax["kv"]):
        for di, hd in enumerate(ax["head_dim"]):
            timed = [h for hi, h in enumerate(ax["heads"]) if np.isfinite(grid.ms[ki, di, hi]).any()]
            if not timed:
                continue
            heads = int(max(timed))
            kv = heads if kv_key == 0 else int(kv_key)
            ms = grid.ms.copy()
            ms[ki, di, list(ax["heads"]).index(heads)] = np.nan
            train = Grid(ax, ms)
            if head_fold(train, heads, kv, int(hd)) == 1:
                continue
            truth = grid.ms[ki, di, list(ax["heads"]).index(heads)] * 1e-3
            if family == "context":
                truth = truth.T
            pred = AttentionGrid.build(train, family, heads, kv, int(hd), kv_bytes, roof)
            for bi, b in enumerate(ax["batch"]):  # the folded grid's batches are the table's over f
                j = np.flatnonzero(pred.batch == b)
                if len(j):
                    cells = np.isfinite(truth[bi]) & ~pred.flags[j[0]]
                    inside += list(pred.s[j[0]][cells] / truth[bi][cells] - 1)
    return inside, []


def allreduce_errors(grid: Grid, roof) -> tuple[list, list]:
    sizes = grid.axes["size"]
    held = [s for s in sizes if int(np.log2(s)) % 2 == 1 and s not in (sizes[0], sizes[-1])]
    train = without(grid, "size", held)
    inside, outside = [], []
    for gi, gpus in enumerate(grid.axes["gpus"]):
        curve = allreduce_curve(train, int(gpus), roof)
        for size in held:
            truth = grid.ms[gi, list(sizes).index(size)] * 1e-3
            t, flag = at(curve, float(size), True, True, lambda x, a: 1.0)
            (outside if flag else inside).append(t / truth - 1)
    return inside, outside


def stats(errors: list) -> tuple:
    if not errors:
        return 0, None, None, None
    e = np.asarray(errors)
    return len(e), float(np.median(np.abs(e))), float(np.percentile(np.abs(e), 90)), float(np.median(e))


def holdout_rows(tables: KernelTables, gpu, calibration) -> list[tuple]:
    """(family, what was held out, interpolated errors, extrapolated errors) per kernel family."""
    roof = Roofline(gpu, calibration)
    out = [("GEMM (bf16)", f"n or k in {', '.join(map(str, GEMM_HELD))}", *gemm_errors(tables.gemm["bfloat16"], roof))]
    for family, name in (("context", "prefill attention"), ("generation", "decode attention")):
        for kvd, grid in getattr(tables, family).items():
            kvb = 1.0 if kvd == "fp8" else 2.0
            out.append((f"{name} ({kvd} KV)", "24 and 40 query heads",
                        *attention_errors(grid, family, kvb, roof)))
            out.append((f"{name} past the heads timed ({kvd} KV)", "each KV-head count's most heads",
                        *fold_errors(grid, family, kvb, roof)))
    for mode, grid in tables.allreduce.items():
        out.append((f"all-reduce ({mode})", "odd powers of two elements", *allreduce_errors(grid, roof)))
    return out
