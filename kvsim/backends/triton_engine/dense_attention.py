"""The baseline the paged kernels are measured against: torch SDPA over dense per-sequence caches."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dense_decode_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q (batch, num_q_heads, 1, head_dim) over k, v (batch, num_kv_heads, seq, head_dim); GQA by enable_gqa."""
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
