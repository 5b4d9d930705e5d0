"""Real GPU engine for the triton backend: paged KV cache, Triton attention kernels, model runner."""
