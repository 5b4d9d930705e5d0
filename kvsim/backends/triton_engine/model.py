"""A decoder-only transformer with a real model's shapes and seeded random weights, on paged KV caches.

Llama / Qwen3 layout: token embedding, per layer RMSNorm -> fused qkv projection -> (Qwen3: per-head
RMSNorm on q and k) -> neox-style RoPE -> attention -> o_proj, RMSNorm -> fused gate_up -> SwiGLU ->
down_proj; final RMSNorm and lm_head (tied to the embedding when the model ties them). Nothing is
downloaded: weights are N(0, init_std) from a seeded generator, so step times match the real model's
while the tokens it samples are meaningless. Llama 3's RoPE frequency scaling is left out: it changes
values, not work.

Attention is a callable handed to `forward`, so one set of layers serves the paged engine
(`PagedAttention`: store the new K/V with `store_kvcache`, then the decode kernel for the decode rows
and the prefill kernel for the prefill rows) and the float64 dense reference used by the tests
(`dense_reference_forward`). The elementwise work runs as three fused Triton kernels (residual add +
RMSNorm, q/k norm + RoPE in place, SiLU-and-mul), as in vLLM: unfused, a decode step is ~45 launches a
layer and launch-bound. Float64 tensors (the reference) take plain torch ops instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from kvsim.backends.triton_engine.decode_attention import paged_decode_attention
from kvsim.backends.triton_engine.kv_quant import LayerKVCache
from kvsim.backends.triton_engine.prefill_attention import paged_prefill_attention
from kvsim.backends.triton_engine.store_kvcache import store_kvcache

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# attend(layer_idx, q, k, v) -> o, with q (tokens, q_heads, head_dim) and k, v (tokens, kv_heads, head_dim)
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# ---- fused elementwise kernels: a decode step is launch-bound without them ------------------
@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * n_cols + offs, x.to(res_ptr.dtype.element_ty), mask=mask)
    inv = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, w_ptr, stride_t, eps, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_H: tl.constexpr, QK_NORM: tl.constexpr):
    """In place on one token's q heads (program_id(1) == 0) or k heads (== 1) of the fused qkv row."""
    tok = tl.program_id(0).to(tl.int64)
    which = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    mask = (offs_h < tl.where(which == 0, NUM_Q, NUM_KV))[:, None]
    ptr = qkv_ptr + tok * stride_t + which * NUM_Q * 2 * HALF + offs_h[:, None] * 2 * HALF + offs_d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        w = w_ptr + which * 2 * HALF + offs_d
        x1 = x1 * inv * tl.load(w).to(tl.float32)[None, :]
        x2 = x2 * inv * tl.load(w + HALF).to(tl.float32)[None, :]
    c = tl.load(cos_ptr + tok * HALF + offs_d)[None, :]
    s = tl.load(sin_ptr + tok * HALF + offs_d)[None, :]
    tl.store(ptr, (x1 * c - x2 * s).to(qkv_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, (x2 * c + x1 * s).to(qkv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(x_ptr + row * 2 * n + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * n + n + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=mask)


# ---- the ops: one Triton launch each in the model dtypes; plain torch for float64 (the reference) ----
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor, eps: float):
    """(RMSNorm(x + residual) * weight, x + residual); with no residual, (RMSNorm(x) * weight, x).
    The Triton path updates `residual` in place."""
    if x.dtype == torch.float64:
        res = x if residual is None else x + residual
        return _rms_norm(res, weight, eps), res
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    out = torch.empty_like(x)
    n = x.shape[-1]
    _add_rms_norm_kernel[(x.numel() // n,)](x, x if residual is None else residual, weight, out, n, eps,
                                           HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n),
                                           num_warps=8 if n >= 4096 else 4)
    return out, (x if residual is None else residual)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (tokens, head_dim / 2) in inv_freq's dtype."""
    freqs = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of the two halves of each head (tokens, heads, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def qk_norm_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm_w: Optional[torch.Tensor],
                 num_q: int, num_kv: int, head_dim: int, eps: float) -> torch.Tensor:
    """(Qwen3: per-head RMSNorm of q and k, norm_w = [q_norm, k_norm]) then RoPE, on the fused qkv rows."""
    q_size, kv_size = num_q * head_dim, num_kv * head_dim
    if qkv.dtype == torch.float64:
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q, k = q.reshape(-1, num_q, head_dim), k.reshape(-1, num_kv, head_dim)
        if norm_w is not None:
            q, k = _rms_norm(q, norm_w[0], eps), _rms_norm(k, norm_w[1], eps)
        return torch.cat((apply_rope(q, cos, sin).flatten(1), apply_rope(k, cos, sin).flatten(1), v), dim=-1)
    assert qkv.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    _qk_norm_rope_kernel[(qkv.shape[0], 2)](
        qkv, cos, sin, qkv if norm_w is None else norm_w, qkv.stride(0), eps, NUM_Q=num_q, NUM_KV=num_kv,
        HALF=head_dim // 2, BLOCK_H=triton.next_power_of_2(max(num_q, num_kv)), QK_NORM=norm_w is not None,
        num_warps=4)
    return qkv


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up of the fused gate_up rows."""
    gate, up = x.chunk(2, dim=-1)
    if x.dtype == torch.float64:
        return F.silu(gate) * up
    out = torch.empty_like(gate)
    n, block = gate.shape[-1], 1024
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, block))](x, out, n, BLOCK=block, num_warps=4)
    return out


class Attention(nn.Module):
    def __init__(self, spec, layer_idx: int, init: Callable):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = spec.num_attention_heads, spec.num_key_value_heads
        self.head_dim, self.eps = spec.head_dim, spec.rms_norm_eps
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = init((self.q_size + 2 * self.kv_size, spec.hidden_size))
        self.o_proj = init((spec.hidden_size, self.q_size))
        self.qk_norm = init((2, self.head_dim), ones=True) if spec.qk_norm else None  # q_norm, k_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        qkv = qk_norm_rope(F.linear(x, self.qkv_proj), cos, sin, self.qk_norm, self.num_heads, self.num_kv_heads,
                           self.head_dim, self.eps)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        o = attend(self.layer_idx, q.view(-1, self.num_heads, self.head_dim),
                   k.view(-1, self.num_kv_heads, self.head_dim), v.view(-1, self.num_kv_heads, self.head_dim))
        return F.linear(o.reshape(-1, self.q_size), self.o_proj)


class DecoderLayer(nn.Module):
    def __init__(self, spec, layer_idx: int, init: Callable):
        super().__init__()
        self.eps = spec.rms_norm_eps
        self.input_layernorm = init((spec.hidden_size,), ones=True)
        self.self_attn = Attention(spec, layer_idx, init)
        self.post_attention_layernorm = init((spec.hidden_size,), ones=True)
        self.gate_up_proj = init((2 * spec.intermediate_size, spec.hidden_size))
        self.down_proj = init((spec.hidden_size, spec.intermediate_size))

    def forward(self, x, residual, cos, sin, attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """x is the previous layer's MLP output, residual the stream before it (None for layer 0)."""
        h, residual = add_rms_norm(x, residual, self.input_layernorm, self.eps)
        h, residual = add_rms_norm(self.self_attn(h, cos, sin, attend), residual, self.post_attention_layernorm,
                                   self.eps)
        return F.linear(silu_mul(F.linear(h, self.gate_up_proj)), self.down_proj), residual


class Transformer(nn.Module):
    """The whole model; `forward` gives final (normed) hidden states, `compute_logits` the sampled rows' logits."""

    def __init__(self, spec, dtype: torch.dtype = torch.bfloat16, device="cuda", seed: int = 0,
                 init_std: float = 0.02):
        super().__init__()
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)

        def init(shape, ones=False):
            t = torch.empty(shape, dtype=dtype, device=device)
            return nn.Parameter(t.fill_(1.0) if ones else t.normal_(0.0, init_std, generator=gen),
                                requires_grad=False)

        self.spec = spec
        self.embed_tokens = init((spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(spec, i, init) for i in range(spec.num_hidden_layers))
        self.norm = init((spec.hidden_size,), ones=True)
        self.lm_head = self.embed_tokens if spec.tie_word_embeddings else init((spec.vocab_size, spec.hidden_size))
        exponents = torch.arange(0, spec.head_dim, 2, dtype=torch.float64, device=device) / spec.head_dim
        self.register_buffer("inv_freq", (1.0 / spec.rope_theta ** exponents).float(), persistent=False)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        x, residual = F.embedding(input_ids, self.embed_tokens), None
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, attend)
        return add_rms_norm(x, residual, self.norm, self.spec.rms_norm_eps)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.lm_head)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))


