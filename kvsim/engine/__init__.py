"""The simulated serving engine: SimPy arrival and engine processes, the vLLM V1 scheduler and its
decode cohort, and the two KV-cache allocators (paged BlockManager, contiguous slabs)."""
