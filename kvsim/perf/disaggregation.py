"""A disaggregated deployment sized: each pool's KV capacity, and what a transfer moves per block.

`disaggregation(scenario, policy)` checks the layout as vLLM v0.11.0 would refuse it, each problem in
one line naming its key: a pool whose model does not fit its GPU at its tensor parallelism, a pool
whose KV cache cannot hold one max_model_len request (vLLM's start-up check, on both instances), a
decode pool whose tensor parallelism is not a multiple of the prefill pool's (the NixlConnector has
every decode rank read its share of one prefill rank's KV heads: "Decode TP cannot be smaller than
prefill TP"), pools whose KV blocks differ in size of tokens (MLA's block size is the GPU's), and
asynchronous scheduling: the pools are scheduled synchronously, as v0.11.0 schedules by default
(kvsim's fused decode runs model an arrival during a step as the AsyncScheduler sees it, and a
decode instance's arrivals are KV hand-offs, not queued requests).

Bytes. A transfer moves whole blocks (NIXL reads one descriptor per block and layer): each decode
rank reads `decode block bytes` per block, its KV heads' share at the decode pool's tensor
parallelism (an MLA latent whole on every rank), from the prefill rank holding them. With decode TP
= r x prefill TP, one prefill rank serves r decode ranks, so its link, the busiest, carries r times a
decode rank's bytes; the bytes crossing all links are decode TP x a decode rank's. vLLM turns its
hybrid KV cache manager off whenever a KV connector is configured, so every layer's KV is moved and
kept whole: a sliding-window model's pools are sized and allocated as one group of every layer (its
aggregated policies keep vLLM's hybrid groups).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.perf.memory import KvCapacity, check_fits, kv_capacity
from kvsim.scenario.catalog import GpuSpec, ModelSpec, gpu_spec, model_spec
from kvsim.scenario.defaults import EngineLimits, engine_limits
from kvsim.scenario.disaggregation import ROLES, in_pool, link_spec, pool_view
from kvsim.scenario.links import LinkSpec

RELEASE = "vLLM v0.11.0, NixlConnector"


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool: the scenario and policy it runs, its model, GPU, limits and KV capacity per instance."""

    role: str
    scenario: object
    policy: object
    model: ModelSpec
    gpu: GpuSpec
    limits: EngineLimits
    capacity: KvCapacity

    @property
    def num_replicas(self) -> int:
        return self.scenario.hardware.num_replicas

    @property
    def tensor_parallel_size(self) -> int:
        return self.scenario.hardware.tensor_parallel_size


@dataclass(frozen=True, slots=True)
class Disaggregation:
    """Both pools, the link, and the bytes a block of KV puts on it."""

    prefill: Pool
    decode: Pool
    link: LinkSpec
    kv_transfer: str  # "whole_request" or "layerwise"
    rank_bytes_per_block: int  # what one decode rank reads per block
    link_bytes_per_block: int  # what the busiest GPU link carries per block (a prefill rank's)
    total_bytes_per_block: int  # over every link: decode TP x a rank's

    @property
    def tp_ratio(self) -> int:
        return self.decode.tensor_parallel_size // self.prefill.tensor_parallel_size

    def transfer_s(self, num_blocks: int) -> float:
        """Seconds a transfer of `num_blocks` blocks takes on an idle link."""
        return self.link.transfer_s(num_blocks * self.link_bytes_per_block)

    def describe(self) -> dict:
        return {"release": RELEASE, "kv_transfer": self.kv_transfer,
                "link": {"preset": self.link.name, "bandwidth_gbps": self.link.bandwidth_gbps,
                         "latency_us": self.link.latency_us, "overhead_us": self.link.overhead_us,
                         "source": self.link.source},
                "bytes_per_block": {"decode_rank": self.rank_bytes_per_block, "busiest_link": self.link_bytes_per_block,
                                    "all_links": self.total_bytes_per_block}}


def pool(scenario, policy, role: str, simulate: bool = True) -> Pool:
    """The `role` pool of the scenario for `policy`, checked (one line naming the pool's key)."""
    view, pol = pool_view(scenario, policy, role)
    model = in_pool(role, model_spec, view)
    gpu = in_pool(role, gpu_spec, view)
    in_pool(role, check_fits, view, model, gpu, [pol], simulate)
    limits = engine_limits(view, pol, model, gpu)
    capacity = in_pool(role, kv_capacity, view, pol, model, gpu, limits, simulate, False)  # hybrid manager off
    return Pool(role, view, pol, model, gpu, limits, capacity)


def pool_basis(pool: Pool):
    """Whether the pool's step prices are measured or estimated, and why (kvsim.perf.basis)."""
    from kvsim.perf.basis import pricing_basis

    return pricing_basis(pool.scenario, pool.model, pool.gpu)


def combined_basis(bases: dict):
    """One label for several pools' (or [hardware]'s) bases, by name: estimated when any is (naming
    which, the first such), else measured (naming each when their reasons differ)."""
    from dataclasses import replace

    named = [(name, b) for name, b in bases.items() if b is not None]
    estimated = [(name, b) for name, b in named if b.estimated]
    if estimated:
        name, b = estimated[0]
        return replace(b, why=f"{name}: {b.why}") if len(named) > 1 else b
    whys = dict.fromkeys(b.why for _, b in named)
    if len(whys) == 1:
        return named[0][1]
    return replace(named[0][1], why="; ".join(f"{name}: {b.why}" for name, b in named))


def disaggregation(scenario, policy, simulate: bool = True) -> Disaggregation:
    """The policy's disaggregated deployment, checked; see the module docstring."""
    src = scenario.source
    if scenario.engine.async_scheduling:
        raise KvsimError(f"{src}: engine.async_scheduling: a disaggregated policy is scheduled synchronously, as "
                         f"{RELEASE} serves it (serve it aggregated, or leave the key unset)")
    prefill, decode = (pool(scenario, policy, role, simulate) for role in ROLES)
    tp_p, tp_d = prefill.tensor_parallel_size, decode.tensor_parallel_size
    if tp_d % tp_p:
        raise KvsimError(f"{src}: disaggregation.decode.tensor_parallel_size: {tp_d} is not a multiple of the "
                         f"prefill pool's {tp_p} ({RELEASE}: each decode rank reads its KV heads from one prefill "
                         "rank; decode TP cannot be smaller than prefill TP)")
    if prefill.capacity.block_size != decode.capacity.block_size:
        raise KvsimError(f"{src}: disaggregation.decode.gpu: {decode.gpu.name} runs {decode.model.name} with "
                         f"{decode.capacity.block_size}-token KV blocks, {prefill.gpu.name} with "
                         f"{prefill.capacity.block_size} ({RELEASE} moves blocks of one size)")
    rank = decode.capacity.bytes_per_block
    return Disaggregation(prefill, decode, link_spec(scenario), scenario.disaggregation.kv_transfer, rank,
                          rank * (tp_d // tp_p), rank * tp_d)
