"""KV-cache sizing: bytes per token and per block for each kv_cache_dtype, the per-GPU memory
breakdown that yields the number of KV blocks, and prefill FLOPs (what a prefix-cache hit saves).

All figures are per GPU: weights are sharded over tensor parallelism as vLLM shards them
(`kvsim.perf.weights`) and so are KV heads (replicated once tp exceeds their number, as vLLM does);
a latent-attention (MLA) cache is whole on every rank. The KV cache is laid out in vLLM's KV cache
groups (`kvsim.perf.kv_groups`): one group of every layer for a model whose layers all keep the
whole context, several sharing one block pool for sliding-window models.

The breakdown follows vLLM v0.11.0 (`gpu_worker.determine_available_memory`, `memory_profiling`):

    KV = total * gpu_memory_utilization - weights - activation peak - non-torch memory

- total: what `torch.cuda.mem_get_info` reports (`GpuSpec.cuda_memory_gib`), a little below
  nvidia-smi's figure (H100: 79.18 GiB, not 79.65).
- activation peak: the profile run's, a forward pass of the policy's *effective* step budget
  (its max_num_batched_tokens, or max_model_len when chunking is off), then the sampler over
  min(budget, max_num_seqs) rows (`activation_estimate`; with vLLM's defaults on an H100, the
  sampler's 1024 rows dominate for 128k-vocabulary models).
- non-torch memory: what the process holds outside PyTorch's allocator, grown during start-up
  (cuBLAS workspaces, attention buffers; NCCL and the custom all-reduce buffers with tensor
  parallelism). vLLM's own logs print it: 0.32-0.35 GiB for Llama-3.1-8B on one H100 (V1,
  `non_torch_memory takes 0.35GiB`), 1.07-1.2 GiB for multi-GPU deployments. `NON_TORCH_GIB`.
- CUDA graphs are captured *after* the KV cache is allocated, from the headroom that
  (1 - gpu_memory_utilization) leaves: no term. The CUDA context is in neither figure.
- Blocks: KV // (page bytes * layers per group), the last partial block dropped; a page is one
  layer's block_size tokens of K and V (2 * block_size * kv_heads_per_gpu * head_dim * dtype
  bytes; MLA: block_size * (kv_lora_rank + qk_rope_head_dim) * dtype bytes). fp8 KV uses
  per-tensor scales (two floats per layer, not per token), so a block is exactly half a bf16
  block; `fp8_per_token` stores a float scale per token and head. MLA models run with the block
  size vLLM forces for them (64 on Hopper, `kv_groups.vllm_block_size`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.perf.kv_groups import SLIDING_SPEC, KvCacheLayout, kv_cache_layout, simulation_problem, vllm_block_size
from kvsim.perf.weights import weights_per_gpu
from kvsim.scenario.catalog import GPUS, GpuSpec, ModelSpec, tp_problem
from kvsim.scenario.layout import hardware_layout
from kvsim.scenario.limits import MAX_KV_BLOCKS, MAX_TENSOR_PARALLEL

from kvsim.scenario.defaults import engine_limits, max_model_len  # noqa: F401  (max_model_len: re-exported)

GiB = 2**30
KV_ELEM_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "int8": 1.0, "int4": 0.5}
QUANTIZED_KV = frozenset({"fp8", "fp8_e4m3", "int8", "int4"})
SCALE_BYTES = 4  # one float32 scale per token per KV head, for K and for V, where scales are per token
NON_TORCH_GIB = {False: 0.35, True: 1.1}  # vLLM's non-torch start-up memory, one GPU / tensor parallel
FUSED_MOE_CHUNK_SIZE = 16 * 1024  # vLLM's VLLM_FUSED_MOE_CHUNK_SIZE: tokens a fused-MoE call works on at once


def kv_elem_bytes(model: ModelSpec, kv_cache_dtype: str) -> float:
    if kv_cache_dtype == "auto":
        return model.activation_bytes  # the model's compute dtype: 16-bit, or 4 B for fp32 models
    try:
        return KV_ELEM_BYTES[kv_cache_dtype]
    except KeyError:
        raise KvsimError(f"kv_cache_dtype: unknown '{kv_cache_dtype}' "
                         f"(one of auto, {', '.join(KV_ELEM_BYTES)})") from None


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads a GPU keeps (MLA: its one latent vector)."""
    return 1 if model.mla else max(1, model.num_key_value_heads // tp)


def kv_elements_per_token(model: ModelSpec, tp: int = 1) -> int:
    """K and V elements (MLA: latent elements) one token stores on one GPU, over all layers."""
    if model.mla:
        return model.num_hidden_layers * model.mla.latent_dim
    return 2 * model.num_hidden_layers * kv_heads_per_gpu(model, tp) * model.head_dim


def _per_token_scales(kv_cache_dtype: str, per_token_scales: bool) -> bool:
    return kv_cache_dtype in QUANTIZED_KV and (per_token_scales or not kv_cache_dtype.startswith("fp8"))


def kv_bytes_per_token_layer(model: ModelSpec, kv_cache_dtype: str, tp: int = 1,
                             per_token_scales: bool = False) -> float:
    """Bytes one token takes in one layer's cache on one GPU. Quantized caches carry a float32 scale
    per token and head (int8, int4, and fp8 with `per_token_scales`); fp8 as vLLM uses per-tensor
    scales, which take no room in the blocks."""
    scale = SCALE_BYTES if _per_token_scales(kv_cache_dtype, per_token_scales) else 0
    elem = kv_elem_bytes(model, kv_cache_dtype)
    if model.mla:
        return model.mla.latent_dim * elem + scale
    return 2 * kv_heads_per_gpu(model, tp) * (model.head_dim * elem + scale)


def kv_bytes_per_token(model: ModelSpec, kv_cache_dtype: str, tp: int = 1, per_token_scales: bool = False) -> float:
    """Bytes of K and V one token takes on one GPU over all layers: every layer keeping the whole
    context (a sliding-window model's caches hold less: `kv_layout`)."""
    return model.num_hidden_layers * kv_bytes_per_token_layer(model, kv_cache_dtype, tp, per_token_scales)


def mha_bytes_per_token(model: ModelSpec, kv_cache_dtype: str, tp: int = 1) -> float:
    """What an MLA model's token would take on one GPU with multi-head attention instead: each head's key
    (qk_nope + qk_rope dims) and value (v_head_dim) in every layer, the heads split over TP."""
    heads = max(1, model.num_attention_heads // tp)
    return model.num_hidden_layers * heads * (model.head_dim + model.v_head_dim) * kv_elem_bytes(model, kv_cache_dtype)


def bytes_per_block(model: ModelSpec, kv_cache_dtype: str, block_size: int, tp: int = 1,
                    per_token_scales: bool = False) -> int:
    return math.ceil(kv_bytes_per_token(model, kv_cache_dtype, tp, per_token_scales) * block_size)


def kv_layout(model: ModelSpec, kv_cache_dtype: str, block_size: int, tp: int = 1, per_token_scales: bool = False,
              naive: bool = False) -> KvCacheLayout:
    """vLLM's KV cache groups for `model` on one GPU (`naive`: every layer keeping the whole context)."""
    page = math.ceil(block_size * kv_bytes_per_token_layer(model, kv_cache_dtype, tp, per_token_scales))
    return kv_cache_layout(model, page, block_size, naive)


def policy_layout(scenario, policy, model: ModelSpec, gpu: GpuSpec, naive: bool = False) -> KvCacheLayout:
    """A policy's layout at the block size vLLM runs the model with on this GPU. When no window is
    shorter than max_model_len, vLLM's groups hold what one group of every layer would, block for
    block: the layout is counted as that (the one kvsim's engine simulates)."""
    block = vllm_block_size(model, gpu.name, scenario.engine.block_size)
    args = (model, policy.kv_cache_dtype, block, scenario.hardware.tensor_parallel_size,
            policy.kv_cache_scales == "per_token")
    layout = kv_layout(*args, naive or policy.allocator == "contiguous")  # a slab keeps every layer whole
    windows = [g.window for g in layout.groups if g.window]
    if windows and min(windows) >= max_model_len(scenario, model):
        return kv_layout(*args, naive=True)
    return layout


def activation_estimate(model: ModelSpec, num_tokens: int, num_seqs: int, tp: int = 1) -> int:
    """Peak activation bytes of vLLM's profile run on one GPU: a forward pass of `T = num_tokens`
    tokens (the effective step budget) split over min(T, num_seqs) sequences, then the sampler.

    Only one layer's intermediates are alive at a time, so the peak is the biggest of them plus the
    buffers that live across layers:

        peak = max(T * 3 * intermediate/tp * a,                    # MLP: gate_up out, silu_and_mul out
                   T' * top_k * (max(2 * moe_inter/tp, hidden) + moe_inter/tp) * a,  # fused MoE, T' <= 16k
                   T * (q_heads/tp + 2 * kv_heads/tp) * head_dim * a,  # fused qkv projection
                   min(T, num_seqs) * vocab * (a + 8))             # sampler: logits, fp32 copy, fp32 probs
               + 2 * T * hidden * a                                # hidden states and residual

    with `a` the activation dtype size (2 B, or 4 B for fp32 models). vLLM's fused SiLU-and-multiply
    reads the gate/up output (2 x intermediate) while it writes its own (1 x), so both are alive. The
    sampler holds the logits in the model dtype, their float32 copy and float32 probabilities at
    once; with tensor parallelism every rank gathers the whole vocabulary. MLA's prefill expands the
    latent into per-head K and V (q_heads x (2 x qk head + v head) in place of the qkv term). Check
    against vLLM's own log for Llama-3.1-8B on an H100 (8192 tokens, 1024 sequences): "PyTorch activation peak memory
    takes 1.21GiB" / "1.24GiB"; this gives 1024 x 128256 x 10 B + 2 x 8192 x 4096 x 2 B = 1.35 GiB.
    """
    t, a = num_tokens, model.activation_bytes
    q_heads = max(1, model.num_attention_heads // tp)
    mlp = t * 3 * math.ceil(model.intermediate_size / tp) * a if model.num_dense_layers else 0
    if model.mla:  # prefill expands the latent into per-head K (nope + rope) and V
        qkv = t * q_heads * (2 * model.head_dim + model.v_head_dim) * a
    else:
        qkv = t * (q_heads + 2 * kv_heads_per_gpu(model, tp)) * model.head_dim * a
    logits = min(t, num_seqs) * model.vocab_size * (a + 8)
    return max(mlp, _moe_activations(model, t, tp), qkv, logits) + 2 * t * model.hidden_size * a


def _moe_activations(model: ModelSpec, num_tokens: int, tp: int) -> int:
    """vLLM's fused-MoE workspaces for a chunk of up to VLLM_FUSED_MOE_CHUNK_SIZE tokens, each routed
    to top_k experts: the gate_up output (or the down output, if wider) and the activation's output."""
    if not model.moe:
        return 0
    rows = min(num_tokens, FUSED_MOE_CHUNK_SIZE) * model.moe.num_experts_per_tok
    inter = math.ceil(model.moe.moe_intermediate_size / tp)
    return rows * (max(2 * inter, model.hidden_size) + inter) * model.activation_bytes


@dataclass(slots=True, frozen=True)
class KvCapacity:
    """Per-GPU memory breakdown in bytes: budget = weights + activations + reserve + kv (reserve:
    the non-torch memory)."""

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
    windows: tuple[int, ...] = ()  # each KV cache group's sliding window (0: whole context); () one full group

    def rows(self) -> list[tuple[str, float]]:
        return [
            ("GPU memory", self.total),
            ("usable (gpu_memory_utilization)", self.budget),
            ("weights", self.weights),
            ("activations", self.activations),
            ("non-torch memory", self.reserve),
            ("KV cache", self.kv),
            ("KV in whole blocks", self.num_blocks * self.bytes_per_block),
        ]


def compute_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec, limits=None, hybrid: bool = True) -> KvCapacity:
    """The breakdown, unchecked: kv may be negative and num_blocks zero (see kv_capacity). Blocks are
    those of vLLM's shared pool (`policy_layout`): one page in each layer of a group. `limits`: the
    policy's engine_limits, when the caller has them; `hybrid=False`: vLLM's hybrid KV cache manager
    off (every layer keeps the whole context in one group), as it is under a KV connector."""
    hw, engine = scenario.hardware, scenario.engine
    tp, dp = hw.tensor_parallel_size, hw.data_parallel_size
    limits = limits or engine_limits(scenario, policy, model, gpu)
    total = gpu.cuda_memory_gib * GiB
    budget = total * hw.gpu_memory_utilization
    weights = weights_per_gpu(model, tp, dp, hw.enable_expert_parallel).total
    activations = (engine.activation_reserve_gib * GiB if engine.activation_reserve_gib is not None
                   else float(activation_estimate(model, limits.step_budget, limits.max_num_seqs, tp)))
    reserve = (engine.fixed_reserve_gib if engine.fixed_reserve_gib is not None else NON_TORCH_GIB[tp * dp > 1]) * GiB
    kv = budget - weights - activations - reserve
    layout = policy_layout(scenario, policy, model, gpu, naive=not hybrid)
    num_blocks = layout.num_blocks(kv)
    return KvCapacity(total, budget, weights, activations, reserve, kv, layout.block_bytes, num_blocks,
                      layout.block_size, layout.tokens(num_blocks), layout_windows(layout))


def layout_windows(layout: KvCacheLayout) -> tuple[int, ...]:
    """Each group's sliding window (0: it keeps the whole context), or () when none has a window:
    what the engine's allocator needs to know of the layout (kvsim.engine.hybrid)."""
    windows = tuple(g.window if g.spec == SLIDING_SPEC else 0 for g in layout.groups)
    return windows if any(windows) else ()


def check_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec, cap: KvCapacity) -> None:
    """Raise KvsimError (one line) when the KV cache is empty or cannot hold one max_model_len sequence
    (vLLM's start-up check: the bytes such a request needs in every layer, `max_memory_usage_bytes`)."""
    hw, src = scenario.hardware, scenario.source
    util, at = hw.gpu_memory_utilization, hardware_layout(hw)
    on_gpu = f"{gpu.name} ({gpu.cuda_memory_gib:.1f} GiB × {util:.2f} = {cap.budget / GiB:.1f} GiB)"
    if cap.weights >= cap.budget:
        raise KvsimError(f"{src}: model {model.name} ({cap.weights / GiB:.1f} GiB of weights per GPU at {at}) "
                         f"does not fit on {on_gpu}: raise hardware.tensor_parallel_size or pick a larger GPU")
    if cap.kv <= 0:
        raise KvsimError(f"{src}: model {model.name} leaves no room for the KV cache on {on_gpu} at {at}: "
                         f"{cap.weights / GiB:.1f} GiB weights + {cap.activations / GiB:.1f} GiB activations + "
                         f"{cap.reserve / GiB:.1f} GiB non-torch: raise hardware.tensor_parallel_size or "
                         f"hardware.gpu_memory_utilization, or lower engine.max_num_batched_tokens")
    limits = engine_limits(scenario, policy, model, gpu)
    layout = policy_layout(scenario, policy, model, gpu)
    needed = layout.max_memory_usage_bytes(limits.max_model_len, limits.max_num_batched_tokens)
    if cap.num_blocks * cap.bytes_per_block < needed:
        raise KvsimError(f"{src}: policy {policy.name}: the KV cache holds {cap.max_tokens} tokens "
                         f"({cap.kv / GiB:.1f} GiB, kv_cache_dtype {policy.kv_cache_dtype}) on {gpu.name} at {at}, "
                         f"fewer than max_model_len {limits.max_model_len}: lower engine.max_model_len, raise "
                         f"hardware.tensor_parallel_size or hardware.gpu_memory_utilization")


def kv_capacity(scenario, policy, model: ModelSpec, gpu: GpuSpec, limits=None,
                simulate: bool = True, hybrid: bool = True) -> KvCapacity:
    """The checked breakdown; `simulate`: the engine must also be able to simulate the layout;
    `hybrid`: as compute_capacity's."""
    if simulate:
        check_simulable(scenario, policy, model, gpu, hybrid)
    cap = compute_capacity(scenario, policy, model, gpu, limits, hybrid)
    check_capacity(scenario, policy, model, gpu, cap)
    return cap


def check_simulable(scenario, policy, model: ModelSpec, gpu: GpuSpec, hybrid: bool = True) -> None:
    """One line when kvsim's engine cannot simulate the policy's KV cache layout as vLLM runs it."""
    problem = simulation_problem(model, policy_layout(scenario, policy, model, gpu, naive=not hybrid), gpu.name,
                                 scenario.engine.block_size, scenario.engine.preemption_mode)
    if problem:
        raise KvsimError(f"{scenario.source}: {problem}")


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


def check_fits(scenario, model: ModelSpec, gpu: GpuSpec, policies, simulate: bool = True) -> None:
    """`kv_capacity` for each policy, as `run` and `memory` check before anything else. A model that
    does not fit raises the one-line error with the smallest tensor_parallel_size (or GPU preset)
    that would fit; a KV cache over MAX_KV_BLOCKS blocks (all replicas) is refused too. `simulate`:
    also refuse, in one line, a KV cache layout kvsim's engine cannot simulate exactly yet
    (`kv_groups.simulation_problem`)."""
    if simulate:
        for p in policies:
            check_simulable(scenario, p, model, gpu)
    try:
        caps = [kv_capacity(scenario, p, model, gpu, simulate=False) for p in policies]
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
                kv_capacity(trial, p, model, gpu, simulate=False)
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
