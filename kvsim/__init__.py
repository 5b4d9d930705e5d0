"""kvsim: replay LLM request arrivals against KV-cache policies and report latency, throughput and memory.

Read a request's path in this order: scenario.config (scenario TOML) -> scenario.workload/traces
(requests) -> engine.simulator (SimPy arrival + engine processes) -> engine.scheduler (vLLM V1
semantics) -> engine.block_manager / engine.contiguous (allocators) -> backends.analytic (with
perf.roofline) or backends.triton_engine (step time) -> results.metrics -> results.writer/report.
"""

__version__ = "0.1.0"
