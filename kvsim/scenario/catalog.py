"""Model and GPU presets: the shapes and datasheet figures every sizing and timing model starts from.

`ModelSpec` uses Hugging Face `config.json` field names, so a preset and a loaded config are the same
object. `GpuSpec` holds dense (non-sparse) datasheet rates and the memory the device reports.
`model_spec(scenario)` and `gpu_spec(scenario)` turn a scenario's [model] and [hardware] sections
into specs, or raise `KvsimError` naming the file and key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.scenario.files import read_json_object
from kvsim.scenario.limits import MAX_MODEL_LEN

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A dense decoder-only transformer (Llama / Qwen / Mistral family: GQA attention, SwiGLU MLP)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    dtype: str = "bfloat16"  # weights dtype (from ModelConfig.dtype)

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v and o projections (no biases)."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size

    @property
    def mlp_params_per_layer(self) -> int:
        """gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        per_layer = self.attn_params_per_layer + self.mlp_params_per_layer + norms
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.lm_head_params + self.num_hidden_layers * per_layer + self.hidden_size + head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * DTYPE_BYTES[self.dtype]

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: fp8 models still compute in 16-bit, fp32 models in fp32."""
        return 4 if self.dtype == "float32" else 2

    @property
    def params_per_token_flops(self) -> int:
        """FLOPs of every matmul for one token: 2 x (layer projections + lm_head); embedding is a gather."""
        return 2 * (self.num_hidden_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)
                    + self.lm_head_params)

    def gemm_flops(self, num_tokens: int, num_logits: int) -> float:
        """Matmul FLOPs of a forward pass: every token goes through the layers, but only the
        `num_logits` rows that get sampled go through lm_head (one per scheduled sequence)."""
        lm_head = 2 * self.lm_head_params
        return (self.params_per_token_flops - lm_head) * num_tokens + lm_head * num_logits

    def attention_flops(self, attn_pairs: int) -> float:
        """QK^T and PV: 2 multiply-adds per query-key pair per head dimension, in every layer."""
        return 4.0 * self.num_hidden_layers * self.num_attention_heads * self.head_dim * attn_pairs


def _preset(name, layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_pos, theta, eps, tie=False, qk=False):
    return ModelSpec(name=name, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=inter,
                     vocab_size=vocab, max_position_embeddings=max_pos, rope_theta=theta, rms_norm_eps=eps,
                     tie_word_embeddings=tie, qk_norm=qk)


# Shapes from each model's config.json on the Hugging Face Hub.
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _preset("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0, 1e-5),
    _preset("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 500000.0, 1e-5),
    _preset("Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 1e-6, tie=True, qk=True),
    _preset("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1000000.0, 1e-6, qk=True),
    _preset("Mistral-7B", 32, 4096, 32, 8, 128, 14336, 32768, 32768, 1000000.0, 1e-5),  # v0.3
)}


_WANT = {int: "a positive integer", float: "a positive number", bool: "true or false"}
# Upper bounds of the config.json integers kvsim reads: far above any published model.
_MAX_INT = {"num_hidden_layers": 1024, "hidden_size": 2**20, "num_attention_heads": 2**14,
            "num_key_value_heads": 2**14, "head_dim": 2**14, "intermediate_size": 2**22, "vocab_size": 2**24,
            "max_position_embeddings": MAX_MODEL_LEN}
_MAX_FLOAT = {"rope_theta": 1e15, "rms_norm_eps": 1.0}


def _get(cfg: dict, key: str, source: str, kind: type, default=None):
    """cfg[key] checked against `kind`, positive and within its bound; a missing key needs a default."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise KvsimError(f"{source}: missing key '{key}'")
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    bad_bool = isinstance(value, bool) and kind is not bool
    if bad_bool or not isinstance(value, kind) or (kind is not bool and not value > 0):
        raise KvsimError(f"{source}: {key}: must be {_WANT[kind]}, got {str(value)[:40]}")
    bound = _MAX_INT.get(key) if kind is int else _MAX_FLOAT.get(key)
    if bound is not None and value > bound:
        raise KvsimError(f"{source}: {key}: must be at most {bound:,}, got {value:,}")
    return value


# config.json keys of architectures kvsim does not model: a dense reading would misstate weights or KV bytes.
_NOT_DENSE = {"num_local_experts": "mixture-of-experts", "num_experts": "mixture-of-experts",
              "n_routed_experts": "mixture-of-experts", "kv_lora_rank": "multi-head latent attention (MLA)"}


def _check_dense(cfg: dict, source: str) -> None:
    for key, kind in _NOT_DENSE.items():
        value = cfg.get(key)
        if value not in (None, 0, 1, False):
            raise KvsimError(f"{source}: {key}: {kind} models are not supported (kvsim models dense decoder-only "
                             f"transformers)")