@dataclass(slots=True)
class AttentionMetadata:
    """Where one step's tokens go in the caches. Rows are packed decode tokens first, then prefill tokens."""

    slot_mapping: torch.Tensor  # (num_tokens,) int64; -1 stores nothing (padding rows)
    num_decode_tokens: int = 0  # the first rows: one token per decoding sequence
    decode_block_tables: Optional[torch.Tensor] = None  # (num_decode, width) int32
    decode_context_lens: Optional[torch.Tensor] = None  # (num_decode,) int32, the current token included
    num_splits: Optional[int] = None  # decode split-K; fixed when the step is captured in a CUDA graph
    prefill_block_tables: Optional[torch.Tensor] = None  # (num_prefill_seqs, width) int32
    cu_seqlens_q: Optional[torch.Tensor] = None  # (num_prefill_seqs + 1,) int32, offsets into the prefill rows
    prefill_context_lens: Optional[torch.Tensor] = None  # (num_prefill_seqs,) int32: cached + new
    max_seqlen_q: int = 0


class PagedAttention:
    """The engine's attention: store this step's K/V, then run the decode and prefill kernels."""

    def __init__(self, caches: list[LayerKVCache], meta: AttentionMetadata, scale: float):
        self.caches, self.meta, self.scale = caches, meta, scale

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache, m = self.caches[layer_idx], self.meta
        store_kvcache(k, v, cache, m.slot_mapping)
        out = torch.empty_like(q)
        nd = m.num_decode_tokens
        if nd:
            paged_decode_attention(q[:nd], cache, m.decode_block_tables, m.decode_context_lens, self.scale,
                                   num_splits=m.num_splits, out=out[:nd])
        if m.cu_seqlens_q is not None:
            paged_prefill_attention(q[nd:], cache, m.prefill_block_tables, m.cu_seqlens_q, m.prefill_context_lens,
                                    self.scale, m.max_seqlen_q, out=out[nd:])
        return out


class DenseCausalAttention:
    """Plain causal attention over one whole sequence, in the inputs' dtype (the reference)."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * self.scale
        n = q.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, v)


def dense_reference_forward(model: Transformer, token_ids_per_seq: list, dtype=torch.float64) -> list[torch.Tensor]:
    """Logits at every position of each sequence, recomputed from scratch in `dtype` on the CPU."""
    ref = copy.deepcopy(model).to(device="cpu", dtype=dtype)
    attend = DenseCausalAttention(model.spec.head_dim ** -0.5)
    out = []
    with torch.inference_mode():
        for ids in token_ids_per_seq:
            ids = torch.as_tensor(ids, dtype=torch.long)
            hidden = ref(ids, torch.arange(len(ids)), attend)
            out.append(ref.compute_logits(hidden))
    return out
