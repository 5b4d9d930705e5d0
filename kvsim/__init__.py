"""kvsim: replay LLM request arrivals against KV-cache policies and report latency, throughput and memory.

Read a request's path in this order: config (scenario TOML) -> workload/traces (requests) ->
simulator (SimPy arrival + engine processes) -> scheduler (vLLM V1 semantics) -> block_manager /
contiguous (allocators) -> backends.analytic or backends.triton_engine (step time) -> metrics -> report.
"""

__version__ = "0.1.0"
