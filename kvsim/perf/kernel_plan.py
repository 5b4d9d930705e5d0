"""Which measured rows price each part of a model as deployed, and whether that part is measured or estimated.

Pure decisions on a `KernelTables` and a `ModelSpec`, shared by the pricer (kvsim.perf.kernel_curves,
kvsim.perf.kernel_moe) and the answer's label (kvsim.perf.basis), so that what is said is what is done.

- GEMMs, per role (attention, dense MLP, shared experts; kvsim.scenario.models.QUANT_ROLES): the rows of
  the role's weight format. Block fp8 (DeepSeek-style checkpoints): `fp8_block` rows, else per-tensor
  `fp8` rows (estimated), also where a release's block-fp8 rows time the host rather than the GPU
  (`BLOCK_FP8_FLOOR_RATIO`: vLLM 0.24's, H200 0.18's). NVFP4 on a GPU whose tables time it (B200): `nvfp4` rows. A format the tables
  do not time runs, in vLLM, as a weight-only kernel that multiplies in 16 bits (Marlin: NVFP4 and MXFP4
  on Hopper and Ampere, which have no FP4 tensor cores, int4 w4a16 everywhere, fp8 on Ampere): the
  bfloat16 rows scaled by the roofline's ratio of the weights' bytes (estimated; at small batches the
  weight read dominates, at large ones the 16-bit MMA).
- MoE experts: vLLM's fused-MoE rows of the experts' format; a format not timed takes the nearest kernel
  timed (4-bit: Marlin int4, then bfloat16; fp8: the other fp8, then bfloat16), scaled by the roofline's
  ratio of weight bytes (estimated).
- Windowed layers: sliding-window layers take the tables' rows timed with that window (the kernel at the
  whole context, reading the window) where the release timed it at the model's head size; else, and for
  Llama-4's chunked-local layers, full-attention rows at min(context, window): measured kernels over the
  keys the layer reads (a chunk reads its own tokens: exact in the first chunk, an upper bound past it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.scenario.models import CHUNKED, SLIDING

MEASURED, ESTIMATED = "measured", "estimated"
# a policy's kv_cache_dtype -> the attention tables' (int8 and int4 caches: the fp8 tables, scaled by bytes)
KV_TABLE_DTYPE = {"auto": "bfloat16", "bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8", "fp8_e4m3": "fp8"}
GEMM_ROWS = {"fp8": ("fp8_block", "fp8"), "fp8_tensor": ("fp8",), "nvfp4": ("nvfp4",)}  # format -> rows, best first
MOE_ROWS = {"fp8": ("fp8_block", "fp8"), "fp8_tensor": ("fp8", "fp8_block"), "mxfp4": ("mxfp4", "int4"),
            "nvfp4": ("nvfp4", "int4"), "int4": ("int4",)}
TABLE_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "mxfp4": 0.5, "nvfp4": 0.5, "int4": 0.5}
# names of the checkpoint formats (kvsim.scenario.models.QUANT_FORMATS) and of the tables' rows, in messages
_NAMES = {"fp8": "128x128-block fp8", "fp8_tensor": "per-tensor fp8", "mxfp4": "MXFP4", "nvfp4": "NVFP4",
          "int4": "int4 weight-only (w4a16)", "bfloat16": "bfloat16"}
_ROWS = {"fp8": "per-tensor fp8", "fp8_block": "block-fp8", "mxfp4": "MXFP4", "nvfp4": "NVFP4",
         "int4": "Marlin int4 weight-only (w4a16)", "bfloat16": "bfloat16"}


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the step, how it is priced: `label` measured or estimated, and why."""

    part: str
    label: str
    why: str

    def to_dict(self) -> dict:
        return {"part": self.part, "label": self.label, "why": self.why}


@dataclass(frozen=True, slots=True)
class GemmPlan:
    """A role's GEMMs: the `table` rows, scaled by the roofline from `table_bytes` to `weight_bytes` a weight
    when `weight_bytes` (weight-only kernels), and the Part it makes (None: the plain dtype, as before)."""

    table: str
    weight_bytes: float = 0.0
    part: Part | None = None


