"""KV-cache sizing: bytes per token and per block for each kv_cache_dtype, the per-GPU memory
breakdown that yields the number of KV blocks, and prefill FLOPs (what a prefix-cache hit saves).

All figures are per GPU: weights and KV heads are sharded over tensor parallelism (KV heads are
replicated once tp exceeds their number, as vLLM does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.scenario.catalog import GPUS, GpuSpec, ModelSpec, tp_problem
from kvsim.scenario.limits import MAX_KV_BLOCKS, MAX_TENSOR_PARALLEL

GiB = 2**30
KV_ELEM_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "int8": 1.0, "int4": 0.5}
QUANTIZED_KV = frozenset({"fp8", "fp8_e4m3", "int8", "int4"})
SCALE_BYTES = 4  # one float32 scale per token per KV head, for K and for V


def kv_elem_bytes(model: ModelSpec, kv_cache_dtype: str) -> float:
    if kv_cache_dtype == "auto":
        return model.activation_bytes  # the model's compute dtype: 16-bit, or 4 B for fp32 models
    try:
        return KV_ELEM_BYTES[kv_cache_dtype]
    except KeyError:
        raise KvsimError(f"kv_cache_dtype: unknown '{kv_cache_dtype}' "
                         f"(one of auto, {', '.join(KV_ELEM_BYTES)})") from None


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    return max(1, model.num_key_value_heads // tp)


def kv_elements_per_token(model: ModelSpec, tp: int = 1) -> int:
    """K and V elements one token stores on one GPU, over all layers."""
    return 2 * model.num_hidden_layers * kv_heads_per_gpu(model, tp) * model.head_dim


def kv_bytes_per_token(model: ModelSpec, kv_cache_dtype: str, tp: int = 1) -> float:
    """Bytes of K and V one token takes on one GPU, over all layers, scales included."""
    scale = SCALE_BYTES if kv_cache_dtype in QUANTIZED_KV else 0
    per_head = model.head_dim * kv_elem_bytes(model, kv_cache_dtype) + scale
    return 2 * model.num_hidden_layers * kv_heads_per_gpu(model, tp) * per_head


def bytes_per_block(model: ModelSpec, kv_cache_dtype: str, block_size: int, tp: int = 1) -> int:
    return math.ceil(kv_bytes_per_token(model, kv_cache_dtype, tp) * block_size)


def max_model_len(scenario, model: ModelSpec) -> int:
    return scenario.engine.max_model_len or model.max_position_embeddings


def activation_estimate(model: ModelSpec, engine, tp: int = 1) -> int:
    """Peak activation bytes of one forward pass of `T = engine.max_num_batched_tokens` tokens on one GPU.

    Only one layer's intermediates are alive at a time, so the peak is the biggest of them plus the
    buffers that live across layers:

        peak = max(T * 2 * intermediate/tp * a,                    # MLP gate and up outputs
                   T * (q_heads/tp + 2 * kv_heads/tp) * head_dim * a,  # fused qkv projection
                   min(T, max_num_seqs) * vocab * 4)               # fp32 logits of the sampled rows
               + 2 * T * hidden * a                                # hidden states and residual

    with `a` the activation dtype size (2 B, or 4 B for fp32 models).
    """
    t, a = engine.max_num_batched_tokens, model.activation_bytes
    mlp = t * 2 * math.ceil(model.intermediate_size / tp) * a
    q_heads = max(1, model.num_attention_heads // tp)
    qkv = t * (q_heads + 2 * kv_heads_per_gpu(model, tp)) * model.head_dim * a
    logits = min(t, engine.max_num_seqs) * model.vocab_size * 4
    return max(mlp, qkv, logits) + 2 * t * model.hidden_size * a


@dataclass(slots=True, frozen=True)
class KvCapacity:
    """Per-GPU memory breakdown in bytes: budget = weights + activations + reserve + kv."""

    total: float
    budget: float
    weights: float
    activations: float
    reserve: float
    kv: float
    bytes_per_block: int
    num_blocks: int
    block_size: int
    max_tokens: int

    def rows(self) -> list[tuple[str, float]]:
        return [
            ("GPU memory", self.total),
            ("usable (gpu_memory_utilization)", self.budget),
            ("weights", self.weights),
            ("activations", self.activations),
            ("fixed reserve", self.reserve),
            ("KV cache", self.kv),
            ("KV in whole blocks", self.num_blocks * self.bytes_per_block),
        ]


def compute_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec) -> KvCapacity:
    """The breakdown, unchecked: kv may be negative and num_blocks zero (see kv_capacity)."""
    hw, engine = scenario.hardware, scenario.engine
    tp = hw.tensor_parallel_size
    total = gpu.memory_gib * GiB
    budget = total * hw.gpu_memory_utilization
    weights = model.weight_bytes / tp
    activations = (engine.activation_reserve_gib * GiB if engine.activation_reserve_gib is not None
                   else float(activation_estimate(model, engine, tp)))
    reserve = engine.fixed_reserve_gib * GiB
    kv = budget - weights - activations - reserve
    bpb = bytes_per_block(model, policy.kv_cache_dtype, engine.block_size, tp)
    num_blocks = max(0, int(kv // bpb))
    return KvCapacity(total, budget, weights, activations, reserve, kv, bpb, num_blocks,
                      engine.block_size, num_blocks * engine.block_size)


def check_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec, cap: KvCapacity) -> None:
    """Raise KvsimError (one line) when the KV cache is empty or cannot hold one max_model_len sequence."""
    hw, src = scenario.hardware, scenario.source
    tp, util = hw.tensor_parallel_size, hw.gpu_memory_utilization
    on_gpu = f"{gpu.name} ({gpu.memory_gib:.1f} GiB × {util:.2f} = {cap.budget / GiB:.1f} GiB)"
    if cap.weights >= cap.budget:
        raise KvsimError(f"{src}: model {model.name} ({cap.weights / GiB:.1f} GiB of weights per GPU at tp={tp}) "
                         f"does not fit on {on_gpu}: raise hardware.tensor_parallel_size or pick a larger GPU")
    if cap.kv <= 0:
        raise KvsimError(f"{src}: model {model.name} leaves no room for the KV cache on {on_gpu} at tp={tp}: "
                         f"{cap.weights / GiB:.1f} GiB weights + {cap.activations / GiB:.1f} GiB activations + "
                         f"{cap.reserve / GiB:.1f} GiB reserve: raise hardware.tensor_parallel_size or "
                         f"hardware.gpu_memory_utilization, or lower engine.max_num_batched_tokens")
    max_len = max_model_len(scenario, model)
    if cap.num_blocks < math.ceil(max_len / cap.block_size):
        raise KvsimError(f"{src}: policy {policy.name}: the KV cache holds {cap.max_tokens} tokens "
                         f"({cap.kv / GiB:.1f} GiB, kv_cache_dtype {policy.kv_cache_dtype}) on {gpu.name} at tp={tp}, "
                         f"fewer than max_model_len {max_len}: lower engine.max_model_len, raise "
                         f"hardware.tensor_parallel_size or hardware.gpu_memory_utilization")


def kv_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec) -> KvCapacity:
    cap = compute_capacity(scenario, policy, model, gpu)
    check_capacity(scenario, policy, model, gpu, cap)
    return cap


def prefill_flops(model: ModelSpec, num_tokens: int, context_tokens: int = 0) -> float:
    """FLOPs (all GPUs together) to prefill `num_tokens` after `context_tokens` already in the cache."""
    pairs = num_tokens * context_tokens + num_tokens * (num_tokens + 1) // 2
    return model.gemm_flops(num_tokens, 1 if num_tokens else 0) + model.attention_flops(pairs)


def prefill_flops_saved(model: ModelSpec, cached_tokens: int, total_prompt_tokens: int) -> float:
    """FLOPs a prefix-cache hit of `cached_tokens` saves on a prompt of `total_prompt_tokens`:
    the projections of the cached tokens and the attention among them (the rest still attends to them)."""
    if not 0 <= cached_tokens <= total_prompt_tokens:
        raise ValueError(f"cached_tokens {cached_tokens} not in [0, {total_prompt_tokens}]")
    rest = total_prompt_tokens - cached_tokens
    return prefill_flops(model, total_prompt_tokens) - prefill_flops(model, rest, cached_tokens)


def check_fits(scenario, model: ModelSpec, gpu: GpuSpec, policies) -> None:
    """`kv_capacity` for each policy, as `run` and `memory` check before anything else. A model that
    does not fit raises the one-line error with the smallest tensor_parallel_size (or GPU preset)
    that would fit; a KV cache over MAX_KV_BLOCKS blocks (all replicas) is refused too."""
    try:
        caps = [kv_capacity(scenario, p, model, gpu) for p in policies]
    except KvsimError as exc:
        raise KvsimError(f"{exc}{_fit_hint(scenario, model, gpu, policies)}") from None
    replicas = scenario.hardware.num_replicas
    blocks = max((c.num_blocks for c in caps), default=0) * replicas
    if blocks > MAX_KV_BLOCKS:
        raise KvsimError(f"{scenario.source}: {replicas} replica(s) × {blocks // replicas:,} KV blocks is more than "
                         f"the {MAX_KV_BLOCKS:,} blocks kvsim simulates: raise engine.block_size, or lower "
                         f"hardware.num_replicas or hardware.memory_gib")


def smallest_tp(scenario, model: ModelSpec, gpu: GpuSpec, policies) -> int | None:
    """The smallest tensor_parallel_size vLLM accepts for `model` at which every policy fits on `gpu`."""
    for tp in range(1, min(model.num_attention_heads, MAX_TENSOR_PARALLEL) + 1):
        if tp_problem(model, tp):
            continue
        trial = scenario.model_copy(update={"hardware": scenario.hardware.model_copy(
            update={"tensor_parallel_size": tp})})
        try:
            for p in policies:
                kv_capacity(trial, p, model, gpu)
        except KvsimError:
            continue
        return tp
    return None


def _fit_hint(scenario, model: ModelSpec, gpu: GpuSpec, policies) -> str:
    tp = smallest_tp(scenario, model, gpu, policies)
    if tp is not None:
        return f" (the smallest tensor_parallel_size that fits: {tp})"
    for other in sorted(GPUS.values(), key=lambda g: g.memory_gib):
        tp = smallest_tp(scenario, model, other, policies)
        if tp is not None:
            return f" (no tensor_parallel_size fits on {gpu.name}; {other.name} fits at tensor_parallel_size {tp})"
    return " (no tensor_parallel_size fits on any GPU preset with these engine settings)"
