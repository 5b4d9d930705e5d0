"""A disaggregated deployment as each of its pools sees it.

`pool_view(scenario, policy, role)` gives the scenario and policy one pool of the [disaggregation]
section runs: [hardware] becomes the pool's GPU, tensor parallelism, instance count, router and
memory share (the scenario's datasheet overrides apply only to a pool on hardware.gpu), and the
pool's engine limits replace the engine's and the policy's. Everything that sizes or prices an
aggregated deployment (engine limits, KV capacity, step prices) then sizes and prices a pool.
`pool_keys` names a pool's keys in the messages that name [hardware]'s.
"""

from __future__ import annotations

from dataclasses import fields

from kvsim.errors import KvsimError
from kvsim.scenario.catalog import GpuSpec
from kvsim.scenario.links import LINKS, LinkSpec

ROLES = ("prefill", "decode")
DEFAULT_ROUTERS = {"prefill": "prefix_affinity", "decode": "most_free_blocks"}
# [hardware] keys that override a GPU preset's datasheet figures
_DATASHEET = tuple(f.name for f in fields(GpuSpec) if f.name not in ("name", "cuda_memory_gib", "num_sms"))


def pool_view(scenario, policy, role: str):
    """(scenario, policy) as the `role` pool runs them."""
    pool, hw = getattr(scenario.disaggregation, role), scenario.hardware
    gpu = pool.gpu or hw.gpu
    hardware = {"gpu": gpu, "tensor_parallel_size": pool.tensor_parallel_size or hw.tensor_parallel_size,
                "num_replicas": pool.num_replicas, "router": pool.router or DEFAULT_ROUTERS[role],
                "gpu_memory_utilization": pool.gpu_memory_utilization or hw.gpu_memory_utilization}
    if gpu.lower() != hw.gpu.lower():
        hardware.update({k: None for k in _DATASHEET if hasattr(hw, k)})
    engine = {k: getattr(pool, k) for k in ("max_num_seqs", "max_num_batched_tokens") if getattr(pool, k)}
    view = scenario.model_copy(update={"hardware": hw.model_copy(update=hardware),
                                       "engine": scenario.engine.model_copy(update=engine)})
    view.located(scenario.source, scenario.base_dir)
    if pool.max_num_batched_tokens:
        policy = policy.model_copy(update={"max_num_batched_tokens": pool.max_num_batched_tokens})
    return view, policy


def pool_keys(message: str, role: str) -> str:
    """A message about [hardware] or engine keys, as the `role` pool's keys."""
    return (message.replace("hardware.", f"disaggregation.{role}.")
            .replace("engine.max_num_batched_tokens", f"disaggregation.{role}.max_num_batched_tokens"))


def in_pool(role: str, check, *args):
    """`check(*args)`, its one-line error naming the pool's keys."""
    try:
        return check(*args)
    except KvsimError as exc:
        raise KvsimError(pool_keys(str(exc), role)) from None


def link_spec(scenario) -> LinkSpec:
    """The [disaggregation.link] preset with the section's overrides."""
    link = scenario.disaggregation.link
    spec = LINKS[link.preset]
    return LinkSpec(spec.name, link.bandwidth_gbps or spec.bandwidth_gbps,
                    spec.latency_us if link.latency_us is None else link.latency_us,
                    spec.overhead_us if link.overhead_us is None else link.overhead_us, spec.source)