def load_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a folder holding one), checked for consistency."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = read_json_object(path, "model config (model.hf_config)")
    src = str(path)
    hidden = _get(cfg, "hidden_size", src, int)
    heads = _get(cfg, "num_attention_heads", src, int)
    kv_heads = _get(cfg, "num_key_value_heads", src, int, heads)
    if cfg.get("head_dim") is None and hidden % heads:
        raise KvsimError(f"{src}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                         f"(give head_dim)")
    if heads % kv_heads:
        raise KvsimError(f"{src}: num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}")
    _check_dense(cfg, src)
    return ModelSpec(
        name=name or (path.parent.name if path.name == "config.json" and path.parent.name else path.stem),
        num_hidden_layers=_get(cfg, "num_hidden_layers", src, int),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_get(cfg, "head_dim", src, int, hidden // heads),
        intermediate_size=_get(cfg, "intermediate_size", src, int),
        vocab_size=_get(cfg, "vocab_size", src, int),
        max_position_embeddings=_get(cfg, "max_position_embeddings", src, int),
        rope_theta=_get(cfg, "rope_theta", src, float, 10000.0),
        rms_norm_eps=_get(cfg, "rms_norm_eps", src, float, 1e-5),
        tie_word_embeddings=_get(cfg, "tie_word_embeddings", src, bool, False),
        qk_norm=cfg.get("model_type") == "qwen3",
    )


def tp_problem(model: ModelSpec, tp: int) -> str:
    """Why vLLM would refuse `tp` GPUs for this model ('' if it would not): tp must divide the
    attention heads (ModelConfig.verify_with_parallel_config), and the KV heads must split evenly
    over the GPUs or, when tp exceeds them, be replicated evenly (QKVParallelLinear)."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if heads % tp:
        return f"{tp} does not divide {model.name}'s {heads} attention heads"
    if (kv % tp) if tp < kv else (tp % kv):
        return f"{tp} GPUs cannot share {model.name}'s {kv} KV heads evenly"
    return ""


def model_spec(scenario) -> ModelSpec:
    """The scenario's model: a preset (case-insensitive) or its hf_config, in the scenario's dtype,
    checked against hardware.tensor_parallel_size."""
    cfg = scenario.model
    if cfg.name is not None:
        spec = {k.lower(): v for k, v in MODELS.items()}.get(cfg.name.lower())
        if spec is None:
            raise KvsimError(f"{scenario.source}: model.name: unknown model '{cfg.name}' "
                             f"(presets: {', '.join(MODELS)}; or give model.hf_config)")
    else:
        spec = load_hf_config(scenario.resolve(cfg.hf_config))
    problem = tp_problem(spec, scenario.hardware.tensor_parallel_size)
    if problem:
        raise KvsimError(f"{scenario.source}: hardware.tensor_parallel_size: {problem}")
    return replace(spec, dtype=cfg.dtype)


@dataclass(slots=True, frozen=True)
class GpuSpec:
    """One GPU. Rates are dense (no 2:4 sparsity); link bandwidths are GB/s in one direction."""

    name: str
    memory_gib: float  # as the device reports it (nvidia-smi MiB / 1024)
    hbm_bandwidth_gbps: float
    bf16_tflops: float
    fp8_tflops: float
    fp32_tflops: float  # non-tensor-core rate, for dequantization work
    nvlink_gbps: float  # GPU-to-GPU, per direction (datasheets quote both directions: half of that)
    pcie_gbps: float  # host link, per direction
    # What the CUDA runtime reports as total (torch.cuda.mem_get_info): vLLM sizes the KV cache
    # from this, a little below nvidia-smi's figure. 0: the same as memory_gib.
    cuda_memory_gib: float = 0.0
    num_sms: int = 132  # streaming multiprocessors (AMD: compute units): how many programs a kernel runs at once

    def __post_init__(self):
        if not self.cuda_memory_gib:
            object.__setattr__(self, "cuda_memory_gib", self.memory_gib)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


# Sources: NVIDIA A100 / H100 / H200 / L40S / HGX B200 datasheets, AMD Instinct MI300X datasheet;
# memory totals from nvidia-smi (MiB) and rocm-smi (bytes) on the real devices. cuda_memory_gib, the
# total torch.cuda.mem_get_info reports (what vLLM multiplies by gpu_memory_utilization): H100
# 85,017,493,504 B and H200 150,109,880,320 B measured on this workplace's GPUs (driver 580; public
# vLLM logs print "total_gpu_memory (79.11-79.33GiB)" and "(139.81GiB)"); A100-80GB 79.15 GiB and
# L40S 44.52 GiB from PyTorch's out-of-memory messages on those cards ("79.15 GiB total capacity",
# "a total capacity of 44.52 GiB"); B200: not measured, nvidia-smi's total less the 0.6 GiB the
# H200 loses; MI300X: rocm-smi's total, which HIP reports too. SM (CU) counts from the architecture
# whitepapers (H100 SXM5 132 of GH100's 144, A100 108, L40S 142, B200 148, MI300X 304).
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    # A100 SXM 80GB: 312 TF bf16, no fp8 units; NVLink3 600 GB/s total; PCIe Gen4 x16.
    GpuSpec("A100-80GB", 81920 / 1024, 2039.0, 312.0, 312.0, 19.5, 300.0, 32.0, 79.15, 108),
    # H100 SXM5: 989.4 TF bf16, 1978.9 fp8 dense; HBM3 3.35 TB/s; NVLink4 900 GB/s total; PCIe Gen5.
    GpuSpec("H100-SXM", 81559 / 1024, 3350.0, 989.4, 1978.9, 66.9, 450.0, 64.0, 85017493504 / 2**30, 132),
    # H200 SXM: H100 compute with 141 GB HBM3e at 4.8 TB/s.
    GpuSpec("H200", 143771 / 1024, 4800.0, 989.4, 1978.9, 66.9, 450.0, 64.0, 150109880320 / 2**30, 132),
    # L40S: 362 TF bf16, 733 fp8 dense; GDDR6 864 GB/s; no NVLink, so tensor parallel runs over PCIe Gen4.
    GpuSpec("L40S", 46068 / 1024, 864.0, 362.05, 733.0, 91.6, 32.0, 32.0, 44.52, 142),
    # B200 (HGX): 2.25 PF bf16, 4.5 PF fp8 dense; HBM3e 8 TB/s; NVLink5 1.8 TB/s total.
    GpuSpec("B200", 183359 / 1024, 8000.0, 2250.0, 4500.0, 75.0, 900.0, 64.0, 183359 / 1024 - 0.6, 148),
    # MI300X: 1307.4 TF bf16, 2614.9 fp8 dense, 163.4 fp32 vector; 5.3 TB/s; 7 Infinity Fabric links x 64 GB/s.
    GpuSpec("MI300X", 206141652992 / 2**30, 5300.0, 1307.4, 2614.9, 163.4, 448.0, 64.0, 206141652992 / 2**30, 304),
)}


@dataclass(slots=True, frozen=True)
class GpuPrice:
    usd_per_hour: float  # one GPU, on demand
    source: str
    date: str


# On-demand list prices of one GPU in a multi-GPU cloud instance, US regions. Prices move monthly and
# differ 2x between clouds: set your own in the scenario's [cost] section (cost.gpu_hour_usd).
_LISTED = "representative on-demand list price per GPU (GPU cloud price pages: Lambda, RunPod, CoreWeave)"
GPU_PRICES: dict[str, GpuPrice] = {
    "A100-80GB": GpuPrice(1.79, _LISTED, "2025-06"),
    "H100-SXM": GpuPrice(2.99, _LISTED, "2025-06"),
    "H200": GpuPrice(3.79, _LISTED, "2025-06"),
    "L40S": GpuPrice(0.99, _LISTED, "2025-06"),
    "B200": GpuPrice(5.99, _LISTED, "2025-06"),
    "MI300X": GpuPrice(2.49, _LISTED, "2025-06"),
}


def gpu_price(scenario, gpu: str) -> GpuPrice | None:
    """The hourly price of one `gpu`: the scenario's [cost] section first, then GPU_PRICES."""
    cost = getattr(scenario, "cost", None)
    if cost is not None:
        for name, usd in cost.gpu_hour_usd.items():
            if name.lower() == gpu.lower():
                return GpuPrice(usd, cost.source or f"{scenario.source} [cost]", cost.date or "")
    return {k.lower(): v for k, v in GPU_PRICES.items()}.get(gpu.lower())


def gpu_spec(scenario) -> GpuSpec:
    """The scenario's GPU preset (case-insensitive) with any [hardware] overrides applied."""
    hw = scenario.hardware
    spec = {k.lower(): v for k, v in GPUS.items()}.get(hw.gpu.lower())
    if spec is None:
        raise KvsimError(f"{scenario.source}: hardware.gpu: unknown GPU '{hw.gpu}' (presets: {', '.join(GPUS)})")
    overrides = {f.name: getattr(hw, f.name) for f in fields(GpuSpec)
                 if f.name != "name" and getattr(hw, f.name, None) is not None}
    if "memory_gib" in overrides:  # a GPU of another size: it reports that size
        overrides.setdefault("cuda_memory_gib", overrides["memory_gib"])
    return replace(spec, **overrides)
