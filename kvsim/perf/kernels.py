"""Measured vLLM kernel times: the shipped tables, and curves through them for one model's shapes.

The tables are NVIDIA AIConfigurator's timings of real vLLM kernels (github.com/ai-dynamo/aiconfigurator,
Apache-2.0; `kernel_data/LICENSE`), converted once by `kvsim.calibrate.aiconfigurator` into one compressed
`.npz` per GPU preset and vLLM release (`kernel_data/<gpu>-vllm-<version>.npz`, provenance under its
`meta`): dense grids in ms per call, NaN where a shape was not timed, rounded to float16 (0.05%).
Shipping them converted keeps pyarrow out of kvsim's dependencies and the package independent of the
raw tables; a few MiB of grids load in milliseconds.

A step needs each kernel at the model's shapes only, so `KernelTables` cuts each grid down to curves
over the axes a step varies (tokens; batch x length; message size) once, and the pricer evaluates
those. Interpolation is piecewise linear between measured points, in log coordinates where the kernel
scales as a power (GEMMs over m, n, k; all-reduce over the message; prefill attention over the prompt)
and linearly where it is affine in the work (decode attention over batch and context: exact for a
memory-bound kernel, and piecewise linear in the context so that runs of decode steps sum in closed
form). Piecewise-linear interpolation never overshoots its two points, so it keeps the tables' order.
Where the tables have no point (a shape past the grid, a head count or head size not timed, a batch
too large for the collector's memory cap) a measured neighbour is scaled by the roofline's ratio
(`Roofline`: kvsim/perf/roofline.py's compute and memory terms, per kernel) and the point is flagged
as extrapolated.
"""

from __future__ import annotations

import json
import math
import zipfile
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError

DATA_DIR = Path(__file__).parent / "kernel_data"
GPU_STEMS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm", "A100-80GB": "a100_sxm", "B200": "b200_sxm"}
KV_TABLE_DTYPE = {"auto": "bfloat16", "bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8"}
# array name -> (dimensions, axis names) every kernel-table file must hold
_GEMM_AXES = ("m", "n", "k")
_CONTEXT_AXES = ("kv", "head_dim", "heads", "isl", "batch")
_GENERATION_AXES = ("kv", "head_dim", "heads", "batch", "step")


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))


def shipped_versions(gpu_name: str) -> list[str]:
    """vLLM releases whose kernel tables ship for this GPU preset, oldest first ([] for none)."""
    stem = GPU_STEMS.get(gpu_name)
    if stem is None:
        return []
    found = [p.name[len(stem) + 6:-4] for p in DATA_DIR.glob(f"{stem}-vllm-*.npz")]
    return sorted(found, key=version_key)


def shipped_path(gpu_name: str, version: str) -> Path:
    return DATA_DIR / f"{GPU_STEMS[gpu_name]}-vllm-{version}.npz"


@dataclass(slots=True, frozen=True)
class Grid:
    """One kernel family's timings: `axes` (name -> sorted int array) and `ms` over them (NaN: not timed)."""

    axes: dict
    ms: np.ndarray


class KernelTables:
    """One kernel-table file, checked: every array a step needs, consistent shapes, positive times."""

    def __init__(self, path: Path):
        self.path = Path(path)
        arrays = _read_npz(self.path)
        self.meta = self._meta(arrays)
        self.gemm = {d: self._grid(arrays, f"gemm/{d}", _GEMM_AXES) for d in ("bfloat16", "fp8")
                     if f"gemm/{d}/ms" in arrays or d == "bfloat16"}
        self.context = {d: self._grid(arrays, f"context/{d}", _CONTEXT_AXES) for d in ("bfloat16", "fp8")
                        if f"context/{d}/ms" in arrays or d == "bfloat16"}
        self.generation = {d: self._grid(arrays, f"generation/{d}", _GENERATION_AXES) for d in ("bfloat16", "fp8")
                           if f"generation/{d}/ms" in arrays or d == "bfloat16"}
        self.allreduce = {mode: self._grid(arrays, "allreduce", ("gpus", "size"), f"{mode}_ms")
                          for mode in ("graph", "eager")}

    @property
    def vllm_version(self) -> str:
        return self.meta["vllm_version"]

    def _meta(self, arrays: dict) -> dict:
        raw = arrays.get("meta")
        try:
            meta = json.loads(str(raw[()]))
            if not isinstance(meta, dict) or not isinstance(meta.get("vllm_version"), str):
                raise ValueError
        except (TypeError, ValueError, IndexError, KeyError):
            raise KvsimError(f"{self.path}: meta: missing or not the provenance record kvsim writes") from None
        return meta

    def _grid(self, arrays: dict, prefix: str, axis_names: tuple, ms_name: str = "ms") -> Grid:
        axes = {}
        for name in axis_names:
            a = arrays.get(f"{prefix}/{name}")
            if a is None:
                raise KvsimError(f"{self.path}: {prefix}/{name}: missing")
            if a.ndim != 1 or a.dtype.kind not in "iu" or len(a) < 1 or (a < 0).any() or (np.diff(a) <= 0).any():
                raise KvsimError(f"{self.path}: {prefix}/{name}: must be increasing non-negative integers")
            axes[name] = a.astype(np.int64)
        ms = arrays.get(f"{prefix}/{ms_name}")
        if ms is None:
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: missing")
        shape = tuple(len(a) for a in axes.values())
        if ms.dtype.kind != "f" or ms.shape != shape:
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: expected floats of shape {shape}, got {ms.dtype} {ms.shape}")
        ms = ms.astype(np.float64)
        finite = ms[~np.isnan(ms)]
        if finite.size == 0 or not np.isfinite(finite).all() or (finite <= 0).any():
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: times must be positive numbers (NaN: not timed)")
        return Grid(axes, ms)


