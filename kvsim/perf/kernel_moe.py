"""Measured fused-MoE and MLA kernels for one model's shapes, on kvsim.perf.kernel_curves' interpolation.

- Fused MoE (`moe_curve`): vLLM's `fused_experts` layer on one rank, by the tokens entering it. The
  tables time a few model configurations (hidden, moe intermediate size, top-k, experts) at each
  tensor- and expert-parallel size and routing. A model's configuration as timed gives its curve;
  an expert-parallel size not timed is interpolated (log-log) between the timed ones either side at
  each token count, as the GEMM and all-reduce curves are; a configuration not timed at all takes the
  nearest one timed, scaled by the roofline's ratio of the two (`moe_roof`) and flagged.
- MLA (`mla_grid`): the whole DeepSeek-V3 attention module (projections, attention, output) per layer
  and rank, over (batch, prompt length) for prefill and (batch, keys read) for decode, at the query
  heads on the rank: the same `AttentionGrid` as GQA attention (interpolated across head counts, the
  collector's skipped shapes filled along the batch), its roofline that of the module.

`moe_errors` and `mla_errors` hold shapes out of the tables and predict them from the rest
(benchmarks/kernel_holdout.py, kvsim.calibrate.kernel_holdout).
"""

from __future__ import annotations

import math

import numpy as np

from kvsim.perf.kernel_curves import AttentionGrid, Curve, ModelKernels, Roofline, at, cut, fill_along
from kvsim.perf.kernel_plan import mla_gemm, moe_plan
from kvsim.perf.kernels import Grid, MoeTable

MOE_HELD_EP = (4, 16, 64)
MLA_HELD_HEADS = (2, 8, 32)


def touched_experts(experts: float, top_k: float, tokens):
    """Distinct experts `tokens` tokens touch, each picking top_k of `experts` at random (balanced)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** np.maximum(tokens, 0))


def moe_roof(roof, tokens, hidden: int, inter: int, top_k: int, experts: int, tp: int, ep: int,
             weight_bytes: float):
    """One rank's fused MoE as a roofline: its share of the tokens' expert rows through gate_up and down,
    against the weights of the experts on the rank that the tokens touch."""
    local = max(experts // ep, 1)
    rows = np.asarray(tokens, dtype=float) * top_k / ep
    flops = 2.0 * rows * 3 * hidden * inter / tp
    weights = touched_experts(experts, top_k, tokens) / ep * 3 * hidden * inter / tp * weight_bytes
    weights = np.minimum(weights, local * 3 * hidden * inter / tp * weight_bytes)
    moved = weights + rows * (hidden + 2 * inter / tp) * 2 * 2
    return np.maximum(flops / roof.gemm_flops, moved / roof.bandwidth)


def _rows(table: MoeTable, **want) -> np.ndarray:
    names = ("hidden", "inter", "topk", "experts", "tp", "ep", "routing")
    mask = np.ones(len(table.config), dtype=bool)
    for i, name in enumerate(names):
        if name in want:
            mask &= table.config[:, i] == want[name]
    return np.flatnonzero(mask)


def _along_ep(table: MoeTable, rows: np.ndarray, ep: int) -> tuple[np.ndarray, bool]:
    """The ms over tokens at expert-parallel size `ep` from `rows` (one configuration at several EP sizes):
    the row itself, else log-log between the EP sizes either side (NaN where either was not timed)."""
    eps = table.config[rows, 5]
    order = np.argsort(eps)
    rows, eps = rows[order], eps[order]
    if ep in eps:
        return table.ms[rows[list(eps).index(ep)]], False
    if not eps[0] < ep < eps[-1]:
        return np.full(len(table.tokens), np.nan), True
    j = int(np.searchsorted(eps, ep))
    w = math.log(ep / eps[j - 1]) / math.log(eps[j] / eps[j - 1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp((1 - w) * np.log(table.ms[rows[j - 1]]) + w * np.log(table.ms[rows[j]])), False


def _nearest(table: MoeTable, hidden, inter, top_k, experts, tp, ep, routing) -> int:
    """The timed configuration closest to the model's (shape first, then parallel sizes and routing)."""
    c = table.config.astype(float)
    d = (np.abs(np.log(c[:, 0] / hidden)) + np.abs(np.log(c[:, 1] / inter)) + np.abs(np.log(c[:, 3] / experts))
         + 0.5 * np.abs(np.log(c[:, 2] / top_k)) + 0.1 * np.abs(np.log(c[:, 4] / tp)) + 0.1 * np.abs(np.log(c[:, 5] / ep))
         + 0.01 * np.abs(c[:, 6] - routing) + 100.0 * np.isnan(table.ms).all(axis=1))
    return int(np.argmin(d))


