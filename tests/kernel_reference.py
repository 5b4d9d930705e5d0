"""Float64 torch references for the Triton kernel tests: paged attention by explicit gathering.

Plain loops over sequences and heads, written for clarity rather than speed, sharing nothing with
the kernels but the cache layout: slot = block_tables[s, pos // block_size] * block_size + pos % block_size.
"""

from __future__ import annotations

import torch


def gather_context(cache_f64: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """(context_len, num_kv_heads, head_dim) of one sequence from a (blocks, block_size, heads, dim) cache."""
    block_size = cache_f64.shape[1]
    pos = torch.arange(context_len)
    blocks = block_table.long()[pos // block_size]
    return cache_f64[blocks, pos % block_size]


def attention_reference(q: torch.Tensor, k_f64: torch.Tensor, v_f64: torch.Tensor, block_tables: torch.Tensor,
                        context_lens: list[int], q_lens: list[int], scale: float) -> torch.Tensor:
    """Packed q (sum(q_lens), num_q_heads, head_dim): query i of sequence s sits at position
    context_lens[s] - q_lens[s] + i and sees cache positions [0, that position]."""
    num_heads = q.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    start = 0
    for s, (ctx, q_len) in enumerate(zip(context_lens, q_lens)):
        keys = gather_context(k_f64, block_tables[s], ctx)
        values = gather_context(v_f64, block_tables[s], ctx)
        group = num_heads // keys.shape[1]
        for i in range(q_len):
            pos = ctx - q_len + i
            for h in range(num_heads):
                scores = keys[: pos + 1, h // group] @ q[start + i, h].double() * scale
                out[start + i, h] = torch.softmax(scores, 0) @ values[: pos + 1, h // group]
        start += q_len
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||out - ref|| / ||ref||; NaN anywhere in out gives inf."""
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()