def _read_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise KvsimError(f"{path}: kernel tables not found") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise KvsimError(f"{path}: not a kernel-table file ({str(exc).splitlines()[0][:100]})") from None


@lru_cache(maxsize=8)
def load_tables(path) -> KernelTables:
    return KernelTables(Path(path))


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


def nearest(values: np.ndarray, x: float, log: bool = True) -> int:
    """Index of the grid value nearest x (in log distance when `log`)."""
    d = np.abs(np.log(values / x)) if log else np.abs(values - x)
    return int(np.argmin(d))


# ---- the roofline, per kernel: what extrapolation scales a measured neighbour by ---------------
class Roofline:
    """Per-kernel roofline times (s) on `gpu` with a calibration's efficiencies: the compute and memory
    terms kvsim/perf/roofline.py sums for a whole step, here for one kernel call of a given shape."""

    def __init__(self, gpu, calibration, weight_bytes: float = 2.0):
        c = calibration
        self.gpu, self.calibration, self.weight_bytes = gpu, c, weight_bytes
        peak = gpu.fp8_tflops if weight_bytes == 1 else gpu.bf16_tflops
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
    """(ms, extrapolated) of a filled curve at x; past its ends, the end x roofline ratio."""
    xs = curve.x
    if x <= xs[0] or x >= xs[-1]:
        a = 0 if x <= xs[0] else len(xs) - 1
        if x == xs[a]:
            return float(curve.ms[a]), bool(curve.extrapolated[a])
        return float(curve.ms[a]) * ratio(x, float(xs[a])), True
    j = int(np.searchsorted(xs, x))
    if xs[j] == x:
        return float(curve.ms[j]), bool(curve.extrapolated[j])
    i = j - 1
    x0, x1, y0, y1 = float(xs[i]), float(xs[j]), float(curve.ms[i]), float(curve.ms[j])
    w = math.log(x / x0) / math.log(x1 / x0) if logx else (x - x0) / (x1 - x0)
    y = math.exp((1 - w) * math.log(y0) + w * math.log(y1)) if logy else (1 - w) * y0 + w * y1
    return y, bool(curve.extrapolated[i] or curve.extrapolated[j])


def cut(values: np.ndarray, grid: np.ndarray, x: float, axis: int, logx: bool, logy: bool,
        ratio) -> tuple[np.ndarray, bool]:
    """`grid` at x along `axis` (interpolated between its neighbours), or, off the axis or where a
    neighbour is missing, the nearest slice scaled by ratio(x, anchor): (slice, extrapolated)."""
    inside = values[0] <= x <= values[-1]
    if inside:
        sl = interp_axis(values, grid, x, axis, logx, logy)
        if values[nearest(values, x)] == x or not np.isnan(sl).all():
            return sl, False
    a = nearest(values, x)
    return np.take(grid, a, axis=axis) * ratio(x, float(values[a])), True