def moe_curve(table: MoeTable, hidden: int, inter: int, top_k: int, experts: int, tp: int, ep: int, routing: int,
              roof, weight_bytes: float) -> Curve:
    """The fused MoE layer (seconds, one rank) over the tokens entering it (see the module docstring)."""
    x = table.tokens.astype(float)

    def shape_roof(t, cfg):
        return moe_roof(roof, t, *cfg, weight_bytes)

    cfg = (hidden, inter, top_k, experts, tp, ep)
    same = _rows(table, hidden=hidden, inter=inter, topk=top_k, experts=experts, tp=tp, routing=routing)
    ms, flag = (_along_ep(table, same, ep) if len(same) else (np.full(len(x), np.nan), True))
    if np.isnan(ms).all():
        row = _nearest(table, hidden, inter, top_k, experts, tp, ep, routing)
        near = tuple(int(v) for v in table.config[row, :6])
        ms = table.ms[row] * shape_roof(x, cfg) / shape_roof(x, near)
        flag = True
    curve = fill_along(x, ms, True, True, lambda a, b: float(shape_roof(a, cfg) / shape_roof(b, cfg)))
    curve.extrapolated |= flag
    curve.ms *= 1e-3
    return curve


def moe_at(curve: Curve, tokens: float, roof_ratio) -> tuple[float, bool]:
    return at(curve, tokens, True, True, roof_ratio)


class MlaRoof:
    """The MLA module's roofline (absorbed decode, expanded prefill) per layer and rank, as the
    AttentionGrid interface calls it: prefill(batch, isl, heads, ...) and decode(batch, step, heads, ...)."""

    def __init__(self, roof, mla, hidden: int, kv_bytes: float, weight_bytes: float):
        self.roof, self.mla, self.hidden, self.kv_bytes, self.weight_bytes = roof, mla, hidden, kv_bytes, weight_bytes

    def _projections(self, tokens, heads):
        m = self.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        per_token = (self.hidden * (m.q_lora_rank or 0) + (m.q_lora_rank or self.hidden) * heads * qk
                     + self.hidden * m.latent_dim + heads * m.v_head_dim * self.hidden)
        return 2.0 * tokens * per_token, per_token * self.weight_bytes

    def prefill(self, batch, isl, heads, kv=0, head_dim=0, kv_bytes=0):
        m, tokens = self.mla, batch * isl
        flops, weights = self._projections(tokens, heads)
        flops = flops + 2.0 * tokens * m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)  # kv_b expand
        flops = flops + 2.0 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * batch * isl * (isl + 1) / 2
        moved = weights + tokens * m.latent_dim * self.kv_bytes
        return np.maximum(flops / self.roof.gemm_flops, moved / self.roof.bandwidth)

    def decode(self, batch, step, heads, kv=0, head_dim=0, kv_bytes=0):
        m = self.mla
        flops, weights = self._projections(batch, heads)
        flops = flops + 2.0 * batch * heads * (m.latent_dim + m.kv_lora_rank) * step  # absorbed: the latent is the key
        moved = weights + batch * step * m.latent_dim * self.kv_bytes
        return np.maximum(flops / self.roof.attn_flops, moved / self.roof.bandwidth)


def mla_grid(grid: Grid, family: str, heads: int, roof: MlaRoof) -> AttentionGrid:
    """The MLA module's grid at `heads` query heads a rank: cut along the heads linearly (the module's
    projections and attention both grow in proportion to them), then an AttentionGrid of one 'KV head'
    of the latent's size (the module's roofline prices what the tables lack)."""
    ax = grid.axes
    length, other = ("isl", "batch") if family == "mla_context" else ("batch", "step")
    b = ax["batch"].astype(float)[:, None] if family != "mla_context" else ax["batch"].astype(float)[None, :]
    s = ax["step"].astype(float)[None, :] if family != "mla_context" else ax["isl"].astype(float)[:, None]
    rf = roof.prefill if family == "mla_context" else roof.decode
    sl, flag = cut(ax["heads"], grid.ms, heads, 0, False, False,
                   lambda x, a: rf(b, s, x) / rf(b, s, a))
    axes = {"kv": np.array([0]), "head_dim": np.array([roof.mla.latent_dim]), "heads": np.array([heads]),
            length: ax[length], other: ax[other]}
    built = AttentionGrid.build(Grid(axes, sl.reshape(1, 1, 1, *sl.shape)),
                                "context" if family == "mla_context" else "generation", heads, heads,
                                roof.mla.latent_dim, roof.kv_bytes, roof)
    built.flags |= flag
    return built


