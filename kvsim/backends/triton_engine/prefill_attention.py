"""Paged prefill attention for packed variable-length chunks over a cached prefix (chunked prefill).

The new tokens' KV is already in the cache. New token i of sequence s sits at position
context_lens[s] - q_len_s + i and attends to cache positions [0, position]: full attention over the
earlier context (an earlier chunk or a prefix-cache hit) and causal attention within the chunk. One
program per (tile of BLOCK_Q new tokens, sequence, KV head) stacks the GROUP query heads of that KV
head under each token, so a tile's rows are BLOCK_Q * GROUP (token, head) pairs that share every K/V
load. Keys every row of the tile may see run without the causal mask; the diagonal band runs with it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvsim.backends.triton_engine.kv_quant import (DOT_F32, KV_KIND, LayerKVCache, attend_tile, attention_args,
                                             check_cache, load_kv_tile)

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, cu_seqlens_q_ptr, context_lens_ptr,
                    out_ptr, qk_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, num_kv_heads,
                    GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KIND: tl.constexpr, USE_F32: tl.constexpr):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    PACK: tl.constexpr = 1 if KIND == 0 else 2  # quantized: even/odd element pairs
    DP: tl.constexpr = HEAD_DIM // PACK
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len:
        return
    prefix = tl.load(context_lens_ptr + seq) - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DP)
    tok_q = tile * BLOCK_Q + offs_m // GROUP_P  # index of the row's token within the chunk
    heads = kv_head * GROUP + offs_m % GROUP_P
    row_mask = (tok_q < q_len) & (offs_m % GROUP_P < GROUP)
    pos = prefix + tok_q  # the row's position in its sequence
    q_off = (q_start + tok_q).to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * PACK
    q = tl.load(q_ptr + q_off, mask=row_mask[:, None], other=0.0)
    q_odd = q
    acc = tl.zeros((BLOCK_M, DP), dtype=tl.float32)
    acc_odd = acc
    if KIND != 0:
        q = q.to(tl.float16)  # the dot dtype of quantized caches
        q_odd = tl.load(q_ptr + q_off + 1, mask=row_mask[:, None], other=0.0).to(tl.float16)
        acc_odd = tl.zeros((BLOCK_M, DP), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_pos = prefix + tile * BLOCK_Q
    kv_end = prefix + tl.minimum(tile * BLOCK_Q + BLOCK_Q, q_len)  # one past the tile's last position
    full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # every row sees the keys before this
    for n0 in range(0, full_end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        k, v, k_scale, v_scale = load_kv_tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tok, tok < full_end, kv_head,
                                              num_kv_heads, DP, BLOCK_SIZE, KIND)
        acc, acc_odd, m_i, l_i = attend_tile(acc, acc_odd, m_i, l_i, q, q_odd, k, v, k_scale, v_scale, None,
                                             qk_scale, KIND, False, USE_F32)
    for n0 in range(full_end, kv_end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        k, v, k_scale, v_scale = load_kv_tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tok, tok < kv_end, kv_head,
                                              num_kv_heads, DP, BLOCK_SIZE, KIND)
        causal = tok[None, :] <= pos[:, None]
        acc, acc_odd, m_i, l_i = attend_tile(acc, acc_odd, m_i, l_i, q, q_odd, k, v, k_scale, v_scale, causal,
                                             qk_scale, KIND, True, USE_F32)

    inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)[:, None]
    o_off = (q_start + tok_q).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * PACK
    tl.store(out_ptr + o_off, (acc * inv_l).to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    if KIND != 0:
        tl.store(out_ptr + o_off + 1, (acc_odd * inv_l).to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def _launch_config(cache: LayerKVCache, group_p: int) -> dict:
    """BLOCK_Q tokens x group_p query heads = 64 rows (bf16/fp16) or 128 rows (quantized) per program,
    tuned on an H100 (benchmarks/results/h100.md); head_dim 256 halves the key tile."""
    block_n = 64 if cache.head_dim <= 128 else 32
    if cache.kv_dtype in ("bfloat16", "float16"):
        return dict(BLOCK_Q=max(64 // group_p, 1), BLOCK_N=block_n, num_warps=4, num_stages=3)
    rows = 128 if cache.head_dim <= 128 else 64
    return dict(BLOCK_Q=max(rows // group_p, 1), BLOCK_N=block_n, num_warps=8, num_stages=3)


def paged_prefill_attention(q: torch.Tensor, cache: LayerKVCache, block_tables: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float, max_seqlen_q: int,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of packed new tokens q (total_new_tokens, num_q_heads, head_dim) over the cache."""
    total, num_heads, head_dim = q.shape
    num_kv_heads = cache.num_kv_heads
    check_cache(cache)
    assert q.stride(-1) == 1 and head_dim == cache.head_dim and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    num_seqs = cu_seqlens_q.numel() - 1
    if out is None:
        out = torch.empty_like(q)
    if total == 0 or num_seqs == 0:
        return out
    group_p = triton.next_power_of_2(group)
    config = _launch_config(cache, group_p)
    grid = (triton.cdiv(max_seqlen_q, config["BLOCK_Q"]), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q, *attention_args(cache), block_tables, cu_seqlens_q, context_lens, out, scale * LOG2E, q.stride(0),
        q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), num_kv_heads, GROUP=group,
        GROUP_P=group_p, HEAD_DIM=head_dim, BLOCK_SIZE=cache.block_size, KIND=KV_KIND[cache.kv_dtype],
        USE_F32=DOT_F32, **config)
    return out
