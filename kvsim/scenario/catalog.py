"""Model and GPU presets: the shapes and datasheet figures every sizing and timing model starts from.

`ModelSpec` (kvsim/scenario/models.py) uses Hugging Face `config.json` field names, so a preset and a
loaded config (kvsim/scenario/hf_config.py) are the same object: dense and mixture-of-experts models,
full, sliding-window, chunked-local and latent attention. `GpuSpec` holds dense (non-sparse)
datasheet rates and the memory the device reports.
`model_spec(scenario)` and `gpu_spec(scenario)` turn a scenario's [model] and [hardware] sections
into specs, or raise `KvsimError` naming the file and key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kvsim.errors import KvsimError
from kvsim.scenario.hf_config import load_hf_config  # noqa: F401  (re-exported)
from kvsim.scenario.models import CHUNKED, DTYPE_BYTES, FULL, SLIDING, MlaSpec, ModelSpec, MoeSpec  # noqa: F401


def _preset(name, layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_pos, theta, eps, tie=False, qk=False,
            **more):
    return ModelSpec(name=name, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=inter,
                     vocab_size=vocab, max_position_embeddings=max_pos, rope_theta=theta, rms_norm_eps=eps,
                     tie_word_embeddings=tie, qk_norm=qk, **more)


def _every(n: int, layers: int, other: str, nth: str = FULL) -> tuple[str, ...]:
    """Layer types with every n-th layer (1-based) `nth` and the rest `other`."""
    return tuple(other if (i + 1) % n else nth for i in range(layers))


_DEEPSEEK_V3 = dict(mla=MlaSpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                q_lora_rank=1536),
                    moe=MoeSpec(256, 8, 2048, shared_expert_intermediate_size=2048, dense_layers=(0, 1, 2),
                                router_bias=True),
                    quantization="fp8", num_nextn_predict_layers=1)
_GPT_OSS = dict(sliding_window=128, attention_bias=True, quantization="mxfp4")
_GPT_OSS_MOE = dict(router_bias=True, expert_bias=True)
_GEMMA = dict(tie=True, sandwich_norms=True)
# Vision encoders vLLM loads with the multimodal checkpoints (hf_config's ViT estimate from vision_config):
# SigLIP (gemma-3: 27 layers of 1152) and Llama-4's (34 layers of 1408), each with its projector; Kimi-K2.5's
# MoonViT (27 layers of 1152) and its patch merger.
GEMMA3_VISION_PARAMS, LLAMA4_VISION_PARAMS, KIMI_VISION_PARAMS = 423_059_184, 832_082_304, 471_143_920
# Kimi-K2.5 as Moonshot ships it: DeepSeek-V3's layout with 64 heads and 384 experts, the routed experts int4
# weight-only (compressed-tensors, a bf16 scale per 32), attention, the dense MLP and the shared expert bf16
_KIMI_K25 = dict(mla=MlaSpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                             q_lora_rank=1536),
                 moe=MoeSpec(384, 8, 2048, shared_expert_intermediate_size=2048, dense_layers=(0,), router_bias=True),
                 quantization="int4", quantized=("experts",), quant_group_size=32, encoder_params=KIMI_VISION_PARAMS)

# Shapes from each model's config.json on the Hugging Face Hub (copies in tests/fixtures/hf_configs/).
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _preset("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0, 1e-5),
    _preset("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 500000.0, 1e-5),
    _preset("Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 1e-6, tie=True, qk=True),
    _preset("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1000000.0, 1e-6, qk=True),
    _preset("Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, 40960, 1000000.0, 1e-6, qk=True),
    _preset("Mistral-7B", 32, 4096, 32, 8, 128, 14336, 32768, 32768, 1000000.0, 1e-5),  # v0.3
    _preset("Mistral-7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 10000.0, 1e-5,
            layer_types=(SLIDING,) * 32, sliding_window=4096),
    _preset("Mixtral-8x7B", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1000000.0, 1e-5, moe=MoeSpec(8, 2, 14336)),
    _preset("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1000000.0, 1e-6, qk=True,
            moe=MoeSpec(128, 8, 768)),
    _preset("Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 12288, 151936, 40960, 1000000.0, 1e-6, qk=True,
            moe=MoeSpec(128, 8, 1536)),
    _preset("DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280, 163840, 10000.0, 1e-6, **_DEEPSEEK_V3),
    _preset("DeepSeek-R1", 61, 7168, 128, 128, 192, 18432, 129280, 163840, 10000.0, 1e-6, **_DEEPSEEK_V3),
    _preset("gpt-oss-20b", 24, 2880, 64, 8, 64, 2880, 201088, 131072, 150000.0, 1e-5,
            layer_types=(SLIDING, FULL) * 12, moe=MoeSpec(32, 4, 2880, **_GPT_OSS_MOE), **_GPT_OSS),
    _preset("gpt-oss-120b", 36, 2880, 64, 8, 64, 2880, 201088, 131072, 150000.0, 1e-5,
            layer_types=(SLIDING, FULL) * 18, moe=MoeSpec(128, 4, 2880, **_GPT_OSS_MOE), **_GPT_OSS),
    _preset("Llama-4-Scout", 48, 5120, 40, 8, 128, 16384, 202048, 10485760, 500000.0, 1e-5,
            layer_types=_every(4, 48, CHUNKED), attention_chunk_size=8192,
            moe=MoeSpec(16, 1, 8192, shared_expert_intermediate_size=8192), encoder_params=LLAMA4_VISION_PARAMS),
    _preset("gemma-2-9b", 42, 3584, 16, 8, 256, 14336, 256000, 8192, 10000.0, 1e-6,
            layer_types=_every(2, 42, SLIDING), sliding_window=4096, **_GEMMA),
    _preset("gemma-2-27b", 46, 4608, 32, 16, 128, 36864, 256000, 8192, 10000.0, 1e-6,
            layer_types=_every(2, 46, SLIDING), sliding_window=4096, **_GEMMA),
    _preset("gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 262208, 131072, 1000000.0, 1e-6, qk=True,
            layer_types=_every(6, 62, SLIDING), sliding_window=1024, encoder_params=GEMMA3_VISION_PARAMS, **_GEMMA),
    _preset("Kimi-K2.5", 61, 7168, 64, 64, 192, 18432, 163840, 262144, 50000.0, 1e-5, **_KIMI_K25),
    # MiniMax-M2.5 as shipped: 128x128-block fp8, q and k normed over all heads, every layer 256 experts
    _preset("MiniMax-M2.5", 62, 3072, 48, 8, 128, 1536, 200064, 196608, 5000000.0, 1e-6, qk=True,
            qk_norm_per_layer=True, moe=MoeSpec(256, 8, 1536, router_bias=True), quantization="fp8"),
)}


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
    problem = moe_problem(spec, scenario)
    if problem:
        raise KvsimError(f"{scenario.source}: {problem}")
    if cfg.dtype == "nvfp4":  # every linear layer NVFP4 (ModelOpt's default), activations 16-bit
        return replace(spec, dtype="bfloat16", quantization="nvfp4", quantized=(), quant_group_size=0)
    return replace(spec, dtype=cfg.dtype)


def moe_problem(model: ModelSpec, scenario) -> str:
    """Why the scenario's expert-parallel or routing settings do not apply to the model ('' if they do),
    as 'key: reason'."""
    hw, skew = scenario.hardware, scenario.model.expert_skew
    if not model.moe:
        if hw.enable_expert_parallel:
            return f"hardware.enable_expert_parallel: {model.name} has no routed experts"
        if skew:
            return f"model.expert_skew: {model.name} has no routed experts"
        return ""
    if skew and skew < 1:
        return f"model.expert_skew: a power law's exponent of at least 1 (or 0: balanced), got {skew:g}"
    ranks = hw.tensor_parallel_size * hw.data_parallel_size
    if hw.enable_expert_parallel and ranks > model.moe.n_routed_experts:
        return (f"hardware.enable_expert_parallel: {ranks} GPUs (tensor_parallel_size x data_parallel_size) for "
                f"{model.name}'s {model.moe.n_routed_experts} experts: at most one GPU an expert")
    return ""


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


# Host DRAM for KV offload tiers, US$ per GiB-hour: Google Cloud's on-demand price of memory in an N2 custom
# machine type (us-central1), the price of adding DRAM to a host apart from its cores.
HOST_DRAM_PRICE = GpuPrice(0.004237, "Google Cloud Compute Engine pricing: N2 custom machine memory, on-demand, "
                                     "us-central1, per GiB-hour", "2025-06")


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
