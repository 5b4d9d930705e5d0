"""Paged decode attention (one new query token per sequence) over a bf16/fp16/fp8/int8/int4 KV cache.

One program per (sequence, KV head, split) reads each K/V tile of its share of the context once and
serves all query heads of that KV head, which are the rows of the tl.dot (padded to 16). With more
than one split (flash-decoding), each split writes its partial output and log-sum-exp and a second
kernel merges them. Quantized tiles are unpacked into exact fp16 without scaling; K's scales multiply
the score columns and V's scales the probabilities (see kv_quant). Capturable in a CUDA graph when
num_splits is fixed: no host syncs, and the heuristic for num_splits=None reads shapes only.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvsim.backends.triton_engine.kv_quant import (DOT_F32, KV_KIND, LayerKVCache, attend_tile, attention_args,
                                             check_cache, load_kv_tile)
from kvsim.perf.roofline import decode_splits

LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
                   part_out_ptr, part_lse_ptr, qk_scale, stride_qs, stride_qh, stride_os, stride_oh,
                   stride_bt, num_kv_heads, num_splits, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                   KIND: tl.constexpr, SPLIT: tl.constexpr, USE_F32: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    PACK: tl.constexpr = 1 if KIND == 0 else 2  # quantized: even/odd element pairs
    DP: tl.constexpr = HEAD_DIM // PACK

    context_len = tl.load(context_lens_ptr + seq)
    split_len = tl.cdiv(tl.cdiv(context_len, num_splits), 16) * 16
    start = split * split_len
    end = tl.minimum(start + split_len, context_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, DP)
    h_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q_off = seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * PACK
    q = tl.load(q_ptr + q_off, mask=h_mask[:, None], other=0.0)  # (BLOCK_H, DP): all, or the even elements
    q_odd = q
    acc = tl.zeros((BLOCK_H, DP), dtype=tl.float32)
    acc_odd = acc
    if KIND != 0:
        q = q.to(tl.float16)  # the dot dtype of quantized caches
        q_odd = tl.load(q_ptr + q_off + 1, mask=h_mask[:, None], other=0.0).to(tl.float16)
        acc_odd = tl.zeros((BLOCK_H, DP), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        n_mask = tok < end
        k, v, k_scale, v_scale = load_kv_tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tok, n_mask, kv_head,
                                              num_kv_heads, DP, BLOCK_SIZE, KIND)
        acc, acc_odd, m_i, l_i = attend_tile(acc, acc_odd, m_i, l_i, q, q_odd, k, v, k_scale, v_scale,
                                             n_mask[None, :], qk_scale, KIND, True, USE_F32)

    # An empty split (short context) has l_i = 0: it writes zeros and lse = -inf, which merge to nothing.
    inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)[:, None]
    if not SPLIT:
        o_off = seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * PACK
        tl.store(out_ptr + o_off, (acc * inv_l).to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
        if KIND != 0:
            tl.store(out_ptr + o_off + 1, (acc_odd * inv_l).to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
    else:
        row = (seq.to(tl.int64) * num_kv_heads * GROUP + heads) * num_splits + split  # (seq, head, split)
        p_off = row[:, None] * HEAD_DIM + offs_d[None, :] * PACK
        tl.store(part_out_ptr + p_off, acc * inv_l, mask=h_mask[:, None])
        if KIND != 0:
            tl.store(part_out_ptr + p_off + 1, acc_odd * inv_l, mask=h_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=h_mask)


@triton.jit
def _merge_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, stride_os, stride_oh, num_heads, num_splits,
                         SPLITS_P: tl.constexpr, HEAD_DIM: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P)
    offs_d = tl.arange(0, HEAD_DIM)
    row = (seq.to(tl.int64) * num_heads + head) * num_splits
    lse = tl.load(part_lse_ptr + row + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))  # split 0 always holds a token, so the max is finite
    parts = tl.load(part_out_ptr + (row + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=(offs_s < num_splits)[:, None], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device,
                      kv_dtype: str = "bfloat16", power_of_two: bool = False) -> int:
    """Enough splits to give every SM about two programs (four for quantized caches, whose programs
    spend longer converting than loading), none shorter than 512 tokens: the rule the step-time model
    prices (kvsim.perf.roofline.decode_splits)."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 8
    return decode_splits(num_seqs, num_kv_heads, max_context, sms, kv_dtype not in ("bfloat16", "float16"),
                         power_of_two)


def _launch_config(cache: LayerKVCache) -> dict:
    """Tile and launch shape, tuned on an H100 (benchmarks/gpu_kernels.py)."""
    if cache.kv_dtype in ("bfloat16", "float16"):
        return dict(BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_N=128, num_warps=4, num_stages=2 if cache.kv_dtype == "int4" else 3)


def paged_decode_attention(q: torch.Tensor, cache: LayerKVCache, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, num_splits: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q (num_seqs, num_q_heads, head_dim) over each sequence's first context_lens tokens."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = cache.num_kv_heads
    check_cache(cache)
    assert q.stride(-1) == 1 and head_dim == cache.head_dim and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, block_tables.shape[1] * cache.block_size, q.device,
                                       cache.kv_dtype)
    if num_splits > 1:
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, *attention_args(cache), block_tables, context_lens, out, part_out, part_lse, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), num_kv_heads, num_splits,
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=cache.block_size, KIND=KV_KIND[cache.kv_dtype], SPLIT=num_splits > 1, USE_F32=DOT_F32,
        **_launch_config(cache))
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1), num_heads, num_splits,
            SPLITS_P=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim, num_warps=4)
    return out