# ---- held out ---------------------------------------------------------------------------------------
def moe_errors(table: MoeTable, roof, weight_bytes: float) -> tuple[list, list]:
    """Every configuration at EP sizes 4, 16 and 64 held out, predicted from the others (EP 2 and 8, 8
    and 32, 32 and 128 either side): errors at every token count timed, interpolated and extrapolated."""
    held = np.isin(table.config[:, 5], MOE_HELD_EP)
    train = MoeTable(table.config[~held], table.tokens, table.ms[~held])
    inside, outside = [], []
    for row in np.flatnonzero(held):
        h, i, k, e, tp, ep, r = (int(v) for v in table.config[row])
        curve = moe_curve(train, h, i, k, e, tp, ep, r, roof, weight_bytes)
        for t, truth in zip(table.tokens, table.ms[row] * 1e-3):
            if np.isnan(truth):
                continue
            pred, flag = at(curve, float(t), True, True, lambda a, b: 1.0)
            (outside if flag else inside).append(pred / truth - 1)
    return inside, outside


def mla_errors(grid: Grid, family: str, roof: MlaRoof) -> tuple[list, list]:
    """Every row of 2, 8 and 32 query heads a rank held out, predicted from 1, 4, 16, 64 and 128."""
    keep = ~np.isin(grid.axes["heads"], MLA_HELD_HEADS)
    train = Grid(dict(grid.axes, heads=grid.axes["heads"][keep]), grid.ms[keep])
    inside, outside = [], []
    for hi, heads in enumerate(grid.axes["heads"]):
        if heads not in MLA_HELD_HEADS:
            continue
        truth = grid.ms[hi] * 1e-3
        if family == "mla_context":
            truth = truth.T  # as [batch, length]
        pred = mla_grid(train, family, int(heads), roof)
        for bi in range(truth.shape[0]):
            for si in range(truth.shape[1]):
                if not np.isnan(truth[bi, si]):
                    (outside if pred.flags[bi, si] else inside).append(pred.s[bi, si] / truth[bi, si] - 1)
    return inside, outside


# ---- a model with MoE layers and/or MLA attention -------------------------------------------------
def routing_code(skew: float) -> int:
    """The tables' routing of a model's expert_skew: 0 balanced, else the power law's exponent x 100."""
    return 0 if not skew else round(100 * skew)


