"""Curves through the measured kernel tables for one model's shapes, and the interpolation behind them.

A step needs each kernel at the model's shapes only, so `ModelKernels` cuts each grid down once to
curves over the axes a step varies (tokens; batch x length; message size), and the pricer evaluates
those. Interpolation is piecewise linear between measured points, in log coordinates where the kernel
scales as a power (GEMMs over m, n, k; all-reduce over the message; prefill attention over the prompt)
and linearly where it is affine in the work (decode attention over batch and context: exact for a
memory-bound kernel, and piecewise linear in the context so that runs of decode steps sum in closed
form; head counts). Piecewise-linear interpolation never leaves the interval of its two points.
Where the tables have no point (a shape past the grid, a head count or head size not timed, a batch
too large for the collector's memory cap) a measured neighbour is scaled by the roofline's ratio
(`Roofline`: the compute and memory terms of kvsim/perf/roofline.py, per kernel) and the point is
flagged as extrapolated. The builders (`gemm_curve`, `AttentionGrid.build`, `allreduce_curve`) take any
grid, so benchmarks/kernel_holdout.py can test them on shapes held out of the tables.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from kvsim.errors import KvsimError
from kvsim.perf.kernel_plan import KV_TABLE_DTYPE, gemm_plan, kv_table_dtype, window_plans
from kvsim.perf.kernels import Grid, KernelTables
from kvsim.perf.kernel_windows import blend_windows, context_at, context_table, windowed_prefill_s


# ---- interpolation -----------------------------------------------------------------------------
def bracket(values: np.ndarray, x: float) -> tuple[int, int]:
    """(i, j): the grid points either side of x (i == j on a point; x outside: its nearest end twice)."""
    n = len(values)
    j = int(np.searchsorted(values, x))
    if j < n and values[j] == x:
        return j, j
    if j == 0 or j == n:
        return min(j, n - 1), min(j, n - 1)
    return j - 1, j


def interp1(xs: np.ndarray, ys: np.ndarray, x: float, logx: bool, logy: bool) -> float:
    """Piecewise-linear through the finite (xs, ys), in log x and/or log y; NaN outside their range."""
    ok = ~np.isnan(ys)
    xs, ys = xs[ok], ys[ok]
    if not len(xs) or x < xs[0] or x > xs[-1]:
        return math.nan
    X = np.log(xs) if logx else xs.astype(float)
    Y = np.log(ys) if logy else ys
    y = float(np.interp(math.log(x) if logx else x, X, Y))
    return math.exp(y) if logy else y


def interp_axis(values: np.ndarray, grid: np.ndarray, x: float, axis: int, logx: bool, logy: bool) -> np.ndarray:
    """`grid` cut at x along `axis`: the two neighbouring slices blended (a NaN in either stays NaN);
    NaN slices when x is outside the axis."""
    i, j = bracket(values, x)
    if values[i] == x:
        return np.take(grid, i, axis=axis)
    if not values[0] < x < values[-1]:
        return np.full(np.delete(grid.shape, axis), np.nan)
    x0, x1 = values[i], values[j]
    w = (math.log(x / x0) / math.log(x1 / x0)) if logx else (x - x0) / (x1 - x0)
    a, b = np.take(grid, i, axis=axis), np.take(grid, j, axis=axis)
    if logy:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.exp((1 - w) * np.log(a) + w * np.log(b))
    return (1 - w) * a + w * b


# ---- the roofline, per kernel: what extrapolation scales a measured neighbour by ---------------
class Roofline:
    """Per-kernel roofline times (s) on `gpu` with a calibration's efficiencies: the compute and memory
    terms kvsim/perf/roofline.py sums for a whole step, here for one kernel call of a given shape."""

    def __init__(self, gpu, calibration, weight_bytes: float = 2.0, peak_tflops: float = 0.0):
        c = calibration
        self.gpu, self.calibration, self.weight_bytes = gpu, c, weight_bytes
        peak = peak_tflops or (gpu.fp8_tflops if weight_bytes == 1 else gpu.bf16_tflops)
        self.gemm_flops = peak * 1e12 * c.compute_efficiency
        self.attn_flops = gpu.bf16_tflops * 1e12 * c.attention_efficiency
        self.bandwidth = gpu.hbm_bandwidth_gbps * 1e9 * c.memory_efficiency

    def gemm(self, m: float, n: float, k: float) -> float:
        moved = 2 * m * k + self.weight_bytes * n * k + 2 * m * n
        return np.maximum(2.0 * m * n * k / self.gemm_flops, moved / self.bandwidth)

    def prefill(self, batch: float, isl: float, heads: float, kv: float, head_dim: float, kv_bytes: float) -> float:
        flops = 4.0 * heads * head_dim * batch * isl * (isl + 1) / 2
        moved = batch * isl * head_dim * (4 * heads + 2 * kv * kv_bytes)
        return np.maximum(flops / self.attn_flops, moved / self.bandwidth)

    def decode(self, batch: float, step: float, heads: float, kv: float, head_dim: float, kv_bytes: float) -> float:
        flops = 4.0 * heads * head_dim * batch * step
        moved = batch * (step * 2 * kv * head_dim * kv_bytes + 4 * heads * head_dim)
        return np.maximum(flops / self.attn_flops, moved / self.bandwidth)

    def allreduce(self, elements: float, gpus: int) -> float:
        from kvsim.perf.roofline import allreduce_seconds

        return allreduce_seconds(2.0 * elements, gpus, self.gpu, self.calibration)


# ---- curves for one model's shapes --------------------------------------------------------------
@dataclass(slots=True)
class Curve:
    """Times at the points `x` of one axis (ms as read, seconds once a ModelKernels holds them), and
    which of them were extrapolated."""

    x: np.ndarray
    ms: np.ndarray
    extrapolated: np.ndarray
    _lists: tuple = ()  # (x, ms, extrapolated) as Python lists, made on the first query (queries are per step)

    def lists(self) -> tuple:
        if not self._lists:
            self._lists = (self.x.tolist(), self.ms.tolist(), self.extrapolated.tolist())
        return self._lists


def fill_along(x: np.ndarray, ms: np.ndarray, logx: bool, logy: bool, ratio) -> Curve:
    """A curve through the finite points of `ms`: holes interpolated, the ends past the last finite
    point on either side the nearest finite point x roofline ratio(x, x_anchor) (flagged)."""
    ms = ms.astype(float).copy()
    ok = ~np.isnan(ms)
    flags = np.zeros(len(ms), dtype=bool)
    if not ok.any():
        return Curve(x, ms, ~flags)
    first, last = int(np.argmax(ok)), len(ok) - 1 - int(np.argmax(ok[::-1]))
    for i in range(len(ms)):
        if ok[i]:
            continue
        if first < i < last:
            ms[i] = interp1(x, np.where(ok, ms, np.nan), float(x[i]), logx, logy)
        else:
            a = first if i < first else last
            ms[i] = ms[a] * ratio(float(x[i]), float(x[a]))
            flags[i] = True
    return Curve(x, ms, flags)


def at(curve: Curve, x: float, logx: bool, logy: bool, ratio) -> tuple[float, bool]:
    """(time, extrapolated) of a filled curve at x; past its ends, the end x roofline ratio."""
    xs, ms, flags = curve.lists()
    if x <= xs[0] or x >= xs[-1]:
        a = 0 if x <= xs[0] else len(xs) - 1
        if x == xs[a]:
            return ms[a], flags[a]
        return ms[a] * float(ratio(x, xs[a])), True
    j = bisect_right(xs, x)
    if xs[j - 1] == x:
        return ms[j - 1], flags[j - 1]
    i = j - 1
    x0, x1, y0, y1 = xs[i], xs[j], ms[i], ms[j]
    w = math.log(x / x0) / math.log(x1 / x0) if logx else (x - x0) / (x1 - x0)
    y = math.exp((1 - w) * math.log(y0) + w * math.log(y1)) if logy else (1 - w) * y0 + w * y1
    return y, flags[i] or flags[j]


def at_many(curve: Curve, xs: np.ndarray, ratio) -> tuple[np.ndarray, np.ndarray]:
    """`at` for many points at once (log-log), as (times, extrapolated): the pricer fills its per-row
    tables with it when it starts, instead of one point at a time as steps come."""
    x, t, fl = curve.x, curve.ms, curve.extrapolated
    q = np.clip(xs, x[0], x[-1])
    out = np.exp(np.interp(np.log(q), np.log(x), np.log(t)))
    j = np.clip(np.searchsorted(x, q), 1, len(x) - 1)
    flags = np.where(x[j - 1] == q, fl[j - 1], np.where(x[j] == q, fl[j], fl[j - 1] | fl[j]))
    past = q != xs
    if past.any():
        out[past] *= ratio(xs[past], q[past])
        flags = flags | past
    return out, flags


def cut(values: np.ndarray, grid: np.ndarray, x: float, axis: int, logx: bool, logy: bool,
        ratio) -> tuple[np.ndarray, bool]:
    """`grid` at x along `axis` (interpolated between its neighbours), or, off the axis or where nothing
    was timed there, the nearest slice holding any time, scaled by ratio(x, anchor): (slice, extrapolated)."""
    if values[0] <= x <= values[-1]:
        sl = interp_axis(values, grid, x, axis, logx, logy)
        if not np.isnan(sl).all():
            return sl, False
    timed = [i for i in range(len(values)) if not np.isnan(np.take(grid, i, axis=axis)).all()] or \
        list(range(len(values)))
    a = min(timed, key=lambda i: abs(math.log(values[i] / x)) if logx else abs(values[i] - x))
    return np.take(grid, a, axis=axis) * ratio(x, float(values[a])), True


def gemm_curve(grid: Grid, n: int, k: int, roof) -> Curve:
    """A GEMM of (n, k) over the grid's token rows m (seconds): log-log in k, then n, then filled along m."""
    m_axis = grid.axes["m"].astype(float)
    n_axis = grid.axes["n"].astype(float)
    by_k, ek = cut(grid.axes["k"], grid.ms, k, 2, True, True,
                   lambda x, a: roof.gemm(m_axis[:, None], n_axis[None, :], x) / roof.gemm(m_axis[:, None], n_axis[None, :], a))
    by_n, en = cut(grid.axes["n"], by_k, n, 1, True, True, lambda x, a: roof.gemm(m_axis, x, k) / roof.gemm(m_axis, a, k))
    curve = fill_along(m_axis, by_n, True, True, lambda x, a: roof.gemm(x, n, k) / roof.gemm(a, n, k))
    curve.extrapolated |= ek or en
    curve.ms *= 1e-3
    return curve


