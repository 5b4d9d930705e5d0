"""KV-cache storage: dtypes, per-layer allocation, and the in-register dequantization helpers.

A layer's cache is `k`, `v` of shape (num_blocks, block_size, num_kv_heads, head_dim); the slot of a
token is block_id * block_size + offset. Quantized caches ("fp8" e4m3, "int8", "int4") add float32
scales `k_scale`, `v_scale` of shape (num_blocks, block_size, num_kv_heads): one per token per head,
symmetric absmax, scale = max|x| / qmax and x ~= q * scale. "int4" packs two values per uint8 byte
along head_dim: element 2i in the low nibble, 2i+1 in the high nibble, each stored as q + 8 with q in
[-7, 7] (so nibble 0 never occurs). The attention kernels never dequantize K or V tiles: integers
and fp8 values are exact in fp16, so they are cast (cheaply, see unpack_pairs) and fed to the
matrix units as they are, and the scales are applied to the score columns (K) and to the
probabilities (V) instead. Quantized caches therefore run their dots in fp16 whatever the model
dtype, so query values must stay inside fp16's range (|q| < 65504).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvsim.errors import KvsimError

KV_DTYPES = ("bfloat16", "float16", "fp8", "int8", "int4")
QMAX = {"fp8": 448.0, "int8": 127.0, "int4": 7.0}
# Kernel-side kind of a cache, a constexpr: 0 plain float, 1 fp8, 2 int8, 3 packed int4.
KV_KIND = {"bfloat16": 0, "float16": 0, "fp8": 1, "int8": 2, "int4": 3}
_STORAGE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": torch.float8_e4m3fn,
            "int8": torch.int8, "int4": torch.uint8}
_ALIASES = {"fp8_e4m3": "fp8"}

# Triton's CPU interpreter (3.9) gets bf16 tl.dot wrong, so under it the kernels cast dot operands
# to float32 (see mma). On a GPU the dots run in bf16/fp16.
DOT_F32 = os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(slots=True)
class LayerKVCache:
    """One layer's paged K/V cache and, for quantized dtypes, its per-token-per-head scales."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    kv_dtype: str

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3] * (2 if self.kv_dtype == "int4" else 1)


def resolve_kv_dtype(kv_dtype: str, model_dtype: torch.dtype = torch.bfloat16) -> str:
    """Map a scenario's kv_cache_dtype ("auto", "fp8_e4m3", ...) onto one of KV_DTYPES."""
    if kv_dtype == "auto":
        return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(model_dtype, "bfloat16")
    kv_dtype = _ALIASES.get(kv_dtype, kv_dtype)
    if kv_dtype not in KV_DTYPES:
        raise KvsimError(f"kv_cache_dtype: unknown KV cache dtype {kv_dtype!r}; expected one of {KV_DTYPES}")
    return kv_dtype


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      kv_dtype: str, device, model_dtype: torch.dtype = torch.bfloat16) -> list[LayerKVCache]:
    """Uninitialized caches for every layer (the kernels read only slots that were stored)."""
    kv_dtype = resolve_kv_dtype(kv_dtype, model_dtype)
    if block_size < 8 or block_size & (block_size - 1):
        raise KvsimError(f"block_size: must be a power of two >= 8 for the Triton kernels, got {block_size}")
    if head_dim not in (32, 64, 128, 256):
        raise KvsimError(f"head_dim: the Triton kernels support 32, 64, 128 or 256, got {head_dim}")
    packed_dim = head_dim // 2 if kv_dtype == "int4" else head_dim
    shape = (num_blocks, block_size, num_kv_heads, packed_dim)
    quantized = kv_dtype in QMAX
    caches = []
    for _ in range(num_layers):
        k = torch.empty(shape, dtype=_STORAGE[kv_dtype], device=device)
        v = torch.empty(shape, dtype=_STORAGE[kv_dtype], device=device)
        scales = [torch.empty(shape[:3], dtype=torch.float32, device=device) if quantized else None
                  for _ in range(2)]
        caches.append(LayerKVCache(k, v, scales[0], scales[1], kv_dtype))
    return caches