class MoeMlaKernels(ModelKernels):
    """ModelKernels of a mixture-of-experts and/or MLA model, deployed over `dp` data-parallel attention
    ranks with the experts whole over tp x dp GPUs (`expert_parallel`) or sliced over them:

    - a MoE layer: attention GEMMs (MLA: in the module), the router (replicated), the shared experts
      (sliced over tp), and the fused MoE at the tokens entering it (dp x the rank's, all gathered);
      the first dense layers: a dense MLP. With dp > 1 a MoE layer's output is reduced by an
      all-gather and a reduce-scatter over the tp x dp GPUs (the roofline's link estimate: the tables
      time no all-gather), and attention alone is all-reduced over tp;
    - MLA attention: the module tables at the rank's query heads (prefill and decode).
    """

    def __init__(self, tables, model, gpu, tp: int, kv_cache_dtype: str, calibration, dp: int = 1,
                 expert_parallel: bool = False, expert_skew: float = 0.0):
        self.model, self.dp = model, dp
        super().__init__(tables, model, gpu, tp, kv_cache_dtype, calibration)
        moe = model.moe
        self.dense_layers, self.moe_layers = model.num_dense_layers, model.num_moe_layers
        self.moe_curve, self.moe_cfg = None, None
        if moe:
            plan = moe_plan(tables, model, gpu.name)  # the fused-MoE rows of the experts' format (kernel_plan)
            wb = plan.table_bytes
            ep = tp * dp if expert_parallel else 1
            self.moe_cfg = (model.hidden_size, moe.moe_intermediate_size, moe.num_experts_per_tok,
                            moe.n_routed_experts, 1 if expert_parallel else tp * dp, ep)
            # the rows' peak: fp8 MMA for fp8, FP4 (twice fp8, Blackwell) for NVFP4, 16-bit for weight-only 4-bit
            peak = {"fp8": gpu.fp8_tflops, "fp8_block": gpu.fp8_tflops, "nvfp4": 2 * gpu.fp8_tflops}
            roof = Roofline(gpu, calibration, 2.0, peak.get(plan.table, gpu.bf16_tflops))
            self.moe_curve = moe_curve(tables.moe[plan.table], *self.moe_cfg, routing_code(expert_skew), roof, wb)
            self.tables_used.add(f"moe/{plan.table}")
            if plan.weight_bytes != wb:  # another format's rows stand in: scaled by the roofline's weight bytes
                x = self.moe_curve.x
                self.moe_curve.ms = self.moe_curve.ms * moe_roof(roof, x, *self.moe_cfg, plan.weight_bytes) / \
                    moe_roof(roof, x, *self.moe_cfg, wb)
                wb = plan.weight_bytes
                self.notes.append(f"{plan.part.part}: {plan.part.why}")
            self.moe_roof = lambda t, cfg=self.moe_cfg, wb=wb, roof=roof: moe_roof(roof, t, *cfg, wb)
            if dp > 1:
                self.allreduce_calls = 2 * self.dense_layers + self.moe_layers + 1
                c, per_token = calibration, model.hidden_size * model.activation_bytes
                link = gpu.nvlink_gbps * 1e9 * c.allreduce_efficiency
                self.a2a_fixed = 2 * self.moe_layers * c.allreduce_latency_s
                self.a2a_per_token = 2 * self.moe_layers * (tp * dp - 1) / (tp * dp) * dp * per_token / link

    def layer_shapes(self, model, tp: int) -> list[tuple[int, int]]:
        """Attention's (none for MLA: the module) and, per layer kind, the MLP's or MoE's own GEMMs."""
        h = model.hidden_size
        attn = [] if model.mla else super().layer_shapes(model, tp)[:2]
        inter = -(-model.intermediate_size // tp)
        self.dense_shapes = [(2 * inter, h), (h, inter)]
        moe, shared = model.moe, -(-(model.moe.shared_expert_intermediate_size if model.moe else 0) // tp)
        self.moe_shapes = ([(moe.n_routed_experts, h)] + ([(2 * shared, h), (h, shared)] if shared else [])) if moe else []
        self.n_attn = len(attn)
        self.gemm_roles = ["attn"] * len(attn) + ["mlp", "mlp"] + (["router"] + ["shared"] * (2 if shared else 0)
                                                                   if moe else [])
        return attn + self.dense_shapes + self.moe_shapes

    def attention_grids(self, tables, model):
        if not model.mla:
            return super().attention_grids(tables, model)
        gemm, part = mla_gemm(tables, model)
        if part is not None:
            self.notes.append(f"{part.part}: {part.why}")
        mroof = MlaRoof(Roofline(self.roof.gpu, self.roof.calibration, 1.0 if gemm != "bfloat16" else 2.0),
                        model.mla, model.hidden_size, self.kv_bytes, 1.0 if gemm != "bfloat16" else 2.0)
        return tuple(mla_grid(tables.mla[(family, self.kv_table, gemm)], family, self.heads, mroof)
                     for family in ("mla_context", "mla_generation"))

    def _groups(self, times: list) -> tuple:
        """Per-layer-kind sums of the layer GEMM times (attention, dense MLP, MoE's router and shared)."""
        a, d = self.n_attn, self.n_attn + len(self.dense_shapes)
        return sum(times[:a], 0.0), sum(times[a:d], 0.0), sum(times[d:], 0.0)

    def step_gemms(self, m: float) -> tuple[float, bool]:
        times, flag = [], False
        for (n, k), curve, roof in zip(self.gemm_shapes, self.layer_gemms_curves, self.gemm_roofs):
            t, f = at(curve, m, True, True, lambda x, a, n=n, k=k, r=roof: r.gemm(x, n, k) / r.gemm(a, n, k))
            times.append(t)
            flag |= f
        attn, dense, moe = self._groups(times)
        total = self.layers * attn + self.dense_layers * dense
        if self.moe_curve is not None:
            t, f = moe_at(self.moe_curve, self.dp * m, lambda x, a: float(self.moe_roof(x) / self.moe_roof(a)))
            total += self.moe_layers * (moe + t)
            flag |= f
        return total, flag

    def step_gemms_many(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = [self.step_gemms(float(x)) for x in m]
        return np.array([t for t, _ in out]), np.array([f for _, f in out], dtype=bool)

    def a2a_s(self, rows):
        return self.a2a_fixed + self.a2a_per_token * rows if self.moe_curve is not None and self.dp > 1 else 0.0


def model_kernels(tables, model, gpu, tp: int, kv_cache_dtype: str, calibration, dp: int = 1,
                  expert_parallel: bool = False, expert_skew: float = 0.0) -> ModelKernels:
    """The kernels of `model`: ModelKernels for a dense GQA model, MoeMlaKernels otherwise."""
    if model.moe is None and model.mla is None:
        return ModelKernels(tables, model, gpu, tp, kv_cache_dtype, calibration)
    return MoeMlaKernels(tables, model, gpu, tp, kv_cache_dtype, calibration, dp, expert_parallel, expert_skew)


def untimed_layers(tables, model) -> list[str]:
    """The parts of `model` these tables do not time (kvsim.perf.basis names them): "MoE experts" without
    any fused-MoE table (a format not timed takes the nearest one timed: kvsim.perf.kernel_plan.moe_plan),
    "MLA attention" without an MLA module table at its GEMM dtype."""
    out = []
    if model.moe and moe_plan(tables, model, "") is None:
        out.append("MoE experts")
    if model.mla and not any(key[2] == mla_gemm(tables, model)[0] for key in tables.mla):
        out.append("MLA attention")
    return out
