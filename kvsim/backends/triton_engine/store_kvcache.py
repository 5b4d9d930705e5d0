"""Writing new tokens' K/V into the paged cache, quantizing on the way in for fp8/int8/int4 caches.

One program per token writes all KV heads of that token's K and V: a plain cast for bf16/fp16
caches; for quantized caches a per-head absmax, scale = absmax / qmax, and q = round(x / scale)
(integers round half away from zero, fp8 to nearest even). Slot -1 (a prefix-cache hit whose
KV is already there) writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvsim.backends.triton_engine.kv_quant import KV_KIND, QMAX, LayerKVCache, check_cache, store_args


@triton.jit
def _round_half_away(y):
    return (y + tl.where(y >= 0, 0.5, -0.5)).to(tl.int32)


@triton.jit
def _round_to_e4m3(y):
    """Round float32 |y| <= 448 to an e4m3 value (ties to even) in float32, so that the cast is exact.

    Triton's interpreter casts float32 -> fp8 wrongly when rounding carries into the exponent, so the
    rounding is done here: on the float32 bits for normal values (3 mantissa bits kept), and on a
    grid of 2^-9 below 2^-6, where e4m3 is subnormal.
    """
    bits = y.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    subnormal = _round_half_away(y * 512.0).to(tl.float32) * (1.0 / 512.0)
    return tl.where(tl.abs(y) < 0.015625, subnormal, bits.to(tl.float32, bitcast=True))


@triton.jit
def _quantize(x, inv_scale, QMAX_: tl.constexpr, KIND: tl.constexpr):
    """float32 x * inv_scale -> the cache's values: fp8 as its bytes, integers (int4 too) as int32."""
    y = tl.minimum(tl.maximum(x * inv_scale, -QMAX_), QMAX_)
    if KIND == 1:
        return _round_to_e4m3(y).to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # fp8 caches are passed as bytes
    else:
        return _round_half_away(y)


@triton.jit
def _store_one(src_ptr, dst_ptr, scale_ptr, src_off, dst_off, scale_off, mask, hmask,
               HEAD_DIM: tl.constexpr, QMAX_: tl.constexpr, KIND: tl.constexpr):
    """Store one token's (heads, head_dim) tile of K or V; the offsets come from _store_kvcache_kernel."""
    if KIND == 0:
        x = tl.load(src_ptr + src_off, mask=mask)
        tl.store(dst_ptr + dst_off, x.to(dst_ptr.dtype.element_ty), mask=mask)
    elif KIND == 3:
        # src_off indexes the even elements; dst_off the packed bytes.
        x0 = tl.load(src_ptr + src_off, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(src_ptr + src_off + 1, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x0), 1), tl.max(tl.abs(x1), 1))
        inv = tl.where(amax > 0, QMAX_ / amax, 0.0)[:, None]
        q0 = _quantize(x0, inv, QMAX_, KIND) + 8
        q1 = _quantize(x1, inv, QMAX_, KIND) + 8
        tl.store(dst_ptr + dst_off, (q0 | (q1 << 4)).to(tl.uint8), mask=mask)
        tl.store(scale_ptr + scale_off, amax / QMAX_, mask=hmask)
    else:
        x = tl.load(src_ptr + src_off, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), 1)
        inv = tl.where(amax > 0, QMAX_ / amax, 0.0)[:, None]
        tl.store(dst_ptr + dst_off, _quantize(x, inv, QMAX_, KIND).to(dst_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + scale_off, amax / QMAX_, mask=hmask)


@triton.jit
def _store_kvcache_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
                          slot_mapping_ptr, stride_kt, stride_kh, stride_vt, stride_vh, num_kv_heads,
                          HEADS_P: tl.constexpr, HEAD_DIM: tl.constexpr, KIND: tl.constexpr,
                          QMAX_: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    PACK: tl.constexpr = 2 if KIND == 3 else 1
    DP: tl.constexpr = HEAD_DIM // PACK
    offs_h = tl.arange(0, HEADS_P)
    offs_d = tl.arange(0, DP)
    hmask = offs_h < tl.where(slot >= 0, num_kv_heads, 0)  # slot -1: store nothing
    mask = hmask[:, None]
    tok = token.to(tl.int64)
    k_off = tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * PACK
    v_off = tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * PACK
    dst_off = (slot * num_kv_heads + offs_h[:, None]) * DP + offs_d[None, :]
    scale_off = slot * num_kv_heads + offs_h
    _store_one(key_ptr, k_cache_ptr, k_scale_ptr, k_off, dst_off, scale_off, mask, hmask, HEAD_DIM, QMAX_, KIND)
    _store_one(value_ptr, v_cache_ptr, v_scale_ptr, v_off, dst_off, scale_off, mask, hmask, HEAD_DIM, QMAX_,
               KIND)


def store_kvcache(key: torch.Tensor, value: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    """Write key/value (num_tokens, num_kv_heads, head_dim) at slot_mapping (num_tokens,); -1 skips."""
    num_tokens, num_kv_heads, head_dim = key.shape
    check_cache(cache)
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "key/value must be contiguous in head_dim"
    assert (num_kv_heads, head_dim) == (cache.num_kv_heads, cache.head_dim), "key/value do not match the cache"
    assert slot_mapping.numel() == num_tokens
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        key, value, *store_args(cache), slot_mapping, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), num_kv_heads, HEADS_P=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        KIND=KV_KIND[cache.kv_dtype], QMAX_=QMAX.get(cache.kv_dtype, 1.0), num_warps=4)