def kv_bytes_per_token(num_kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """Bytes one token occupies in one layer's cache, K and V and scales together."""
    elem = {"bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1, "int4": 0.5}[kv_dtype]
    scales = 4 if kv_dtype in QMAX else 0
    return int(2 * num_kv_heads * (head_dim * elem + scales))


def _dequantize(x: torch.Tensor, scale: torch.Tensor | None, kv_dtype: str) -> torch.Tensor:
    if kv_dtype == "int4":
        lo = (x & 0xF).to(torch.int16) - 8
        hi = (x >> 4).to(torch.int16) - 8
        x = torch.stack((lo, hi), dim=-1).flatten(-2)
    x = x.to(torch.float64)
    return x if scale is None else x * scale.to(torch.float64).unsqueeze(-1)


def dequantize_reference(cache: LayerKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole cache as float64 (num_blocks, block_size, num_kv_heads, head_dim) K and V, in torch."""
    return (_dequantize(cache.k, cache.k_scale, cache.kv_dtype),
            _dequantize(cache.v, cache.v_scale, cache.kv_dtype))


@triton.jit
def mma(a, b, acc, USE_F32: tl.constexpr):
    """acc + a @ b in float32 (operands cast to float32 under the interpreter, see DOT_F32)."""
    if USE_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:  # a float32 query against a 16-bit cache runs the dot in the cache's dtype
        return tl.dot(a.to(b.dtype), b, acc)


@triton.jit
def unpack_pairs(x, KIND: tl.constexpr):
    """A loaded tile of quantized pairs -> (even, odd) element tiles as exact fp16 dot operands.

    8-bit caches are loaded as int16 (two elements a word) and int4 ones as bytes (two a byte), so the
    unpacking has two consumers and the compiler converts in registers, before the layout change to
    the dot operand, instead of reading single bytes back from shared memory. Integers become fp16
    by the magic-number trick (the value goes into the mantissa of 1024.0, the bias comes off), which
    is cheaper than an integer-to-float conversion; fp8 by the hardware cast.
    """
    if KIND == 3:  # nibble = q + 8
        lo = ((x & 0xF).to(tl.uint16) | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True) - 1032.0
        hi = ((x >> 4).to(tl.uint16) | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True) - 1032.0
    elif KIND == 2:  # byte ^ 0x80 = q + 128
        lo = (((x ^ 0x80) & 0xFF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0
        hi = ((((x >> 8) ^ 0x80) & 0xFF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0
    else:  # fp8 e4m3 bytes
        lo = (x & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = ((x >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return lo.to(tl.float16), hi.to(tl.float16)


@triton.jit
def load_kv_tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tok, n_mask, kv_head, num_kv_heads,
                 DP: tl.constexpr, BLOCK_SIZE: tl.constexpr, KIND: tl.constexpr):
    """K, V (BLOCK_N, DP) of context tokens `tok` through the block table row, and their scales (or 1)."""
    block = tl.load(bt_row + tok // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    slot_head = (block * BLOCK_SIZE + tok % BLOCK_SIZE) * num_kv_heads + kv_head
    kv_off = slot_head[:, None] * DP + tl.arange(0, DP)[None, :]
    k = tl.load(k_ptr + kv_off, mask=n_mask[:, None], other=0)
    v = tl.load(v_ptr + kv_off, mask=n_mask[:, None], other=0)
    if KIND == 0:
        return k, v, 1.0, 1.0
    else:
        k_scale = tl.load(ks_ptr + slot_head, mask=n_mask, other=0.0)
        v_scale = tl.load(vs_ptr + slot_head, mask=n_mask, other=0.0)
        return k, v, k_scale, v_scale


@triton.jit
def attend_tile(acc, acc_odd, m_i, l_i, q, q_odd, k, v, k_scale, v_scale, mask, qk_scale,
                KIND: tl.constexpr, MASKED: tl.constexpr, USE_F32: tl.constexpr):
    """One online-softmax step (base 2) of query rows q over a tile of cached tokens.

    q is in the dot dtype: the model dtype for float caches, fp16 for quantized ones. For quantized
    caches q/acc hold the even and q_odd/acc_odd the odd head_dim elements (see unpack_pairs); for
    float caches q_odd and acc_odd pass through untouched. `mask` (rows, BLOCK_N) is applied when
    MASKED. For quantized caches, V's scales enter the probabilities as v_scale / max(v_scale) so that they stay in fp16 range,
    and the max multiplies the tile's product.
    """
    dt = q.dtype
    if KIND == 0:
        s = mma(q, tl.trans(k), None, USE_F32)
    else:
        k_lo, k_hi = unpack_pairs(k, KIND)
        s = mma(q, tl.trans(k_lo), None, USE_F32)
        s = mma(q_odd, tl.trans(k_hi), s, USE_F32)
    if KIND != 0:
        s = s * k_scale[None, :]
    s = s * qk_scale
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if KIND == 0:
        acc = mma(p.to(dt), v, acc * alpha[:, None], USE_F32)
    else:
        v_max = tl.maximum(tl.max(v_scale, 0), 1e-30)
        p = (p * (v_scale / v_max)[None, :]).to(dt)
        v_lo, v_hi = unpack_pairs(v, KIND)
        acc = acc * alpha[:, None] + mma(p, v_lo, None, USE_F32) * v_max
        acc_odd = acc_odd * alpha[:, None] + mma(p, v_hi, None, USE_F32) * v_max
    return acc, acc_odd, m_new, l_i


def store_args(cache: LayerKVCache) -> tuple:
    """(k, v, k_scale, v_scale) for store_kvcache: bytes for fp8, which the interpreter cannot fill or
    cast into; plain caches pass k/v again as dummy scale pointers."""
    k, v = cache.k, cache.v
    if cache.kv_dtype == "fp8":
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    return (k, v) + ((k, v) if cache.k_scale is None else (cache.k_scale, cache.v_scale))


def attention_args(cache: LayerKVCache) -> tuple:
    """(k, v, k_scale, v_scale) for the attention kernels: 8-bit caches as int16 pairs (see unpack_pairs)."""
    k, v = cache.k, cache.v
    if cache.kv_dtype in ("fp8", "int8"):
        k, v = k.view(torch.int16), v.view(torch.int16)
    return (k, v) + ((k, v) if cache.k_scale is None else (cache.k_scale, cache.v_scale))


def check_cache(cache: LayerKVCache) -> None:
    """The kernels index with the contiguous layout's strides."""
    for t in (cache.k, cache.v, cache.k_scale, cache.v_scale):
        if t is not None and not t.is_contiguous():
            raise ValueError("KV cache tensors must be contiguous")
