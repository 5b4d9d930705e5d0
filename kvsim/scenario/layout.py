"""How a deployment is named and what it costs, in one place: every line, table and record that names
a layout or prices it calls these.

A replica (one vLLM engine group, one `vllm serve`) takes tensor_parallel_size x data_parallel_size
GPUs: vLLM's DP attention ranks (`--data-parallel-size`) are GPUs of their own, with experts whole
per GPU under `--enable-expert-parallel` (EP adds no GPU). A deployment is `num_replicas` such
replicas; a policy served disaggregated runs on its prefill and decode pools instead (each pool:
instances x TP). `$/hour` is the GPU's hourly price (kvsim.scenario.catalog.gpu_price: the
scenario's [cost], else the presets) times every GPU so counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.scenario.catalog import gpu_price


def replica_gpus(tp: int, dp: int = 1) -> int:
    """GPUs one replica takes: TP x DP (expert parallelism shards over those same GPUs)."""
    return tp * dp


def hardware_gpus(hw) -> int:
    """Every GPU a [hardware] section (or a pool's) takes: TP x DP a replica, every replica."""
    return replica_gpus(hw.tensor_parallel_size, getattr(hw, "data_parallel_size", 1)) * hw.num_replicas


def layout_text(tp: int, dp: int = 1, ep: bool = False) -> str:
    """A replica's parallel layout as vLLM's flags set it: 'TP 4', 'TP 1 × DP 2 + EP', 'TP 2 + EP'."""
    return f"TP {tp}" + (f" × DP {dp}" if dp > 1 else "") + (" + EP" if ep else "")


def hardware_layout(hw) -> str:
    """`layout_text` of a [hardware] section (or anything with its three keys)."""
    return layout_text(hw.tensor_parallel_size, getattr(hw, "data_parallel_size", 1),
                       bool(getattr(hw, "enable_expert_parallel", False)))


def deployment_text(gpu: str, tp: int, replicas: int, dp: int = 1, ep: bool = False) -> str:
    """e.g. '12 × H100-SXM as TP 4 × 3 replicas', '2 × H100-SXM as TP 1 × DP 2 + EP × 1 replica'."""
    gpus = replica_gpus(tp, dp) * replicas
    return (f"{gpus} × {gpu} as {layout_text(tp, dp, ep)} × {replicas} "
            f"replica{'s' if replicas != 1 else ''}")


def hardware_text(hw) -> str:
    """`deployment_text` of a [hardware] section."""
    return deployment_text(hw.gpu, hw.tensor_parallel_size, hw.num_replicas, getattr(hw, "data_parallel_size", 1),
                           bool(getattr(hw, "enable_expert_parallel", False)))


def layout_flags(tp: int, dp: int = 1, ep: bool = False) -> list[str]:
    """The `vllm serve` flags of a replica's layout."""
    out = [f"--tensor-parallel-size {tp}"] if tp > 1 else []
    if dp > 1:
        out.append(f"--data-parallel-size {dp}")
    if ep:
        out.append("--enable-expert-parallel")
    return out


@dataclass(slots=True, frozen=True)
class HourlyCost:
    """What a deployment costs an hour: every GPU it holds at its price."""

    usd_per_hour: float
    num_gpus: int
    source: str  # where the price comes from (and its date)


def _source(price) -> str:
    return f"{price.source} ({price.date})".replace(" ()", "")


def hourly_cost(scenario, policy=None) -> HourlyCost | None:
    """$/hour of the scenario's deployment (TP × DP × replicas GPUs of hardware.gpu), or, for a
    `policy` served disaggregated, of its prefill and decode pools (instances × TP × DP each); None when a
    GPU has no price. The one source of the $/hour figure for the command line, plan files, reports
    and the dashboard."""
    hw = scenario.hardware
    parts = [(hw.gpu, hardware_gpus(hw))]
    if policy is not None and scenario.disaggregation is not None and scenario.disaggregated(policy):
        from kvsim.scenario.disaggregation import ROLES, pool_view

        pools = [pool_view(scenario, policy, role)[0].hardware for role in ROLES]
        parts = [(p.gpu, hardware_gpus(p)) for p in pools]
    prices = [gpu_price(scenario, gpu) for gpu, _ in parts]
    if any(price is None for price in prices):
        return None
    return HourlyCost(sum(price.usd_per_hour * n for price, (_, n) in zip(prices, parts)), sum(n for _, n in parts),
                      "; ".join(dict.fromkeys(_source(p) for p in prices)))


def layout_cost(scenario, gpu: str, gpus: int) -> HourlyCost | None:
    """$/hour of `gpus` GPUs of `gpu` (a searched layout: replicas × TP × DP), or None without a price."""
    price = gpu_price(scenario, gpu)
    return None if price is None else HourlyCost(price.usd_per_hour * gpus, gpus, _source(price))


# ---- what `vllm serve` can run

VLLM_KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3")  # of kvsim's, those vLLM's --kv-cache-dtype takes


def serve_problem(policy) -> str:
    """Why `vllm serve` cannot run this policy ('' when it can): kvsim compares settings vLLM has no
    flag for (the contiguous allocator, int8/int4 KV, per-token fp8 scales)."""
    if policy.allocator != "paged":
        return f"allocator {policy.allocator}: kvsim's comparison allocator, not one vllm serve runs"
    if policy.kv_cache_dtype not in VLLM_KV_DTYPES:
        return (f"kv_cache_dtype {policy.kv_cache_dtype}: not a --kv-cache-dtype of vLLM v0.11.0 "
                f"({', '.join(VLLM_KV_DTYPES)})")
    if policy.kv_cache_dtype.startswith("fp8") and policy.kv_cache_scales != "per_tensor":
        return "kv_cache_scales per_token: kvsim's triton kernels' fp8 scales; vLLM scales fp8 KV per tensor"
    return ""


def serve_flags(scenario, policy, tp: int, dp: int = 1, ep: bool = False) -> str:
    """The `vllm serve` flags of one replica: its layout, the policy's KV dtype, prefill and prefix
    caching, and the engine limits the scenario sets (what it leaves out is vLLM's default)."""
    engine, hw = scenario.engine, scenario.hardware
    out = layout_flags(tp, dp, ep)
    if policy.kv_cache_dtype != "auto":
        out.append(f"--kv-cache-dtype {policy.kv_cache_dtype}")
    if not policy.enable_chunked_prefill:
        out.append("--no-enable-chunked-prefill")
    tokens = policy.max_num_batched_tokens or engine.max_num_batched_tokens
    for flag, value in (("--max-model-len", engine.max_model_len), ("--max-num-seqs", engine.max_num_seqs),
                        ("--max-num-batched-tokens", tokens)):
        if value is not None:
            out.append(f"{flag} {value}")
    if engine.block_size != 16:
        out.append(f"--block-size {engine.block_size}")
    caching = engine.enable_prefix_caching if policy.enable_prefix_caching is None else policy.enable_prefix_caching
    if not caching:
        out.append("--no-enable-prefix-caching")
    if hw.gpu_memory_utilization != 0.9:
        out.append(f"--gpu-memory-utilization {hw.gpu_memory_utilization:g}")
    if engine.async_scheduling is not None:
        out.append("--async-scheduling" if engine.async_scheduling else "--no-async-scheduling")
    return " ".join(out)
