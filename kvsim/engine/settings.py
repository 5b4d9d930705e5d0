"""One policy's engine, resolved once: the frozen record the engine takes instead of the scenario.

`engine_settings` reads the scenario, the policy and its resolved limits (kvsim.scenario.defaults:
vLLM's defaults for the GPU) once per policy; the allocator, scheduler, router and backends of
every replica take the same `EngineSettings`. Each rule has one home: vLLM's defaults and the step
budget in kvsim.scenario.defaults, the prefix-caching switch in `Scenario.prefix_caching`, the host
blocks of swap space here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.scenario.defaults import step_budget

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineSettings:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int  # the chunk budget as configured (or vLLM's default)
    max_model_len: int
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # or "swap"
    num_host_blocks: int = 0  # swap space, in KV blocks
    allocator: str = "paged"  # a name in kvsim.engine.replica.ALLOCATORS
    enable_prefix_caching: bool = True
    contiguous_reserve: str = "max_model_len"  # the contiguous allocator's slab: or "known_output"
    num_replicas: int = 1
    router: str = "least_loaded"  # a name in kvsim.engine.router.ROUTERS
    # A windowed KV cache (kvsim.perf.kv_groups): each KV cache group's sliding window, 0 where the
    # group keeps the whole context; () when one group of full attention holds every layer.
    kv_windows: tuple[int, ...] = ()
    async_scheduling: bool = False  # a request arriving during a step first runs a step later (vLLM's AsyncScheduler)
    speculation: object = None  # a kvsim.perf.speculative.SpecPlan: the policy's speculative decoding (None: none)
    step_budget: int = field(init=False)  # tokens one step may schedule (kvsim.scenario.defaults.step_budget)

    def __post_init__(self):
        object.__setattr__(self, "step_budget", step_budget(self.max_num_batched_tokens, self.max_model_len,
                                                            self.enable_chunked_prefill))


def engine_settings(scenario, policy, limits, bytes_per_block: int, kv_windows: tuple = (),
                    async_default: bool = False, speculation=None) -> EngineSettings:
    """The policy's engine: `limits` from kvsim.scenario.defaults.engine_limits, `bytes_per_block`
    of the policy's KV cache (for the swap space in blocks), `kv_windows` its groups' windows;
    `async_default`: whether the priced release schedules asynchronously by default
    (engine.async_scheduling unset)."""
    engine, hw = scenario.engine, scenario.hardware
    return EngineSettings(
        block_size=engine.block_size, max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens, max_model_len=limits.max_model_len,
        enable_chunked_prefill=limits.enable_chunked_prefill, preemption_mode=engine.preemption_mode,
        num_host_blocks=int(engine.swap_space * GIB // bytes_per_block), allocator=policy.allocator,
        enable_prefix_caching=scenario.prefix_caching(policy), contiguous_reserve=policy.contiguous_reserve,
        num_replicas=hw.num_replicas * hw.data_parallel_size,  # every data-parallel rank is an engine
        router=hw.router, kv_windows=kv_windows,
        async_scheduling=async_default if engine.async_scheduling is None else engine.async_scheduling,
        speculation=speculation)