# Block-fp8 GEMM rows whose cheapest call costs more than this many times the same release's per-tensor fp8
# rows' are not the GPU's time: vLLM 0.24's (every kernel timed, DeepGEMM, FlashInfer, CUTLASS) cost 55-155 us
# for the smallest GEMM on Hopper and Blackwell where its per-tensor fp8 rows cost 4-5 us and 0.19's
# block-fp8 rows 6 us: the host's time in vLLM's block-fp8 wrapper, timed outside a CUDA graph, which a
# graph-captured decode step does not pay. Those releases price block-fp8 GEMMs with per-tensor fp8 rows.
BLOCK_FP8_FLOOR_RATIO = 4.0


def _floor_s(grid) -> float:
    import numpy as np

    return float(np.nanmin(grid.ms))


def block_fp8_rows_usable(tables) -> bool:
    """Whether the tables' block-fp8 GEMM rows time the GPU (see BLOCK_FP8_FLOOR_RATIO)."""
    if "fp8_block" not in tables.gemm:
        return False
    if "fp8" not in tables.gemm:
        return True
    return _floor_s(tables.gemm["fp8_block"]) <= BLOCK_FP8_FLOOR_RATIO * _floor_s(tables.gemm["fp8"])


def gemm_plan(tables, model, role: str, gpu_name: str) -> GemmPlan:
    fmt = model.weight_format(role)
    if not fmt:  # the weights dtype: fp8 rows for vLLM's online fp8, else bfloat16
        return GemmPlan("fp8" if model.dtype == "fp8" and "fp8" in tables.gemm else "bfloat16")
    what = f"{_NAMES[fmt]} {role_name(role)} GEMMs"
    rows = [d for d in GEMM_ROWS.get(fmt, ()) if d in tables.gemm]
    if fmt == "fp8" and rows[:1] == ["fp8_block"] and not block_fp8_rows_usable(tables):
        rows = rows[1:]
        if rows:
            floor = _floor_s(tables.gemm["fp8_block"]) * 1e3
            return GemmPlan(rows[0], 0.0, Part(what, ESTIMATED, f"per-tensor fp8 GEMM rows stand in: this release's "
                                               f"block-fp8 rows cost at least {floor:.0f} us a call, host time "
                                               f"outside a CUDA graph rather than the GPU's"))
    if rows and rows[0] == GEMM_ROWS[fmt][0]:
        return GemmPlan(rows[0], 0.0, Part(what, MEASURED, f"vLLM's {_ROWS[rows[0]]} GEMM rows"))
    if rows:
        return GemmPlan(rows[0], 0.0, Part(what, ESTIMATED, f"{_ROWS[rows[0]]} GEMM rows stand in: the tables "
                                           f"time no {_ROWS[GEMM_ROWS[fmt][0]]} GEMM on {gpu_name}"))
    kernel = "Marlin " if fmt in ("nvfp4", "mxfp4", "int4", "fp8_tensor", "fp8") else ""
    why = (f"vLLM runs them as {kernel}weight-only kernels on {gpu_name} ({_why_weight_only(fmt, gpu_name)}): "
           f"bfloat16 GEMM rows scaled by the roofline's ratio of weight bytes")
    return GemmPlan("bfloat16", model.linear_bytes(role), Part(what, ESTIMATED, why))


def _why_weight_only(fmt: str, gpu_name: str) -> str:
    if fmt in ("nvfp4", "mxfp4"):
        return "no FP4 tensor cores" if not gpu_name.startswith("B") else "the tables time no FP4 GEMM"
    if fmt in ("fp8", "fp8_tensor"):
        return "no fp8 tensor cores"
    return "4-bit weights, 16-bit multiplies"


def role_name(role: str) -> str:
    return {"attn": "attention", "mlp": "dense MLP", "shared": "shared-expert", "experts": "expert"}[role]


@dataclass(frozen=True, slots=True)
class MoePlan:
    """The experts' fused-MoE rows, their weight bytes, the experts' own, and the Part it makes."""

    table: str
    table_bytes: float
    weight_bytes: float
    part: Part | None = None


