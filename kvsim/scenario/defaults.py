"""vLLM's engine defaults, resolved once for a scenario's policy and GPU.

`EngineConfig.max_num_seqs` and `max_num_batched_tokens` left out (None) mean "what `vllm serve`
would use on this GPU" (vLLM v0.11.0, `EngineArgs._set_default_args`, OpenAI API server context):
on a GPU with at least 70 GiB of device memory whose name does not contain "a100", 8192 batched
tokens and 1024 sequences; otherwise 2048 and 256. `max_num_seqs` is then capped at the token
budget (`min(default, max_num_batched_tokens)`), as vLLM does when it sets the default. A policy's
own `max_num_batched_tokens` replaces the engine's. Without chunked prefill a whole prompt must fit
one step, so the step budget is at least `max_model_len` (vLLM's rule when chunking is off).

Every consumer (KV sizing, scheduler, triton backend, summary) takes these resolved values.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.scenario.catalog import GpuSpec, ModelSpec

LARGE_GPU_GIB = 70  # vLLM's threshold for the larger defaults (device memory)


@dataclass(slots=True, frozen=True)
class EngineLimits:
    max_num_seqs: int
    max_num_batched_tokens: int  # the chunk budget as configured (or vLLM's default)
    step_budget: int  # tokens one step may schedule: the budget, or at least max_model_len unchunked
    max_model_len: int
    enable_chunked_prefill: bool


def vllm_default_limits(gpu: GpuSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks on this GPU."""
    if gpu.cuda_memory_gib >= LARGE_GPU_GIB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


def step_budget(max_num_batched_tokens: int, max_model_len: int, enable_chunked_prefill: bool) -> int:
    """Tokens one step may schedule: the budget, or without chunked prefill at least max_model_len
    (a whole prompt must fit one step; vLLM raises the budget so when chunking is off)."""
    return max_num_batched_tokens if enable_chunked_prefill else max(max_num_batched_tokens, max_model_len)


def max_model_len(scenario, model: ModelSpec) -> int:
    return scenario.engine.max_model_len or model.max_position_embeddings


def engine_limits(scenario, policy, model: ModelSpec, gpu: GpuSpec) -> EngineLimits:
    engine = scenario.engine
    default_tokens, default_seqs = vllm_default_limits(gpu)
    tokens = policy.max_num_batched_tokens or engine.max_num_batched_tokens or default_tokens
    seqs = engine.max_num_seqs or min(default_seqs, tokens)
    mml = max_model_len(scenario, model)
    chunked = policy.enable_chunked_prefill
    return EngineLimits(seqs, tokens, step_budget(tokens, mml, chunked), mml, chunked)
