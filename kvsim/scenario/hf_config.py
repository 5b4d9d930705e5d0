"""A `ModelSpec` from a Hugging Face config.json, read the way transformers' config classes and vLLM
v0.11.0's model files read it, or one line naming the file and key at fault.

- Multimodal checkpoints (gemma-3, Llama-4) keep the language model under `text_config`; the vision
  encoder vLLM also loads is counted from `vision_config` (a ViT: `encoder_params`).
- Attention per layer: `layer_types` when given; else gemma-2 (every other layer sliding), gemma-3
  (`sliding_window_pattern`, 5 sliding : 1 full), Llama-4 (chunked-local except every
  `no_rope_layers` 0, which keeps full attention); else a `sliding_window` makes every layer sliding
  (Mistral-7B-v0.1; vLLM sets the model-level window when the model is not interleaved), unless
  Qwen's `use_sliding_window` is false.
- Mixture-of-experts: `n_routed_experts` (DeepSeek: `n_shared_experts`, `first_k_dense_replace`,
  `moe_layer_freq`), `num_experts` (Qwen-MoE: `decoder_sparse_step`, `mlp_only_layers`,
  `shared_expert_intermediate_size`) or `num_local_experts` (Mixtral, gpt-oss, Llama-4: one shared
  expert, `interleave_moe_layer_step`); expert size `moe_intermediate_size`, else `intermediate_size`.
- Multi-head latent attention: `kv_lora_rank` with its rope, nope and v head sizes.
- Weights as shipped: `quantization_config` (top level or text_config's) read by
  kvsim.scenario.hf_quant: fp8 (block or per tensor), MXFP4, NVFP4, int4 weight-only, per role.
- MiniMax-M2: every layer MoE (`num_local_experts`, expert size `intermediate_size`), RMSNorm on q and k
  over all heads (`qk_norm_type` "per_layer"); `attn_type_list` 0 (lightning attention) is refused.
- Linear-attention and Mamba hybrids (Qwen3-Next, Jamba, Falcon-H1, Nemotron-H) and DeepSeek's
  sparse-attention indexer are refused, naming the key.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.scenario.files import read_json_object
from kvsim.scenario.hf_quant import checkpoint_quant, with_modelopt_file
from kvsim.scenario.limits import MAX_MODEL_LEN
from kvsim.scenario.models import CHUNKED, FULL, LAYER_TYPES, SLIDING, MlaSpec, ModelSpec, MoeSpec

_WANT = {int: "a positive integer", float: "a positive number", bool: "true or false"}
# Upper bounds of the config.json integers kvsim reads: far above any published model.
_MAX_INT = {"num_hidden_layers": 1024, "hidden_size": 2**20, "num_attention_heads": 2**14,
            "num_key_value_heads": 2**14, "head_dim": 2**14, "intermediate_size": 2**22, "vocab_size": 2**24,
            "max_position_embeddings": MAX_MODEL_LEN, "sliding_window": MAX_MODEL_LEN,
            "attention_chunk_size": MAX_MODEL_LEN, "experts": 2**16, "num_experts_per_tok": 2**16,
            "moe_intermediate_size": 2**22, "kv_lora_rank": 2**16, "q_lora_rank": 2**16}
_MAX_FLOAT = {"rope_theta": 1e15, "rms_norm_eps": 1.0}

# Keys of architectures kvsim does not model: a reading without them would misstate weights or KV bytes.
_UNSUPPORTED = {
    "linear_num_value_heads": "linear-attention layers (Qwen3-Next's Gated DeltaNet)",
    "mamba_d_state": "Mamba layers (Jamba)", "mamba_d_ssm": "Mamba layers (Falcon-H1)",
    "mamba_n_heads": "Mamba layers", "hybrid_override_pattern": "Mamba layers (Nemotron-H)",
    "ssm_cfg": "state-space layers", "index_topk": "DeepSeek sparse attention (its indexer keeps a cache of its own)",
}
# transformers' config-class defaults for keys the published configs leave out.
_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "rope_theta": 1_000_000.0,
                    "rms_norm_eps": 1e-6, "sliding_window_pattern": 6, "sliding_window": 4096},
    "gemma2": {"sliding_window": 4096},
}
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}  # tie_word_embeddings defaults to true
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "minimax_m2"}
_SANDWICH_NORMS = {"gemma2", "gemma3", "gemma3_text"}
_QWEN = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}


class _Config:
    """A config.json's language-model keys (text_config first), checked as they are read."""

    def __init__(self, cfg: dict, source: str):
        text = cfg.get("text_config")
        self.top, self.cfg = cfg, text if isinstance(text, dict) else cfg
        self.src = source
        self.model_type = str(self.cfg.get("model_type") or cfg.get("model_type") or "")
        self.defaults = _DEFAULTS.get(self.model_type, {})

    def raw(self, key: str):
        value = self.cfg.get(key)
        return self.defaults.get(key) if value is None else value

    def get(self, key: str, kind: type = int, default=None, bound: str | None = None):
        """cfg[key] checked against `kind`, positive and within its bound; a missing key needs a default."""
        value = self.raw(key)
        if value is None:
            if default is None:
                raise KvsimError(f"{self.src}: missing key '{key}'")
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        bad_bool = isinstance(value, bool) and kind is not bool
        if bad_bool or not isinstance(value, kind) or (kind is not bool and not value > 0):
            raise KvsimError(f"{self.src}: {key}: must be {_WANT[kind]}, got {str(value)[:40]}")
        limit = (_MAX_INT if kind is int else _MAX_FLOAT).get(bound or key) if kind is not bool else None
        if limit is not None and value > limit:
            raise KvsimError(f"{self.src}: {key}: must be at most {limit:,}, got {value:,}")
        return value

    def int_list(self, key: str, length: int | None = None) -> list:
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value) \
                or (length is not None and len(value) != length):
            want = f"a list of {length} integers" if length is not None else "a list of integers"
            raise KvsimError(f"{self.src}: {key}: must be {want}")
        return value