def allreduce_curve(grid: Grid, gpus: int, roof) -> Curve:
    """vLLM's all-reduce over `gpus` GPUs by message size (bfloat16 elements; seconds), log-log."""
    size = grid.axes["size"].astype(float)
    sl, e = cut(grid.axes["gpus"], grid.ms, gpus, 0, True, True,
                lambda x, a: np.array([roof.allreduce(z, int(x)) / roof.allreduce(z, int(a)) for z in size]))
    curve = fill_along(size, sl, True, True, lambda x, a: roof.allreduce(x, gpus) / roof.allreduce(a, gpus))
    curve.extrapolated |= e
    curve.ms *= 1e-3
    return curve


def _timed(grid: Grid, heads: int, kv: int, head_dim: int) -> bool:
    """Whether the grid timed any shape of this head configuration (at this head size)."""
    ax = grid.axes
    key = 0 if kv == heads and 0 in ax["kv"] else kv
    if key not in ax["kv"] or heads not in ax["heads"] or head_dim not in ax["head_dim"]:
        return False
    cell = grid.ms[list(ax["kv"]).index(key), list(ax["head_dim"]).index(head_dim), list(ax["heads"]).index(heads)]
    return bool(np.isfinite(cell).any())


def head_fold(grid: Grid, heads: int, kv: int, head_dim: int) -> int:
    """1, or the least power of two f dividing heads and KV heads such that the grid timed heads / f and
    kv / f but not heads and kv. Attention runs one thread block per (sequence, KV head, query tile or
    key split), each block's work set by its sequence and the query heads a KV head serves, so h heads
    over b sequences is the same work, in the same blocks, as h / f heads over f x b sequences: 32-head
    MHA (Llama-2-7B) is the 8-head kernel over 4x the batch. Held out of vLLM 0.19 / 0.24's H100 tables
    (8 query heads from 4 or 2; 32 and 64 over 8 KV heads from 16 / 32 over 4 and 2), decode attention so
    predicted is within 0-3% (median; 2-4% |error|) where scaling the nearest head count by the roofline is
    +20-23% (benchmarks/kernel_holdout.py)."""
    if _timed(grid, heads, kv, head_dim):
        return 1
    f = 2
    while heads % f == 0 and kv % f == 0:
        if _timed(grid, heads // f, kv // f, head_dim):
            return f
        f *= 2
    return 1


@dataclass(slots=True)
class AttentionGrid:
    """One attention family for one head configuration: seconds over [batch, length] (prompt tokens for
    prefill, keys read for decode), filled where the collector skipped a shape, with its flags."""

    family: str  # context or generation
    batch: np.ndarray
    length: np.ndarray
    s: np.ndarray
    flags: np.ndarray
    shape: tuple  # (heads, kv heads, head_dim, KV bytes per element) for the roofline
    roof: object
    fold: int = 1  # the heads were divided by this and the batch multiplied (head_fold)

    @classmethod
    def build(cls, grid: Grid, family: str, heads: int, kv: int, head_dim: int, kv_bytes: float,
              roof) -> "AttentionGrid":
        """Interpolated across head counts (log heads, linear time), the KV heads and head size taken as
        timed (else the nearest, scaled by the roofline), and shapes the collector skipped (large batch x
        length) scaled from the largest batch timed at that length. A head configuration the tables never
        timed whose heads and KV heads, both divided by f, were timed is that kernel over f times the
        sequences (`head_fold`)."""
        f = head_fold(grid, heads, kv, head_dim)
        if f > 1:
            folded = cls.build(grid, family, heads // f, kv // f, head_dim, kv_bytes, roof)
            folded.batch = folded.batch / f
            folded.fold = f
            return folded
        ax = grid.axes
        rf = roof.prefill if family == "context" else roof.decode
        b = ax["batch"].astype(float)
        s = ax["isl" if family == "context" else "step"].astype(float)
        bb, ss = b[:, None], s[None, :]

        def kernel(h, kvh, hd):  # the roofline over [batch, length]
            return rf(bb, ss, h, kvh, hd, kv_bytes)

        ms = np.swapaxes(grid.ms, -1, -2) if family == "context" else grid.ms  # as [.., batch, length]
        kv_axis = list(ax["kv"])
        key = 0 if kv == heads and 0 in kv_axis else kv
        extrapolated = key not in kv_axis
        if extrapolated:  # KV heads never timed: the nearest timed ones, scaled
            near = min((k for k in kv_axis if k), key=lambda k: abs(math.log(k / kv)))
            sl = ms[kv_axis.index(near)] * (kernel(heads, kv, head_dim) / kernel(heads, near, head_dim))
        else:
            sl = ms[kv_axis.index(key)]
        kv_of = (lambda h: h) if key == 0 else (lambda h: kv)
        sl, e = cut(ax["head_dim"], sl, head_dim, 0, True, False,
                    lambda x, a: kernel(heads, kv, x) / kernel(heads, kv, a))
        extrapolated |= e
        sl, e = cut(ax["heads"], sl, heads, 0, True, False,
                    lambda x, a: kernel(x, kv_of(x), head_dim) / kernel(a, kv_of(a), head_dim))
        extrapolated |= e
        out, flags = sl.copy(), np.zeros(sl.shape, dtype=bool)
        for j in range(len(s)):  # along the batch axis at each length
            c = fill_along(b, sl[:, j], family == "context", False,
                           lambda x, a, j=j: rf(x, s[j], heads, kv, head_dim, kv_bytes)
                           / rf(a, s[j], heads, kv, head_dim, kv_bytes))
            out[:, j], flags[:, j] = c.ms, c.extrapolated
        timed = [j for j in range(len(s)) if not np.isnan(out[:, j]).any()]
        if not timed:
            raise KvsimError(f"kernel tables: no {family} attention timed for {kv} KV heads, head_dim {head_dim} "
                             f"or any near it")
        roofs = kernel(heads, kv, head_dim)
        for j in range(len(s)):  # lengths with no batch timed: from the nearest timed length
            if np.isnan(out[:, j]).any():
                near = min(timed, key=lambda i: abs(math.log(s[i] / s[j])))
                out[:, j] = out[:, near] * roofs[:, j] / roofs[:, near]
                flags[:, j] = True
        return cls(family, b, s, out * 1e-3, flags | extrapolated, (heads, kv, head_dim, kv_bytes), roof)

    def ratio(self, batch, length, batch0, length0) -> float:
        rf = self.roof.prefill if self.family == "context" else self.roof.decode
        return float(rf(batch, length, *self.shape) / rf(batch0, length0, *self.shape))

    def knots(self, batch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The times at every grid length for `batch` (linear between grid batches; past the grid, the
        largest batch scaled by the roofline): (lengths, seconds, extrapolated)."""
        b = self.batch
        bq = min(max(batch, b[0]), b[-1])
        i, j = bracket(b, bq)
        w = 0.0 if i == j else (bq - b[i]) / (b[j] - b[i])
        t = (1 - w) * self.s[i] + w * self.s[j]
        flags = self.flags[i] | self.flags[j]
        if bq != batch:
            t = t * np.array([self.ratio(batch, x, bq, x) for x in self.length])
            flags = np.ones_like(flags)
        return self.length, t, flags


class ModelKernels:
    """The tables cut down to one model's kernels on one GPU of a tensor-parallel group: curves over
    the axes a step varies. Times are seconds; each query also says whether it was extrapolated."""

    def __init__(self, tables: KernelTables, model, gpu, tp: int, kv_cache_dtype: str, calibration):
        from kvsim.perf.memory import kv_bytes_per_token, kv_heads_per_gpu

        self.tables, self.tp = tables, tp
        self.heads = max(1, model.num_attention_heads // tp)
        self.kv = kv_heads_per_gpu(model, tp)
        self.head_dim = model.head_dim
        weight = "fp8" if model.dtype == "fp8" and "fp8" in tables.gemm else "bfloat16"
        self.roof = Roofline(gpu, calibration, 1.0 if weight == "fp8" else 2.0)
        self.notes: list[str] = []
        self.tables_used: set[str] = set()  # rows of the deployed formats and windows this model reads
        if model.dtype != weight and not (model.dtype == "float16" and weight == "bfloat16"):
            self.notes.append(f"{model.dtype} weights priced as {weight} GEMMs")
        kv_table = KV_TABLE_DTYPE.get(kv_cache_dtype, "fp8")
        if kv_table not in tables.generation:
            kv_table = "bfloat16"
        # decode reads the cache: a dtype the tables do not time scales its decode by bytes (an estimate)
        table_kv = "fp8" if kv_table == "fp8" else "bfloat16"
        self.decode_scale = 1.0
        if KV_TABLE_DTYPE.get(kv_cache_dtype) != kv_table or model.activation_bytes != 2:
            self.decode_scale = kv_bytes_per_token(model, kv_cache_dtype, tp) / kv_bytes_per_token(model, table_kv, tp)
            self.notes.append(f"kv_cache_dtype {kv_cache_dtype}: {kv_table} attention tables, decode scaled by its "
                              f"KV bytes ({self.decode_scale:.3g}x): an estimate")
        kvb = 1.0 if kv_table == "fp8" else 2.0
        self.weight, self.kv_table, self.kv_bytes = weight, kv_table, kvb
        self.layers = model.num_hidden_layers
        self.allreduce_calls = 2 * self.layers + 1  # after attention, after the MLP, after the embedding
        self.gemm_roles: list[str] = []
        self.gemm_shapes = self.layer_shapes(model, tp)
        self.gemm_roofs: list[Roofline] = []  # each GEMM's roofline (its rows' dtype, or the weight-only estimate's)
        self.layer_gemms_curves = [self.role_gemm_curve(tables, model, gpu, calibration, role, n, k)
                                   for (n, k), role in zip(self.gemm_shapes, self.gemm_roles)]
        self.lm_head_shape = (-(-model.vocab_size // tp), model.hidden_size)
        self.lm_head = gemm_curve(tables.gemm[weight], *self.lm_head_shape, self.roof)
        self.context, self.generation = self.attention_grids(tables, model)
        if self.generation.fold > 1:
            f = self.generation.fold
            self.notes.append(f"attention of {self.heads} query / {self.kv} KV heads a GPU (not timed): the timed "
                              f"{self.heads // f} / {self.kv // f}-head kernels over {f}x the sequences")
        self._ctx = context_table(self.context)  # per batch row and length segment: log t = a + b log(length)
        # windowed layers (sliding or chunked): their plan, and the windowed grids when the tables time them
        self.windows = [(plan, self.window_grids(tables, plan) if plan.rows else None)
                        for plan in window_plans(tables, model, kv_table)]
        self.full_layers = self.layers - sum(plan.count for plan, _ in self.windows)
        self.allreduce = {mode: allreduce_curve(g, tp, self.roof) for mode, g in tables.allreduce.items()} \
            if tp > 1 else {}

    def layer_shapes(self, model, tp: int) -> list[tuple[int, int]]:
        """(n, k) of one layer's GEMMs: qkv, o, gate_up, down (a MoE or MLA model: kvsim.perf.kernel_moe);
        their roles (kvsim.scenario.models.QUANT_ROLES) in gemm_roles."""
        q, kvw = self.heads * self.head_dim, self.kv * self.head_dim
        inter = -(-model.intermediate_size // tp)
        self.gemm_roles = ["attn", "attn", "mlp", "mlp"]
        return [(q + 2 * kvw, model.hidden_size), (model.hidden_size, q), (2 * inter, model.hidden_size),
                (model.hidden_size, inter)]

    def role_gemm_curve(self, tables, model, gpu, calibration, role: str, n: int, k: int) -> Curve:
        """A GEMM of one role over the token rows, from the rows of the role's weight format
        (kvsim.perf.kernel_plan.gemm_plan; the router: the weights dtype's); its roofline in gemm_roofs."""
        plan = gemm_plan(tables, model, role, gpu.name) if role != "router" else None
        if plan is None or (plan.table == self.weight and not plan.weight_bytes):
            self.gemm_roofs.append(self.roof)
            return gemm_curve(tables.gemm[self.weight], n, k, self.roof)
        peak = 2 * gpu.fp8_tflops if plan.table == "nvfp4" else 0.0  # Blackwell's dense FP4 rate: twice fp8's
        roof = Roofline(gpu, calibration, {"bfloat16": 2.0, "nvfp4": 0.5}.get(plan.table, 1.0), peak)
        curve = gemm_curve(tables.gemm[plan.table], n, k, roof)
        self.tables_used.add(f"gemm/{plan.table}")
        if plan.weight_bytes:  # weight-only: the 16-bit rows scaled to the weights' bytes
            target = Roofline(gpu, calibration, plan.weight_bytes)
            curve.ms = curve.ms * target.gemm(curve.x, n, k) / roof.gemm(curve.x, n, k)
            roof = target
        if plan.part.label != "measured" and plan.part.why not in self.notes:
            self.notes.append(f"{plan.part.part}: {plan.part.why}")
        self.gemm_roofs.append(roof)
        return curve

    def window_grids(self, tables, plan) -> tuple:
        """(prefill grid, its context table, decode grid) of the rows timed with the plan's window."""
        args = (self.heads, self.kv, self.head_dim, self.kv_bytes, self.roof)
        self.tables_used |= {f"window/{plan.window}/{fam}/{self.kv_table}" for fam in ("context", "generation")}
        ctx = AttentionGrid.build(tables.windowed[("context", self.kv_table, plan.window)], "context", *args)
        gen = AttentionGrid.build(tables.windowed[("generation", self.kv_table, plan.window)], "generation", *args)
        return ctx, context_table(ctx), gen

    def attention_grids(self, tables: KernelTables, model) -> tuple[AttentionGrid, AttentionGrid]:
        """The prefill and decode attention grids at this rank's heads."""
        args = (self.heads, self.kv, self.head_dim, self.kv_bytes, self.roof)
        return (AttentionGrid.build(tables.context[self.kv_table], "context", *args),
                AttentionGrid.build(tables.generation[self.kv_table], "generation", *args))

    # -- queries (seconds, extrapolated) ----------------------------------------------------------
    def step_gemms(self, m: float) -> tuple[float, bool]:
        """Every layer's GEMMs for m token rows."""
        t, flag = self.layer_gemms(m)
        return self.layers * t, flag

    def step_gemms_many(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t, flags = self.layer_gemms_many(m)
        return self.layers * t, flags

    def a2a_s(self, rows) -> float:
        """Expert-parallel all-gather and reduce-scatter of a step of `rows` tokens (DP attention only)."""
        return 0.0

    def layer_gemms(self, m: float) -> tuple[float, bool]:
        """One layer's qkv, o, gate_up and down GEMMs for m token rows."""
        total, flag = 0.0, False
        for (n, k), curve, roof in zip(self.gemm_shapes, self.layer_gemms_curves, self.gemm_roofs):
            t, f = at(curve, m, True, True, lambda x, a, n=n, k=k, r=roof: r.gemm(x, n, k) / r.gemm(a, n, k))
            total += t
            flag |= f
        return total, flag

    def layer_gemms_many(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """layer_gemms at many token counts at once."""
        total, flags = np.zeros(len(m)), np.zeros(len(m), dtype=bool)
        for (n, k), curve, roof in zip(self.gemm_shapes, self.layer_gemms_curves, self.gemm_roofs):
            t, f = at_many(curve, m, lambda x, a, n=n, k=k, r=roof: r.gemm(x, n, k) / r.gemm(a, n, k))
            total += t
            flags |= f
        return total, flags

    def allreduce_many(self, elements: np.ndarray, graph: bool) -> tuple[np.ndarray, np.ndarray]:
        curve = self.allreduce["graph" if graph else "eager"]
        roof = self.roof.allreduce
        return at_many(curve, elements, lambda x, a: np.array([roof(u, self.tp) / roof(v, self.tp)
                                                               for u, v in zip(x, a)]))

    def lm_head_gemm(self, m: float) -> tuple[float, bool]:
        n, k = self.lm_head_shape
        return at(self.lm_head, m, True, True, lambda x, a: self.roof.gemm(x, n, k) / self.roof.gemm(a, n, k))

    def allreduce_s(self, elements: float, graph: bool) -> tuple[float, bool]:
        curve = self.allreduce["graph" if graph else "eager"]
        return at(curve, elements, True, True,
                  lambda x, a: self.roof.allreduce(x, self.tp) / self.roof.allreduce(a, self.tp))

    def context_s(self, batch: float, isl: float) -> tuple[float, bool]:
        """One layer's prefill attention of `batch` prompts of `isl` new tokens, no cache: log-log along
        the prompt, linear along the batch (pure Python: this runs once per prefill step)."""
        return context_at(self._ctx, self.context, batch, isl)

    def windowed_prefill_s(self, batch: int, full: float, full_s: float, window_pairs) -> tuple[float, bool]:
        """Every windowed layer's prefill attention (kvsim.perf.kernel_windows.windowed_prefill_s)."""
        return windowed_prefill_s(self.windows, batch, full, full_s, window_pairs)

    def decode_knots(self, batch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One layer's decode attention for `batch` sequences as a piecewise-linear function of the
        keys each attends to: (knots, seconds at the knots, extrapolated); kvsim.perf.measured extends
        it past the last knot along the roofline's line (proportional to the keys). With windowed layers,
        the mean over the layers: full layers at the keys, windowed ones at their rows (the whole context)
        or the full rows at min(keys, window)."""
        knots, t, flags = self.generation.knots(batch)
        if self.windows:
            knots, t, flags = blend_windows(self.windows, self.full_layers, self.layers, batch, knots, t, flags)
        return knots, t * self.decode_scale, flags