def moe_plan(tables, model, gpu_name: str) -> MoePlan | None:
    """The fused-MoE rows pricing the routed experts, or None when the tables time no fused MoE."""
    if not tables.moe:
        return None
    fmt = model.weight_format("experts")
    own = "fp8" if model.dtype == "fp8" else "bfloat16"
    wanted = MOE_ROWS.get(fmt, (own,)) if fmt else (own,)
    target = TABLE_BYTES[wanted[0]] if not fmt else model.linear_bytes("experts")
    fallback = ("int4", "bfloat16") if fmt in ("mxfp4", "nvfp4", "int4") else ("bfloat16",)
    found = next((d for d in (*wanted, *fallback) if d in tables.moe), None)
    if found is None:
        return None
    if found == wanted[0]:
        part = Part(f"{_NAMES[fmt]} experts", MEASURED, f"vLLM's {_ROWS[found]} fused-MoE rows") if fmt else None
        return MoePlan(found, TABLE_BYTES[found], TABLE_BYTES[found], part)
    what = f"{_NAMES[fmt] if fmt else _ROWS[own]} experts"
    why = (f"the tables time no {_ROWS[wanted[0]]} fused MoE on {gpu_name}: vLLM's {_ROWS[found]} rows "
           f"(the nearest kernel timed) scaled by the roofline's ratio of weight bytes")
    return MoePlan(found, TABLE_BYTES[found], target, Part(what, ESTIMATED, why))


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """Layers of one windowed kind: `count` of them read `window` keys at most; `rows`: the tables' rows timed
    with that window (else full-attention rows at min(context, window))."""

    kind: str
    count: int
    window: int
    rows: bool
    part: Part


def window_plans(tables, model, kv_table: str) -> list[WindowPlan]:
    out = []
    for kind, window in ((SLIDING, model.sliding_window), (CHUNKED, model.attention_chunk_size)):
        count = sum(model.layer_type(i) == kind for i in range(model.num_hidden_layers)) if window else 0
        if not count:
            continue
        timed = kind == SLIDING and all(
            (fam, kv_table, window) in tables.windowed
            and model.head_dim in tables.windowed[(fam, kv_table, window)].axes["head_dim"]
            for fam in ("context", "generation"))
        name = f"{'sliding-window' if kind == SLIDING else 'chunked-local'} attention ({count} layers, {window} tokens)"
        if timed:
            why = f"vLLM's attention rows timed with a {window}-token window"
        elif kind == SLIDING:
            why = (f"full-attention rows at min(context, {window}) keys: the tables time no {window}-token window "
                   f"at head_dim {model.head_dim}")
        else:
            why = (f"full-attention rows at min(context, {window}) keys: exact within the first chunk, an upper "
                   f"bound past it (a chunk reads its own tokens only)")
        out.append(WindowPlan(kind, count, window, timed, Part(name, MEASURED, why)))
    return out


def kv_table_dtype(tables, kv_cache_dtype: str) -> str:
    kv = KV_TABLE_DTYPE.get(kv_cache_dtype, "fp8")
    return kv if kv in tables.generation else "bfloat16"


def mla_gemm(tables, model) -> tuple[str, Part | None]:
    """The MLA module rows' GEMM dtype for the model's attention weights, and the Part when they stand in."""
    fmt = model.weight_format("attn")
    timed = {key[2] for key in tables.mla}
    if fmt == "fp8" or not fmt:
        return ("fp8_block" if fmt else "bfloat16"), None
    use = "fp8_block" if "fp8_block" in timed else "bfloat16"
    return use, Part(f"{_NAMES[fmt]} attention (MLA module)", ESTIMATED,
                     f"the tables time the MLA module with {_ROWS[use]} GEMMs only")


def pricing_parts(tables, model, gpu_name: str, kv_cache_dtype: str = "auto") -> list[Part]:
    """The parts of `model` priced otherwise than by plain bfloat16 or fp8 rows of its own shapes."""
    parts = []
    roles = ["attn"] if not model.mla else []
    roles += ["mlp"] if model.num_dense_layers else []
    roles += ["shared"] if model.moe and model.moe.shared_expert_intermediate_size else []
    for role in roles:
        plan = gemm_plan(tables, model, role, gpu_name)
        if plan.part is not None:
            parts.append(plan.part)
    if model.mla:
        part = mla_gemm(tables, model)[1]
        if part is not None:
            parts.append(part)
    if model.moe:
        plan = moe_plan(tables, model, gpu_name)
        if plan is not None and plan.part is not None:
            parts.append(plan.part)
    parts += [w.part for w in window_plans(tables, model, kv_table_dtype(tables, kv_cache_dtype))]
    return parts