def load_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a folder holding one), checked for consistency."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    raw = with_modelopt_file(read_json_object(path, "model config (model.hf_config)"), path.parent)
    c = _Config(raw, str(path))
    _refuse_unsupported(c)
    hidden, heads = c.get("hidden_size"), c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads", int, heads)
    mla = _mla(c)
    if mla is None and c.raw("head_dim") is None and hidden % heads:
        raise KvsimError(f"{c.src}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                         f"(give head_dim)")
    if heads % kv_heads:
        raise KvsimError(f"{c.src}: num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}")
    head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla else c.get("head_dim", int, hidden // heads)
    layers = c.get("num_hidden_layers")
    moe = _moe(c, layers)
    dense_size = c.raw("intermediate_size_mlp") and c.get("intermediate_size_mlp", bound="intermediate_size")
    layer_types = _layer_types(c, layers)
    quant = _quantization(c, layers, moe)
    qk_norm = c.model_type in _QK_NORM and c.get("use_qk_norm", bool, True)
    return ModelSpec(
        name=name or (path.parent.name if path.name == "config.json" and path.parent.name else path.stem),
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, intermediate_size=dense_size or c.get("intermediate_size"),
        vocab_size=c.get("vocab_size"), max_position_embeddings=c.get("max_position_embeddings"),
        rope_theta=c.get("rope_theta", float, 10000.0), rms_norm_eps=c.get("rms_norm_eps", float, 1e-5),
        tie_word_embeddings=c.get("tie_word_embeddings", bool, c.model_type in _TIED_BY_DEFAULT),
        qk_norm=qk_norm, qk_norm_per_layer=qk_norm and c.raw("qk_norm_type") == "per_layer",
        layer_types=layer_types if any(t != FULL for t in layer_types) else (),
        sliding_window=c.get("sliding_window") if SLIDING in layer_types else 0,
        attention_chunk_size=c.get("attention_chunk_size") if CHUNKED in layer_types else 0,
        attention_bias=c.get("attention_bias", bool, False), sandwich_norms=c.model_type in _SANDWICH_NORMS,
        mla=mla, moe=moe, quantization=quant.format if quant else "", quantized=quant.roles if quant else (),
        quant_group_size=quant.group_size if quant else 0, encoder_params=_encoder_params(c, hidden),
        num_nextn_predict_layers=_mtp_layers(c, layers))


def _mtp_layers(c: _Config, layers: int) -> int:
    """Multi-token-prediction layers (DeepSeek-V3, GLM-4.5: num_nextn_predict_layers; Qwen3-Next:
    mtp_num_hidden_layers; MiMo: num_nextn_predict_layers too), 0 when the config has none."""
    key = next((k for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers") if c.raw(k)), None)
    return c.get(key, bound="num_hidden_layers") if key else 0


def _refuse_unsupported(c: _Config) -> None:
    for key, what in _UNSUPPORTED.items():
        if c.cfg.get(key) not in (None, 0, False):
            raise KvsimError(f"{c.src}: {key}: {what} are not supported (kvsim models full, sliding-window, "
                             f"chunked-local and latent attention)")
    kinds = c.cfg.get("attn_type_list")  # MiniMax: 1 softmax attention, 0 lightning (linear) attention
    if isinstance(kinds, list) and any(k == 0 for k in kinds):
        raise KvsimError(f"{c.src}: attn_type_list: lightning (linear) attention layers are not supported (kvsim "
                         f"models full, sliding-window, chunked-local and latent attention)")


def _layer_types(c: _Config, layers: int) -> tuple[str, ...]:
    given = c.raw("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != layers:
            raise KvsimError(f"{c.src}: layer_types: must be a list of num_hidden_layers ({layers}) names")
        bad = next((t for t in given if t not in LAYER_TYPES), None)
        if bad is not None:
            raise KvsimError(f"{c.src}: layer_types: {str(bad)[:40]!r} layers are not supported "
                             f"(kvsim models {', '.join(LAYER_TYPES)})")
        return tuple(given)
    if c.model_type == "gemma2":
        return tuple(SLIDING if (i + 1) % 2 else FULL for i in range(layers))
    if c.model_type == "gemma3_text":
        key = "_sliding_window_pattern" if c.raw("_sliding_window_pattern") is not None else "sliding_window_pattern"
        pattern = c.get(key, bound="num_hidden_layers")
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers))
    if c.raw("attention_chunk_size") is not None:  # Llama-4: NoPE layers (no_rope_layers 0) keep full attention
        # an empty no_rope_layers (Llama-4-Scout's published config) means the default, as in transformers
        given = c.raw("no_rope_layers")
        rope = c.int_list("no_rope_layers", layers) if given else [int((i + 1) % 4 != 0) for i in range(layers)]
        return tuple(CHUNKED if r else FULL for r in rope)
    if c.raw("sliding_window") is None:
        return (FULL,) * layers
    if c.model_type in _QWEN:  # Qwen: only with use_sliding_window, from max_window_layers on
        if not c.get("use_sliding_window", bool, False):
            return (FULL,) * layers
        first = c.get("max_window_layers", int, 28, bound="num_hidden_layers")
        return tuple(SLIDING if i >= first else FULL for i in range(layers))
    return (SLIDING,) * layers


def _mla(c: _Config) -> MlaSpec | None:
    if not c.raw("kv_lora_rank"):
        return None
    q_lora = c.raw("q_lora_rank")
    return MlaSpec(kv_lora_rank=c.get("kv_lora_rank"), qk_rope_head_dim=c.get("qk_rope_head_dim", bound="head_dim"),
                   qk_nope_head_dim=c.get("qk_nope_head_dim", bound="head_dim"),
                   v_head_dim=c.get("v_head_dim", bound="head_dim"), q_lora_rank=c.get("q_lora_rank") if q_lora else 0)


def _moe(c: _Config, layers: int) -> MoeSpec | None:
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts") if c.raw(k) is not None), None)
    if key is None or c.raw(key) in (0, 1):
        return None
    experts = c.get(key, bound="experts")
    top_k_key = "num_experts_per_tok" if c.raw("num_experts_per_tok") is not None else "experts_per_token"
    top_k = c.get(top_k_key, bound="num_experts_per_tok")
    if top_k > experts:
        raise KvsimError(f"{c.src}: {top_k_key}: {top_k} is more than the {experts} experts ({key})")
    size = c.get("moe_intermediate_size") if c.raw("moe_intermediate_size") is not None else c.get("intermediate_size")
    return MoeSpec(n_routed_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=size,
                   shared_expert_intermediate_size=_shared_size(c, size), dense_layers=_dense_layers(c, layers),
                   router_bias=c.model_type == "gpt_oss" or c.raw("topk_method") == "noaux_tc"
                   or c.raw("use_routing_bias") is True,
                   expert_bias=c.model_type == "gpt_oss")


def _shared_size(c: _Config, expert_size: int) -> int:
    if c.raw("n_shared_experts"):  # DeepSeek
        return c.get("n_shared_experts", bound="experts") * expert_size
    if c.raw("shared_expert_intermediate_size"):  # Qwen2-MoE
        return c.get("shared_expert_intermediate_size", bound="intermediate_size")
    return expert_size if c.model_type.startswith("llama4") else 0  # Llama-4: one shared expert


def _dense_layers(c: _Config, layers: int) -> tuple[int, ...]:
    """Layers whose MLP is dense, by each family's rule (transformers' and vLLM's model files)."""
    if c.raw("first_k_dense_replace") is not None or c.raw("moe_layer_freq") is not None:  # DeepSeek
        first = c.raw("first_k_dense_replace") or 0
        first = first and c.get("first_k_dense_replace", bound="num_hidden_layers")
        freq = c.get("moe_layer_freq", int, 1, bound="num_hidden_layers")
        return tuple(i for i in range(layers) if i < first or i % freq)
    if c.raw("decoder_sparse_step") is not None or c.raw("mlp_only_layers"):  # Qwen-MoE
        step = c.get("decoder_sparse_step", int, 1, bound="num_hidden_layers")
        only = set(c.int_list("mlp_only_layers"))
        return tuple(i for i in range(layers) if i in only or (i + 1) % step)
    if c.raw("moe_layers") is not None:  # Llama-4, explicit
        moe = set(c.int_list("moe_layers"))
        return tuple(i for i in range(layers) if i not in moe)
    if c.raw("interleave_moe_layer_step") is not None:  # Llama-4
        step = c.get("interleave_moe_layer_step", bound="num_hidden_layers")
        return tuple(i for i in range(layers) if (i + 1) % step)
    return ()


def _quantization(c: _Config, layers: int, moe: MoeSpec | None):
    """The checkpoint's weight format and the roles it covers (kvsim.scenario.hf_quant), or None."""
    dense = set(moe.dense_layers) if moe else set(range(layers))
    sparse = [i for i in range(layers) if i not in dense]
    role_layers = {"attn": range(layers), "mlp": sorted(dense), "shared": sparse, "experts": sparse}
    return checkpoint_quant(c.top, c.cfg if c.cfg is not c.top else {}, c.src, role_layers)


def _encoder_params(c: _Config, text_hidden: int) -> int:
    """A ViT's parameters from vision_config (attention and MLP with biases, two LayerNorms a layer,
    patch and position embeddings) plus a projector into the language model's hidden size: an
    estimate, since encoders differ in their adapters."""
    v = c.top.get("vision_config")
    if not isinstance(v, dict) or c.cfg is c.top:
        return 0
    sub = _Config(v, f"{c.src}: vision_config")
    if v.get("vt_hidden_size") is not None:
        return _moonvit_params(sub, text_hidden)
    h, inter = sub.get("hidden_size"), sub.get("intermediate_size")
    layers = sub.get("num_hidden_layers") if v.get("num_hidden_layers") is not None else sub.get("depth")
    patch, image = sub.get("patch_size", int, 14), sub.get("image_size", int, 224)
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    embed = 3 * patch * patch * h + h + (image // patch) ** 2 * h + 2 * h
    out = v.get("projector_output_dim") if isinstance(v.get("projector_output_dim"), int) else h
    return layers * per_layer + embed + out * text_hidden


def _moonvit_params(v: _Config, text_hidden: int) -> int:
    """Kimi-K2.5's MoonViT (`vt_*` keys): ViT layers as above, patch and learnt 2D position embeddings
    (init_pos_emb_height x width), a final LayerNorm, and the patch merger (LayerNorm, then two linears from
    merge_kernel_size's patches into the language model's hidden size): an estimate, as above."""
    h, inter = v.get("vt_hidden_size", bound="hidden_size"), v.get("vt_intermediate_size", bound="intermediate_size")
    layers = v.get("vt_num_hidden_layers", bound="num_hidden_layers")
    patch = v.get("patch_size", int, 14, bound="head_dim")
    grid = v.get("init_pos_emb_height", int, 64, bound="head_dim") * v.get("init_pos_emb_width", int, 64,
                                                                            bound="head_dim")
    merge = v.int_list("merge_kernel_size") or [2, 2]
    m = h * merge[0] * merge[-1]
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    return layers * per_layer + 3 * patch * patch * h + h + grid * h + 2 * h + 2 * h + m * m + m + m * text_hidden \
        + text_hidden
