"""Model shapes: `ModelSpec` (Hugging Face config.json field names), its per-layer structure and the
parameter arithmetic every sizing and timing model reads.

A layer's attention is full, sliding-window (`sliding_window` tokens) or chunked-local
(`attention_chunk_size`), per `layer_types` as in transformers' configs; `mla` makes every layer
multi-head latent attention (DeepSeek-V2/V3). Its MLP is dense (`intermediate_size`) or, with
`moe`, routed experts plus optional shared experts, except the layers `MoeSpec.dense_layers` names.

Parameters are counted once per tensor (`tie_word_embeddings`: embed_tokens is lm_head) and grouped
by how vLLM shards them (`ParamGroups`); bytes follow the checkpoint as shipped (`quantization`, a
format of `QUANT_FORMATS`, applied to the linear layers of the roles in `quantized`: attention,
dense MLPs, shared experts, routed experts), else the weights dtype for the linear layers, and 16
bits for embeddings, lm_head, norms and routers (vLLM's quantisation methods leave them unquantised).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"  # transformers' layer_types
LAYER_TYPES = (FULL, SLIDING, CHUNKED)
FP8_BLOCK = 128  # DeepSeek-V3's weight_block_size: one float32 scale per 128 x 128 block
MXFP4_GROUP = 32  # OCP MX: one 8-bit (e8m0) scale per 32 4-bit values
NVFP4_GROUP = 16  # NVFP4: one fp8 (e4m3) scale per 16 4-bit values, and a float32 one per tensor
INT4_GROUP = 128  # w4a16 (GPTQ, AWQ, compressed-tensors pack-quantized): a 16-bit scale per group, 128 unless given
# Checkpoint weight formats -> bytes per parameter, scales included (int4: with a scale per INT4_GROUP)
QUANT_FORMATS = {
    "fp8": 1 + 4 / FP8_BLOCK**2,  # 128x128-block fp8 (DeepSeek-V3, Qwen3-*-FP8, MiniMax-M2, Kimi-K2)
    "fp8_tensor": 1.0,  # fp8 with a scale per tensor or output channel (ModelOpt FP8, compressed-tensors FP8)
    "mxfp4": 0.5 + 1 / MXFP4_GROUP,  # OCP MXFP4 (gpt-oss's experts)
    "nvfp4": 0.5 + 1 / NVFP4_GROUP,  # NVIDIA NVFP4 (ModelOpt and compressed-tensors w4a4)
    "int4": 0.5 + 2 / INT4_GROUP,  # int4 weight-only, w4a16 (Kimi-K2.5's experts, GPTQ, AWQ)
}
QUANT_BYTES = QUANT_FORMATS  # the name kvsim used before int4 and nvfp4
# Linear layers by role: attention projections, dense MLPs, shared experts, routed experts
QUANT_ROLES = ("attn", "mlp", "shared", "experts")
DEFAULT_QUANTIZED = {"mxfp4": ("experts",)}  # a format's roles when a spec does not say (others: every role)


@dataclass(slots=True, frozen=True)
class MlaSpec:
    """Multi-head latent attention: a token caches one latent vector (kv_lora_rank) and one rope key
    (qk_rope_head_dim) per layer, shared by every head; kv_b_proj expands it to per-head K and V."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: q_proj straight from the hidden state (DeepSeek-V2-Lite)

    @property
    def latent_dim(self) -> int:
        """Elements one token caches per layer (vLLM's MLA head size)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(slots=True, frozen=True)
class MoeSpec:
    """Routed experts (vLLM FusedMoE): each token goes to num_experts_per_tok of n_routed_experts
    SwiGLU experts of moe_intermediate_size, plus the shared experts every token uses."""

    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int = 0  # all shared experts together (DeepSeek: n_shared x moe size)
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead (DeepSeek: first_k_dense_replace)
    router_bias: bool = False  # a bias per expert on the router (gpt-oss; DeepSeek's e_score_correction_bias)
    expert_bias: bool = False  # biases on the experts' projections (gpt-oss)

    def expected_experts(self, num_tokens: float) -> float:
        """Distinct experts a batch of num_tokens touches in one layer under balanced routing (each
        token picks its experts uniformly at random): E x (1 - (1 - k/E)^T)."""
        e, k = self.n_routed_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** max(num_tokens, 0))


@dataclass(slots=True, frozen=True)
class ParamGroups:
    """A model's parameters by how vLLM places them on tensor-parallel ranks."""

    embed: int  # embed_tokens: vocab-parallel
    lm_head: int  # 0 when tied to embed_tokens
    attn: int  # attention projections split over TP (q, o; MLA: q_b, kv_b, o)
    attn_kv: int  # k and v projections: split over TP, replicated once TP exceeds the KV heads
    attn_replicated: int  # MLA's q_a_proj and kv_a_proj_with_mqa: whole on every rank
    dense_mlp: int  # dense layers' MLPs: split over TP
    shared_experts: int  # split over TP
    experts: int  # routed experts: split over TP, or whole experts over EP ranks
    small: int  # norms, routers, biases: replicated, 16-bit
    encoder: int  # a multimodal checkpoint's vision encoder and projector (vLLM loads them)

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer: GQA or MLA attention (full, sliding-window or chunked-local per
    layer), SwiGLU MLPs dense or mixture-of-experts."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # q/k head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    intermediate_size: int  # a dense layer's MLP (Llama-4: intermediate_size_mlp)
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3 / gemma-3: RMSNorm weights on q and k per head
    qk_norm_per_layer: bool = False  # MiniMax-M2: those norms over all heads' q and k (a weight per element)
    dtype: str = "bfloat16"  # weights dtype (from ModelConfig.dtype)
    layer_types: tuple[str, ...] = ()  # per layer, as transformers' layer_types; () = every layer full
    sliding_window: int = 0
    attention_chunk_size: int = 0
    attention_bias: bool = False  # q, k, v and o biases (gpt-oss)
    sandwich_norms: bool = False  # gemma-2/3: norms before and after attention and MLP (4 a layer)
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    quantization: str = ""  # as shipped: "" or a format of QUANT_FORMATS
    quantized: tuple[str, ...] = ()  # the QUANT_ROLES it applies to (): DEFAULT_QUANTIZED or every role
    quant_group_size: int = 0  # int4: values per 16-bit scale (0: INT4_GROUP)
    encoder_params: int = 0  # vision encoder + projector of a multimodal checkpoint
    # multi-token-prediction layers shipped with the checkpoint (DeepSeek-V3, GLM-4.5, Qwen3-Next: one), which
    # vLLM's MTP speculative decoding runs as its drafter; not counted in num_hidden_layers or the weights
    num_nextn_predict_layers: int = 0

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - len(self.moe.dense_layers) if self.moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_hidden_layers - self.num_moe_layers

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.layer_type(i) == SLIDING for i in range(self.num_hidden_layers))

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    # ---- parameters per layer ----------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        """Attention projections (no biases): q, k, v, o; MLA: q_a, q_b (or q), kv_a, kv_b, o."""
        return sum(self._attn_params())

    def _attn_params(self) -> tuple[int, int, int]:
        """(split over TP, k and v, whole on every rank) of one layer's attention projections."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla is None:
            q_out, kv_out = heads * self.head_dim, self.num_key_value_heads * self.head_dim
            return 2 * h * q_out, 2 * h * kv_out, 0
        m = self.mla
        q_out = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = heads * m.v_head_dim * h
        kv_a = h * m.latent_dim
        if m.q_lora_rank:
            return m.q_lora_rank * q_out + kv_b + o, 0, h * m.q_lora_rank + kv_a
        return h * q_out + kv_b + o, 0, kv_a

    @property
    def mlp_params_per_layer(self) -> int:
        """A dense layer's gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed expert's gate, up and down projections."""
        return 3 * self.hidden_size * self.moe.moe_intermediate_size if self.moe else 0

    @property
    def shared_expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe.shared_expert_intermediate_size if self.moe else 0

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.moe.n_routed_experts if self.moe else 0

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _small_params_per_layer(self, moe_layer: bool) -> int:
        """Norms, biases and the router of one layer: replicated, kept in 16 bits."""
        h = self.hidden_size
        qk = (self.num_attention_heads + self.num_key_value_heads if self.qk_norm_per_layer else 2) * self.head_dim
        n = (4 if self.sandwich_norms else 2) * h + (qk if self.qk_norm else 0)
        if self.mla:
            n += self.mla.kv_lora_rank + self.mla.q_lora_rank  # kv_a_layernorm, q_a_layernorm
        if self.attention_bias:
            n += (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim + h
        if moe_layer and self.moe:
            e = self.moe.n_routed_experts
            n += self.router_params + (e if self.moe.router_bias else 0)
        return n

    def param_groups(self) -> ParamGroups:
        layers, moe = self.num_hidden_layers, self.num_moe_layers
        attn, kv, rep = self._attn_params()
        experts = moe * self.moe.n_routed_experts * self.expert_params if self.moe else 0
        expert_bias = moe * self.moe.n_routed_experts * (2 * self.moe.moe_intermediate_size + self.hidden_size) \
            if self.moe and self.moe.expert_bias else 0  # gate_up (2 x inter) and down (hidden) biases
        small = (self.num_dense_layers * self._small_params_per_layer(False)
                 + moe * self._small_params_per_layer(True) + expert_bias + self.hidden_size)  # + final norm
        return ParamGroups(
            embed=self.lm_head_params, lm_head=0 if self.tie_word_embeddings else self.lm_head_params,
            attn=layers * attn, attn_kv=layers * kv, attn_replicated=layers * rep,
            dense_mlp=self.num_dense_layers * self.mlp_params_per_layer,
            shared_experts=moe * self.shared_expert_params, experts=experts, small=small,
            encoder=self.encoder_params)

    @property
    def num_params(self) -> int:
        return self.param_groups().total

    # ---- bytes as shipped ----------------------------------------------------------------------
    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: fp8 models still compute in 16-bit, fp32 models in fp32."""
        return 4 if self.dtype == "float32" else 2

    def weight_format(self, role: str) -> str:
        """The checkpoint format of one role's linear layers (QUANT_ROLES), or "" for the weights dtype."""
        if not self.quantization:
            return ""
        roles = self.quantized or DEFAULT_QUANTIZED.get(self.quantization, QUANT_ROLES)
        return self.quantization if role in roles else ""

    def linear_bytes(self, role: str = "attn") -> float:
        """Bytes per parameter of one role's linear layers (QUANT_ROLES), scales included."""
        fmt = self.weight_format(role)
        if fmt == "int4" and self.quant_group_size:
            return 0.5 + 2 / self.quant_group_size
        return QUANT_FORMATS[fmt] if fmt else DTYPE_BYTES[self.dtype]

    def group_bytes(self) -> ParamGroups:
        """param_groups in bytes (float: quantisation scales are fractions of a byte a parameter)."""
        p, a, attn = self.param_groups(), self.activation_bytes, self.linear_bytes("attn")
        return ParamGroups(embed=p.embed * a, lm_head=p.lm_head * a, attn=p.attn * attn, attn_kv=p.attn_kv * attn,
                           attn_replicated=p.attn_replicated * attn, dense_mlp=p.dense_mlp * self.linear_bytes("mlp"),
                           shared_experts=p.shared_experts * self.linear_bytes("shared"),
                           experts=p.experts * self.linear_bytes("experts"), small=p.small * a, encoder=p.encoder * a)

    @property
    def weight_bytes(self) -> int:
        return round(self.group_bytes().total)

    @property
    def gemm_dtype(self) -> str:
        """The GEMMs' input dtype (the roofline's peak): fp8 weights run fp8 GEMMs; 4-bit formats are priced at
        the 16-bit peak (weight-only kernels dequantise; the datasheets give no FP4 dense peak kvsim keeps)."""
        return "fp8" if self.dtype == "fp8" or self.quantization in ("fp8", "fp8_tensor") else "bfloat16"

    # ---- FLOPs -------------------------------------------------------------------------------
    @property
    def active_layer_params(self) -> int:
        """Matmul parameters one token goes through in the layers: attention, dense MLPs, and in MoE
        layers the router, the shared experts and num_experts_per_tok routed experts."""
        p = self.num_hidden_layers * self.attn_params_per_layer + self.num_dense_layers * self.mlp_params_per_layer
        if self.moe:
            p += self.num_moe_layers * (self.router_params + self.shared_expert_params
                                        + self.moe.num_experts_per_tok * self.expert_params)
        return p

    @property
    def params_per_token_flops(self) -> int:
        """FLOPs of every matmul for one token: 2 x (active layer projections + lm_head); embedding is a gather."""
        return 2 * (self.active_layer_params + self.lm_head_params)

    def gemm_flops(self, num_tokens: int, num_logits: int) -> float:
        """Matmul FLOPs of a forward pass: every token goes through the layers, but only the
        `num_logits` rows that get sampled go through lm_head (one per scheduled sequence)."""
        lm_head = 2 * self.lm_head_params
        return (self.params_per_token_flops - lm_head) * num_tokens + lm_head * num_logits

    def attention_flops(self, attn_pairs: int) -> float:
        """QK^T and PV: a multiply-add per query-key pair per head and q/k (then v) dimension, in every
        layer (MLA as its prefill computes it, over the expanded per-head K and V)."""
        return 2.0 * self.num_hidden_layers * self.num_attention_heads * (self.head_dim + self.v_head_dim) * attn_pairs