class ModelKernels:
    """The tables cut down to one model's kernels on one GPU of a tensor-parallel group: curves over
    the axes a step varies. Times are seconds; each query also says whether it was extrapolated."""

    def __init__(self, tables: KernelTables, model, gpu, tp: int, kv_cache_dtype: str, calibration):
        from kvsim.perf.memory import kv_elem_bytes, kv_heads_per_gpu

        self.tables, self.tp = tables, tp
        self.heads = max(1, model.num_attention_heads // tp)
        self.kv = kv_heads_per_gpu(model, tp)
        self.head_dim, self.hidden = model.head_dim, model.hidden_size
        weight = "fp8" if model.dtype == "fp8" and "fp8" in tables.gemm else "bfloat16"
        self.roof = Roofline(gpu, calibration, 1.0 if weight == "fp8" else 2.0)
        self.notes: list[str] = []
        if model.dtype != weight and not (model.dtype == "float16" and weight == "bfloat16"):
            self.notes.append(f"{model.dtype} weights priced as {weight} GEMMs scaled by the roofline")
        kv_table = KV_TABLE_DTYPE.get(kv_cache_dtype, "fp8")
        if kv_table not in tables.generation:
            kv_table = "bfloat16"
        self.kv_table = kv_table
        self.kv_bytes = kv_elem_bytes(model, kv_cache_dtype)
        table_bytes = 1.0 if kv_table == "fp8" else 2.0
        # decode reads the cache: a dtype the tables do not time scales its decode by bytes (an estimate)
        self.decode_scale = 1.0 if kv_cache_dtype in KV_TABLE_DTYPE and model.activation_bytes == 2 else \
            self.kv_bytes / table_bytes
        if self.decode_scale != 1.0 or kv_cache_dtype not in KV_TABLE_DTYPE:
            self.notes.append(f"kv_cache_dtype {kv_cache_dtype}: {kv_table} attention tables, decode scaled by "
                              f"KV bytes ({self.decode_scale:.3g}x), an estimate")
        q, kvw = self.heads * self.head_dim, self.kv * self.head_dim
        inter = -(-model.intermediate_size // tp)
        shapes = [(q + 2 * kvw, model.hidden_size), (model.hidden_size, q), (2 * inter, model.hidden_size),
                  (model.hidden_size, inter)]
        self.gemm_shapes = shapes
        self.layer_gemms_curves = [self._gemm_curve(tables.gemm[weight], n, k) for n, k in shapes]
        self.lm_head_shape = (-(-model.vocab_size // tp), model.hidden_size)
        self.lm_head = self._gemm_curve(tables.gemm[weight], *self.lm_head_shape)
        self._kvb = 1.0 if kv_table == "fp8" else 2.0
        self.context = self._attention(tables.context[kv_table], "context")
        c = self.context
        self._ctx = (c["batch"].tolist(), c["length"].tolist(), np.log(c["length"]).tolist(),
                     np.log(c["ms"]).tolist(), c["flags"].tolist())
        self.generation = self._attention(tables.generation[kv_table], "generation")
        self.allreduce = {mode: self._allreduce_curve(g) for mode, g in tables.allreduce.items()} if tp > 1 else {}

    # -- building -----------------------------------------------------------------------------
    def _gemm_curve(self, grid: Grid, n: int, k: int) -> Curve:
        m_axis = grid.axes["m"].astype(float)
        roof = self.roof.gemm
        by_k, ek = cut(grid.axes["k"], grid.ms, k, 2, True, True,
                       lambda x, a: (roof(m_axis[:, None], grid.axes["n"][None, :], x)
                                     / roof(m_axis[:, None], grid.axes["n"][None, :], a)))
        by_n, en = cut(grid.axes["n"], by_k, n, 1, True, True, lambda x, a: roof(m_axis, x, k) / roof(m_axis, a, k))
        curve = fill_along(m_axis, by_n, True, True, lambda x, a: roof(x, n, k) / roof(a, n, k))
        curve.extrapolated |= ek or en
        curve.ms *= 1e-3
        return curve

    def _attention(self, grid: Grid, family: str) -> dict:
        """The family's times for this model's heads as a filled grid over [batch, length]
        ({"batch", "length", "ms" (s), "flags"}): interpolated across head counts, the KV heads and
        head size taken as timed (else the nearest, scaled by the roofline), and shapes the collector
        skipped (large batch x length) scaled from the largest batch timed at that length."""
        ax = grid.axes
        roof = self.roof.prefill if family == "context" else self.roof.decode
        b = ax["batch"].astype(float)
        s = ax["isl" if family == "context" else "step"].astype(float)
        kvb = 1.0 if self.kv_table == "fp8" else 2.0
        bb, ss = b[:, None], s[None, :]

        def kernel(heads, kv, hd):  # the roofline over [batch, length]
            return roof(bb, ss, heads, kv, hd, kvb)

        def oriented(a):  # the tables' [.., isl, batch] (context) or [.., batch, step] as [.., batch, length]
            return np.swapaxes(a, -1, -2) if family == "context" else a

        ms = oriented(grid.ms)
        kv_axis = list(ax["kv"])
        key = 0 if self.kv == self.heads and 0 in kv_axis else self.kv
        extrapolated = key not in kv_axis
        if extrapolated:  # KV heads never timed: the nearest timed ones, scaled
            near = min((k for k in kv_axis if k), key=lambda k: abs(math.log(k / self.kv)))
            sl = ms[kv_axis.index(near)] * (kernel(self.heads, self.kv, self.head_dim)
                                            / kernel(self.heads, near, self.head_dim))
        else:
            sl = ms[kv_axis.index(key)]
        kv_of = (lambda h: h) if key == 0 else (lambda h: self.kv)
        sl, e = cut(ax["head_dim"], sl, self.head_dim, 0, True, False,
                    lambda x, a: kernel(self.heads, self.kv, x) / kernel(self.heads, self.kv, a))
        extrapolated |= e
        sl, e = cut(ax["heads"], sl, self.heads, 0, True, False,
                    lambda x, a: kernel(x, kv_of(x), self.head_dim) / kernel(a, kv_of(a), self.head_dim))
        extrapolated |= e
        out, flags = sl.copy(), np.zeros(sl.shape, dtype=bool)
        for j in range(len(s)):  # along the batch axis at each length
            c = fill_along(b, sl[:, j], family == "context", False,
                           lambda x, a, j=j: roof(x, s[j], self.heads, self.kv, self.head_dim, kvb)
                           / roof(a, s[j], self.heads, self.kv, self.head_dim, kvb))
            out[:, j], flags[:, j] = c.ms, c.extrapolated
        timed = [j for j in range(len(s)) if not np.isnan(out[:, j]).any()]
        for j in range(len(s)):  # lengths with no batch timed: from the nearest timed length
            if np.isnan(out[:, j]).any():
                near = min(timed, key=lambda i: abs(math.log(s[i] / s[j])))
                out[:, j] = out[:, near] * kernel(self.heads, self.kv, self.head_dim)[:, j] / \
                    kernel(self.heads, self.kv, self.head_dim)[:, near]
                flags[:, j] = True
        return {"batch": b, "length": s, "ms": out * 1e-3, "flags": flags | extrapolated}

    def _allreduce_curve(self, grid: Grid) -> Curve:
        gpus, size = grid.axes["gpus"], grid.axes["size"].astype(float)
        roof = self.roof.allreduce
        sl, e = cut(gpus, grid.ms, self.tp, 0, True, True,
                    lambda x, a: np.array([roof(z, int(x)) / roof(z, int(a)) for z in size]))
        curve = fill_along(size, sl, True, True, lambda x, a: roof(x, self.tp) / roof(a, self.tp))
        curve.extrapolated |= e
        curve.ms *= 1e-3
        return curve

    # -- queries (seconds, extrapolated) ----------------------------------------------------------
    def layer_gemms(self, m: float) -> tuple[float, bool]:
        """One layer's qkv, o, gate_up and down GEMMs for m token rows."""
        total, flag = 0.0, False
        for (n, k), curve in zip(self.gemm_shapes, self.layer_gemms_curves):
            t, f = at(curve, m, True, True, lambda x, a, n=n, k=k: self.roof.gemm(x, n, k) / self.roof.gemm(a, n, k))
            total += t
            flag |= f
        return total, flag

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
        b, s, log_s, log_ms, flags = self._ctx
        bq = b[0] if batch < b[0] else b[-1] if batch > b[-1] else batch
        sq = s[0] if isl < s[0] else s[-1] if isl > s[-1] else isl
        p = min(bisect_right(s, sq), len(s) - 1)
        p, q = (p - 1, p) if p else (0, 1)
        wl = (math.log(sq) - log_s[p]) / (log_s[q] - log_s[p])
        i = min(bisect_right(b, bq), len(b) - 1)
        i, j = (i - 1, i) if i else (0, 1)
        wb = (bq - b[i]) / (b[j] - b[i])
        ri, rj = log_ms[i], log_ms[j]
        t = (1 - wb) * math.exp(ri[p] + wl * (ri[q] - ri[p])) + wb * math.exp(rj[p] + wl * (rj[q] - rj[p]))
        flag = flags[i][p] or flags[i][q] or flags[j][p] or flags[j][q]
        if bq != batch or sq != isl:
            roof = self.roof.prefill
            t *= float(roof(batch, isl, self.heads, self.kv, self.head_dim, self._kvb)
                       / roof(bq, sq, self.heads, self.kv, self.head_dim, self._kvb))
            flag = True
        return t, bool(flag)

    def decode_knots(self, batch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One layer's decode attention for `batch` sequences as a piecewise-linear function of the
        keys each attends to: (knots, seconds at the knots, extrapolated), linear between knots and,
        past the last, along the roofline's line through it (decode attention is affine there)."""
        g = self.generation
        b = g["batch"]
        bq = min(max(batch, b[0]), b[-1])
        i, j = bracket(b, bq)
        w = 0.0 if i == j else (bq - b[i]) / (b[j] - b[i])
        ms = (1 - w) * g["ms"][i] + w * g["ms"][j]
        flags = g["flags"][i] | g["flags"][j]
        if bq != batch:
            s = g["length"]
            ms = ms * self.roof.decode(batch, s, self.heads, self.kv, self.head_dim, self._kvb) / \
                self.roof.decode(bq, s, self.heads, self.kv, self.head_dim, self._kvb)
            flags = np.ones_like(flags)
        return g["length"], ms * self.decode_scale, flags

