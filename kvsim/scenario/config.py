"""Scenario files: the TOML schema, strict validation and one-line errors.

A scenario has the sections model, hardware, engine, policies (one or more, compared in one run),
workload, slo, output and backend. Names follow vLLM's engine arguments where vLLM has them, so a
user can carry a serving config over. `load_scenario(path)` returns a validated `Scenario` or raises
`KvsimError` naming the file, the key path and the reason. Every number is finite and bounded
(kvsim.scenario.limits) and every field says what it means (`kvsim schema`). Input paths inside a
scenario (trace, hf_config, calibration) are resolved against the scenario file's folder;
`output.dir` is relative to the current working directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Iterable, Literal, Optional

from pydantic import (AfterValidator, BeforeValidator, Field, PrivateAttr,
                      ValidationError, model_serializer, model_validator)

from kvsim.errors import KvsimError
from kvsim.scenario import limits as L
from kvsim.scenario.catalog import GPUS, MODELS
from kvsim.scenario.links import DEFAULT_LINK, LINKS
from kvsim.scenario.load_curve import RateCurveConfig
from kvsim.scenario.offload_config import KvOffloadConfig
from kvsim.scenario.files import MAX_TOML_BYTES, check_values, key_path, parse_toml, read_text, user_path
from kvsim.scenario.overrides import apply_overrides
from kvsim.scenario.sections import Section
from kvsim.scenario.autoscaling import AutoscalingConfig, check_autoscaled

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Tokens = Annotated[int, Field(ge=1, le=L.MAX_TOKENS)]
GiB = Annotated[float, Field(ge=0, le=L.MAX_GIB)]
Seed = Annotated[int, Field(ge=0, le=L.MAX_SEED)]
Bandwidth = Annotated[float, Field(ge=L.MIN_BANDWIDTH_GBPS, le=L.MAX_BANDWIDTH_GBPS)]
Tflops = Annotated[float, Field(ge=L.MIN_TFLOPS, le=L.MAX_TFLOPS)]
Millis = Annotated[float, Field(gt=0, le=L.MAX_MS)]

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "int8", "int4")
_PLAIN_NAME = re.compile(r"\w[\w.+-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _plain_name(value: str) -> str:
    if len(value) > L.MAX_NAME_CHARS or not _PLAIN_NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"must be a plain file name (letters, digits, '_', '-', '+', '.'; not starting with '.', "
                         f"no '..', at most {L.MAX_NAME_CHARS} characters), got {value[:120]!r}")
    return value


def _one_line(limit: int):
    def check(value: str) -> str:
        if not value.strip() or len(value) > limit or _CONTROL.search(value):
            raise ValueError(f"must be 1 to {limit} characters without control characters, got {value[:120]!r}")
        return value
    return check


def _text(value: str) -> str:
    if len(value) > L.MAX_TEXT_CHARS or _CONTROL.search(value.replace("\n", "").replace("\t", "")):
        raise ValueError(f"must be at most {L.MAX_TEXT_CHARS} characters without control characters")
    return value


def _not_bool(value):
    """true is not 1 (a Literal of ints matches it by equality, strict mode or not)."""
    return repr(value) if isinstance(value, bool) else value


def _gpu_preset(name: str) -> str:
    if name.lower() not in {g.lower() for g in GPUS}:
        raise ValueError(f"unknown GPU {name!r} (presets: {', '.join(GPUS)})")
    return name


PlainName = Annotated[str, Field(min_length=1, max_length=L.MAX_NAME_CHARS), AfterValidator(_plain_name)]
Label = Annotated[str, Field(min_length=1, max_length=L.MAX_NAME_CHARS), AfterValidator(_one_line(L.MAX_NAME_CHARS))]
PathText = Annotated[str, Field(min_length=1, max_length=L.MAX_PATH_CHARS), AfterValidator(_one_line(L.MAX_PATH_CHARS))]


# a vLLM release as users write it: 0.16, 0.16.0, v0.16.1, 0.16.1rc2, 0.16.1.post1, 0.16.1.dev3
_VLLM_VERSION = re.compile(r"v?\d{1,3}\.\d{1,3}(\.\d{1,3})?((rc|a|b)\d{1,4}|\.(post|dev)\d{1,4})?")


def _vllm_version(value: str) -> str:
    if not _VLLM_VERSION.fullmatch(value):
        raise ValueError(f"{value[:40]!r} is not a vLLM release (write it as \"0.16.0\", \"0.16\" or \"v0.16.1rc1\")")
    return value


_Section = Section


class ModelConfig(_Section):
    """A preset name from kvsim.scenario.catalog, or a Hugging Face config.json."""

    name: Optional[Label] = Field(None, json_schema_extra={"enum": list(MODELS)}, description=(
        "Model preset (case-insensitive). Give this or hf_config, not both."))
    hf_config: Optional[PathText] = Field(None, description=(
        "Path to a Hugging Face config.json (or the folder holding one), relative to the scenario file: "
        "a decoder-only model, dense or mixture-of-experts, with full, sliding-window, chunked-local or "
        "latent (MLA) attention (linear-attention and Mamba hybrids are refused). Give this or name."))
    dtype: Literal["bfloat16", "float16", "float32", "fp8", "nvfp4"] = Field("bfloat16", description=(
        "Weight dtype: sets weight memory and the GEMM rate (fp8 uses the GPU's fp8 TFLOP/s). "
        "vLLM: --dtype (fp8 weights: --quantization fp8). nvfp4: every linear layer in NVFP4 (4-bit values, an "
        "fp8 scale per 16), as a ModelOpt NVFP4 checkpoint ships them (FP4 GEMMs on B200, vLLM's Marlin "
        "weight-only kernels on Hopper and Ampere); a checkpoint that keeps some layers in 16 bits (attention in "
        "most MoE ones): give its config.json (hf_config), whose quantization_config says which. A preset or "
        "config's own checkpoint format (fp8 blocks, MXFP4 or int4 experts) applies otherwise."))
    expert_skew: Annotated[float, Field(ge=0, le=3)] = Field(0.0, description=(
        "Mixture-of-experts routing: 0 balanced (each token's experts uniformly at random); else the tokens "
        "per expert drawn from a power law of this exponent (AIConfigurator's routing skew: 1.01 mild, 1.2 "
        "strong; at least 1), which leaves some experts idle and loads the busiest GPU of expert parallelism."))

    @model_validator(mode="after")
    def _one_source(self):
        if (self.name is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'name' (a preset) or 'hf_config' (a config.json path)")
        return self


class HardwareConfig(_Section):
    """A GPU preset, optional overrides of its datasheet figures, and how many GPUs serve."""

    gpu: Label = Field("H100-SXM", json_schema_extra={"enum": list(GPUS)}, description=(
        "GPU preset (case-insensitive); the *_gbps, *_tflops and memory_gib keys below override its figures."))
    tensor_parallel_size: Annotated[int, Field(ge=1, le=L.MAX_TENSOR_PARALLEL)] = Field(1, description=(
        "GPUs per replica; weights and KV heads are sharded over them. Must divide num_attention_heads; "
        "KV heads are replicated when it exceeds their number, as vLLM does. vLLM: --tensor-parallel-size."))
    data_parallel_size: Annotated[int, Field(ge=1, le=L.MAX_TENSOR_PARALLEL)] = Field(1, description=(
        "Data-parallel ranks per replica, each an engine (its own scheduler and KV cache) of "
        "tensor_parallel_size GPUs: a replica is tensor_parallel_size x data_parallel_size GPUs. A dense "
        "model's ranks are independent replicas; a mixture-of-experts model's share their MoE layers "
        "(vLLM's DP attention + MoE over every GPU of the replica). vLLM: --data-parallel-size."))
    enable_expert_parallel: bool = Field(False, description=(
        "Mixture-of-experts models: whole experts spread over the replica's tensor_parallel_size x "
        "data_parallel_size GPUs instead of every expert sliced over them. vLLM: --enable-expert-parallel."))
    num_replicas: Annotated[int, Field(ge=1, le=L.MAX_REPLICAS)] = Field(1, description=(
        "Independent engine replicas (data parallel), each with tensor_parallel_size GPUs, behind one router. "
        "vLLM: --data-parallel-size, or separate servers behind a load balancer."))
    # prefix_affinity: the router's own view of the replicas' caches (kvsim.engine.router)
    router: Literal["least_loaded", "round_robin", "prefix_affinity"] = Field("least_loaded", description=(
        "How requests are spread over replicas: least_loaded (fewest unfinished requests), round_robin, or "
        "prefix_affinity (the replica the router sent the longest prefix of the prompt to, load permitting; "
        "the router's own LRU view of the replicas' caches, as the Gateway API Inference Extension's "
        "approximate prefix-cache scorer)."))
    gpu_memory_utilization: Fraction = Field(0.9, description=(
        "Share of each GPU's memory the engine may use for weights, activations and KV cache, in (0, 1]. "
        "vLLM: --gpu-memory-utilization (default 0.9)."))
    memory_gib: Optional[Annotated[float, Field(gt=0, le=L.MAX_GIB)]] = Field(None, description=(
        "Override: GPU memory in GiB as the device reports it (nvidia-smi MiB / 1024). Default: the preset's."))
    hbm_bandwidth_gbps: Optional[Bandwidth] = Field(None, description=(
        "Override: HBM bandwidth in GB/s (datasheet). Default: the preset's."))
    bf16_tflops: Optional[Tflops] = Field(None, description=(
        "Override: dense bf16/fp16 tensor-core TFLOP/s (no sparsity). Default: the preset's."))
    fp8_tflops: Optional[Tflops] = Field(None, description=(
        "Override: dense fp8 tensor-core TFLOP/s, used for fp8 weights. Default: the preset's."))
    fp32_tflops: Optional[Tflops] = Field(None, description=(
        "Override: non-tensor-core fp32 TFLOP/s, used for KV dequantization work. Default: the preset's."))
    nvlink_gbps: Optional[Bandwidth] = Field(None, description=(  # half the datasheet's bidirectional figure
        "Override: GPU-to-GPU bandwidth in GB/s each way (half the datasheet's bidirectional figure), for "
        "tensor-parallel all-reduces. Default: the preset's."))
    pcie_gbps: Optional[Bandwidth] = Field(None, description=(
        "Override: host link bandwidth in GB/s each way, for KV swapping. Default: the preset's."))


# Routers a pool of a disaggregated deployment may use: the aggregated ones, and decode instances by
# free KV blocks (kvsim.engine.router).
POOL_ROUTERS = ("least_loaded", "round_robin", "prefix_affinity", "most_free_blocks")


class PoolConfig(_Section):
    """One pool of a disaggregated deployment: its instances' GPU, tensor parallelism and count."""

    gpu: Optional[Annotated[Label, AfterValidator(_gpu_preset)]] = Field(None, json_schema_extra={"enum": list(GPUS)},
                                                                         description=(
        "GPU preset of this pool's instances. Default: hardware.gpu (whose datasheet overrides apply only "
        "to a pool on that GPU)."))
    tensor_parallel_size: Optional[Annotated[int, Field(ge=1, le=L.MAX_TENSOR_PARALLEL)]] = Field(None, description=(
        "GPUs per instance of this pool. Default: hardware.tensor_parallel_size. vLLM v0.11.0's NixlConnector "
        "needs the decode pool's to be a multiple of the prefill pool's."))
    num_replicas: Annotated[int, Field(ge=1, le=L.MAX_REPLICAS)] = Field(1, description=(
        "Instances in this pool (vLLM: one `vllm serve --kv-transfer-config ...` each)."))
    router: Optional[Literal[POOL_ROUTERS]] = Field(None, description=(  # type: ignore[valid-type]
        "How requests are spread over this pool's instances: least_loaded, round_robin, prefix_affinity, or "
        "most_free_blocks (the instance with the most free KV blocks as its engine reports them, as llm-d's "
        "KV-cache utilization scorer ranks instances). Default: prefix_affinity for prefill, most_free_blocks "
        "for decode."))
    gpu_memory_utilization: Optional[Fraction] = Field(None, description=(
        "This pool's --gpu-memory-utilization. Default: hardware.gpu_memory_utilization."))
    max_num_seqs: Optional[Annotated[int, Field(ge=1, le=L.MAX_NUM_SEQS)]] = Field(None, description=(
        "This pool's --max-num-seqs. Default: engine.max_num_seqs (or vLLM's default for the GPU)."))
    max_num_batched_tokens: Optional[Annotated[int, Field(ge=1, le=L.MAX_BATCHED_TOKENS)]] = Field(None, description=(
        "This pool's --max-num-batched-tokens, over a policy's and the engine's. Default: the policy's, else "
        "engine.max_num_batched_tokens (or vLLM's default for the GPU)."))


class LinkConfig(_Section):
    """The KV link between the pools, per GPU and direction (kvsim.scenario.links)."""

    preset: Literal[tuple(LINKS)] = Field(DEFAULT_LINK, description=(  # type: ignore[valid-type]
        "Link preset: " + "; ".join(f"{n} ({s.bandwidth_gbps:g} GB/s)" for n, s in LINKS.items())
        + ". The keys below override its figures."))
    bandwidth_gbps: Optional[Annotated[float, Field(gt=0, le=L.MAX_BANDWIDTH_GBPS)]] = Field(None, description=(
        "GB/s one GPU moves in one direction (a measured figure beats the preset's line rate)."))
    latency_us: Optional[Annotated[float, Field(ge=0, le=L.MAX_MS * 1e3)]] = Field(None, description=(
        "Microseconds to a transfer's first byte."))
    overhead_us: Optional[Annotated[float, Field(ge=0, le=L.MAX_MS * 1e3)]] = Field(None, description=(
        "Microseconds each transfer costs besides its bytes (the connector posting the read, its notice). "
        "Default: NIXL's post time, 6,700 us (vllm-project/vllm#50913)."))


class DisaggregationConfig(_Section):
    """Disaggregated prefill and decode, as vLLM v0.11.0 with its NixlConnector: a prefill pool runs each
    prompt (one output token), a decode pool pulls its KV over the link and generates the rest."""

    prefill: PoolConfig = Field(PoolConfig(), description="The prefill pool ([disaggregation.prefill]).")
    decode: PoolConfig = Field(PoolConfig(), description="The decode pool ([disaggregation.decode]).")
    link: LinkConfig = Field(LinkConfig(), description="The KV link between them ([disaggregation.link]).")
    kv_transfer: Literal["whole_request", "layerwise"] = Field("whole_request", description=(
        "whole_request: the decode instance reads a request's KV once its prefill is done (vLLM's "
        "NixlConnector); layerwise: the decode instance is picked when the prefill starts and each layer's KV "
        "streams as it is computed (Splitwise, Mooncake), so only the last layer's share follows the prefill."))


class EngineConfig(_Section):
    """vLLM engine arguments, with vLLM's defaults (V1 `vllm serve`; see kvsim.scenario.defaults)."""

    block_size: Annotated[Literal[1, 8, 16, 32, 64, 128], BeforeValidator(_not_bool)] = Field(16, description=(
        "Tokens per KV-cache block (paged allocator). vLLM: --block-size (default 16)."))
    max_num_seqs: Optional[Annotated[int, Field(ge=1, le=L.MAX_NUM_SEQS)]] = Field(None, description=(
        "Most sequences in one engine step (running batch size). vLLM: --max-num-seqs. Default: vLLM V1's "
        "for the GPU (1024 on GPUs with >= 70 GiB other than A100, else 256; kvsim.scenario.defaults)."))
    max_num_batched_tokens: Optional[Annotated[int, Field(ge=1, le=L.MAX_BATCHED_TOKENS)]] = Field(None, description=(
        "Token budget of one engine step (prefill chunks plus one token per decoding sequence); also sizes "
        "the activation profile. vLLM: --max-num-batched-tokens. Default: vLLM V1's for the GPU (8192 on "
        "GPUs with >= 70 GiB other than A100, else 2048)."))
    max_model_len: Optional[Annotated[int, Field(ge=1, le=L.MAX_MODEL_LEN)]] = Field(None, description=(
        "Longest sequence (prompt + output tokens) a request may reach; longer requests are rejected. "
        "vLLM: --max-model-len. Default: the model's max_position_embeddings."))
    enable_prefix_caching: bool = Field(True, description=(
        "Reuse cached KV blocks of identical prompt prefixes (paged allocator; a policy may override). "
        "vLLM: --enable-prefix-caching (on by default in V1)."))
    preemption_mode: Literal["recompute", "swap"] = Field("recompute", description=(
        "What happens to a preempted sequence's KV: recompute (drop it, newest first; vLLM V1's only mode) or "
        "swap (copy to host memory over PCIe). vLLM V0: --preemption-mode."))
    swap_space: GiB = Field(4.0, description=(  # GiB of host memory per GPU for swapped-out KV, as vLLM
        "Host memory in GiB per GPU for swapped-out KV (preemption_mode = swap). vLLM: --swap-space (default 4)."))
    activation_reserve_gib: Optional[GiB] = Field(None, description=(
        "GiB per GPU set aside for activations. Default: estimated from the model and max_num_batched_tokens "
        "(vLLM measures it with a profiling forward pass)."))
    vllm_version: Optional[Annotated[str, AfterValidator(_vllm_version)]] = Field(None, description=(
        "The vLLM release you run, e.g. \"0.16.0\" (\"0.16\", \"v0.16.1rc2\" and \".post1\" forms read as their "
        "release): its measured kernel timings (NVIDIA AIConfigurator's tables) price each step, or, for a "
        "release with no tables on the GPU, the newest shipped release not newer than it (else the oldest), "
        "and the answer is labelled estimated, naming the release that priced it. Default: the newest "
        "shipped for the GPU (H100-SXM, H200, A100-80GB, B200); GPUs without tables are priced by the roofline."))
    async_scheduling: Optional[bool] = Field(None, description=(
        "The scheduler plans step n+1 while the GPU runs step n, so a request arriving during a step first "
        "runs a step later. vLLM: --async-scheduling / --no-async-scheduling. Default: the priced release's "
        "default (on with measured kernel tables, vLLM >= 0.14; off with the roofline, which mirrors v0.11.0)."))
    fixed_reserve_gib: Optional[GiB] = Field(None, description=(
        "GiB per GPU outside PyTorch's allocator (CUDA context, NCCL and cuBLAS workspaces). Default: "
        "vLLM's measured non-torch memory (kvsim.perf.memory)."))


class PolicyConfig(_Section):
    """One KV-cache policy to compare: allocator, cache dtype and prefill mode."""

    name: Label = Field(description="The policy's name in tables, reports and results files (unique).")
    allocator: Literal["paged", "contiguous"] = Field("paged", description=(
        "paged: vLLM's BlockManager (block tables, prefix caching); contiguous: one slab per request "
        "(first fit), as engines before PagedAttention."))
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = Field("auto", description=(  # type: ignore[valid-type]
        "KV-cache element type: auto (the model's dtype), bfloat16, float16, fp8 (= fp8_e4m3), int8, int4; "
        "int8/int4 store an fp32 scale per token and KV head, fp8 as kv_cache_scales says. "
        "vLLM: --kv-cache-dtype."))
    kv_cache_scales: Literal["per_tensor", "per_token"] = Field("per_tensor", description=(
        "fp8 scales: per_tensor (one scale per layer, as vLLM: no scale bytes in the blocks) or per_token "
        "(an fp32 scale per token and KV head, as kvsim's triton kernels store them)."))
    enable_chunked_prefill: bool = Field(True, description=(
        "Split long prompts into chunks that share a step with decoding sequences (vLLM V1 always does); "
        "false: a prompt is prefilled whole in one step. vLLM: --enable-chunked-prefill."))
    max_num_batched_tokens: Optional[Annotated[int, Field(ge=1, le=L.MAX_BATCHED_TOKENS)]] = Field(None, description=(
        "This policy's token budget per step (the prefill chunk size). Default: engine.max_num_batched_tokens."))
    enable_prefix_caching: Optional[bool] = Field(None, description=(
        "This policy's prefix caching (paged only). Default: engine.enable_prefix_caching."))
    disaggregated: Optional[bool] = Field(None, description=(
        "Serve this policy disaggregated (the [disaggregation] pools) or aggregated ([hardware]). Default: "
        "disaggregated when the scenario has a [disaggregation] section and the policy's allocator is paged."))
    speculative: Optional[bool] = Field(None, description=(
        "Serve this policy with the scenario's [speculative] decoding. Default: on when the scenario has a "
        "[speculative] section and the policy is aggregated with the paged allocator (false: the same policy "
        "without it, to compare both in one run)."))
    num_speculative_tokens: Optional[Annotated[int, Field(ge=1, le=L.MAX_SPEC_TOKENS)]] = Field(None, description=(
        "This policy's draft tokens a step (kvsim plan --speculative-k compares several). Default: "
        "speculative.num_speculative_tokens."))
    contiguous_reserve: Literal["max_model_len", "known_output"] = Field("max_model_len", description=(
        "Contiguous allocator: reserve max_model_len slots per request (what such engines must do) or only "
        "prompt + the request's known output length (an oracle bound)."))
    kv_offload: Optional[bool] = Field(None, description=(
        "Serve this policy with the [kv_offload] tiers. Default: when the scenario has a [kv_offload] section, "
        "the policy's allocator is paged and it is served aggregated."))
    offload_eviction_policy: Optional[Literal["lru", "arc"]] = Field(None, description=(
        "This policy's CPU-tier eviction policy. Default: kv_offload.eviction_policy."))

    @model_validator(mode="after")
    def _contiguous_has_no_prefix_cache(self):
        if self.allocator == "contiguous" and self.enable_prefix_caching:
            raise ValueError("prefix caching needs the paged allocator")
        return self


class LengthDist(_Section):
    """Token-length distribution: fixed, uniform [min, max], lognormal (mean, sigma) or from the trace."""

    dist: Literal["fixed", "uniform", "lognormal", "trace"] = Field("fixed", description=(
        "fixed (value), uniform integers in [min, max], lognormal (mean, sigma; clipped to [min, max]) or "
        "trace (each row's own length; needs [workload.trace])."))
    value: Optional[Tokens] = Field(None, description="fixed: the length in tokens.")
    min: Optional[Tokens] = Field(None, description="uniform: smallest length; lognormal: clip below (default 1). Tokens.")
    max: Optional[Tokens] = Field(None, description=(
        f"uniform: largest length; lognormal: clip above (default {L.MAX_TOKENS:,}). Tokens."))
    mean: Optional[Annotated[float, Field(ge=1, le=L.MAX_TOKENS)]] = Field(None, description=(
        "lognormal: mean length in tokens (before clipping)."))
    sigma: Optional[Annotated[float, Field(ge=L.MIN_SIGMA, le=L.MAX_SIGMA)]] = Field(None, description=(
        "lognormal: standard deviation of the underlying normal (0.5: moderate spread, 1.5: heavy tail)."))

    @model_validator(mode="after")
    def _params(self):
        _dist_params(self, {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma"), "trace": ()})
        return self


def _dist_params(dist, need: dict, strict: bool = False) -> None:
    """A distribution's parameters: those its `dist` needs are given (`strict`: and no other), min <= max."""
    missing = [k for k in need[dist.dist] if getattr(dist, k) is None]
    if missing:
        raise ValueError(f"dist '{dist.dist}' needs {', '.join(missing)}")
    extra = [k for k in ("value", "min", "max", "mean", "sigma")
             if strict and k not in need[dist.dist] and getattr(dist, k) is not None]
    if extra:
        raise ValueError(f"dist '{dist.dist}' takes no {', '.join(extra)}")
    if dist.min is not None and dist.max is not None and dist.min > dist.max:
        raise ValueError("min must not exceed max")


class ArrivalConfig(_Section):
    """Poisson, gamma (bursty: cv > 1) or deterministic (evenly spaced) arrivals at `rate`
    requests/s, the trace's own times, or everything at once (`immediate`)."""

    process: Literal["poisson", "gamma", "deterministic", "trace", "immediate"] = Field("poisson", description=(
        "poisson (exponential gaps), gamma (gaps with coefficient of variation cv; cv > 1 is bursty), "
        "deterministic (every gap 1/rate: capacity in closed form), trace (the trace's own arrival times) or "
        "immediate (every request, or session, ready at t = 0: vllm bench serve --request-rate inf; with "
        "max_concurrency, a closed loop of that many clients). With [workload.sessions] it is when sessions "
        "start."))
    rate: Optional[Annotated[float, Field(ge=L.MIN_RATE, le=L.MAX_RATE)]] = Field(None, description=(
        "Mean arrival rate in requests per second (poisson, gamma and deterministic; sessions per second "
        "with [workload.sessions])."))
    cv: Annotated[float, Field(ge=L.MIN_CV, le=L.MAX_CV)] = Field(1.0, description=(
        "gamma: coefficient of variation of the gaps (1 = Poisson, 2 = bursty)."))
    time_scale: Annotated[float, Field(ge=L.MIN_SCALE, le=L.MAX_SCALE)] = Field(1.0, description=(
        "trace: multiply the trace's inter-arrival gaps by this (0.5 = twice the load)."))
    curve: Optional[RateCurveConfig] = Field(None, description=(
        "poisson, gamma, deterministic: a rate that varies over time instead of `rate` "
        "([workload.arrival.curve]: a table of (seconds, rate) points or a diurnal shape, and bursts; "
        "kvsim.scenario.load_curve)."))

    @model_serializer(mode="wrap")
    def _without_unset_curve(self, handler):
        """No `curve` key unless a curve is given: summary.json's and plan.json's arrival as before curves."""
        data = handler(self)
        if isinstance(data, dict) and data.get("curve") is None:
            data.pop("curve", None)
        return data

    @model_validator(mode="after")
    def _rate(self):
        if self.curve is not None:
            if self.process in ("trace", "immediate"):
                raise ValueError(f"curve: process '{self.process}' follows no rate (poisson, gamma or deterministic do)")
            if self.rate is not None:
                raise ValueError("give rate or curve, not both (the curve sets the rate over time)")
            return self
        if self.process not in ("trace", "immediate") and self.rate is None:
            raise ValueError(f"process '{self.process}' needs 'rate' (requests per second)")
        if self.process == "immediate" and self.rate is not None:
            raise ValueError("process 'immediate' takes no rate: every request is ready at t = 0")
        return self


class TimeDist(_Section):
    """A duration in seconds: fixed, uniform [min, max], exponential (mean) or lognormal (mean, sigma)."""

    dist: Literal["fixed", "uniform", "exponential", "lognormal"] = Field("fixed", description=(
        "fixed (value), uniform in [min, max], exponential (mean; vLLM's multi-turn benchmark sleeps "
        "exponentially) or lognormal (mean, sigma of the underlying normal)."))
    value: Optional[Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]] = Field(None, description="fixed: seconds.")
    min: Optional[Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]] = Field(None, description="uniform: shortest, seconds.")
    max: Optional[Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]] = Field(None, description="uniform: longest, seconds.")
    mean: Optional[Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)]] = Field(None, description=(
        "exponential, lognormal: mean in seconds."))
    sigma: Optional[Annotated[float, Field(ge=L.MIN_SIGMA, le=L.MAX_SIGMA)]] = Field(None, description=(
        "lognormal: standard deviation of the underlying normal."))

    @model_validator(mode="after")
    def _params(self):
        _dist_params(self, {"fixed": ("value",), "uniform": ("min", "max"), "exponential": ("mean",),
                            "lognormal": ("mean", "sigma")}, strict=True)
        return self

    @property
    def lowest(self) -> float:
        """The least value it can draw (its infimum)."""
        return {"fixed": self.value, "uniform": self.min}.get(self.dist, 0.0)


class SessionConfig(_Section):
    """Multi-turn sessions: each a conversation of turns; a turn's prompt is everything said so far
    (earlier prompts and replies) and `workload.prompt_len` new tokens, its reply `workload.output_len`
    tokens, sent `workload.think_time_s` after the previous reply ended."""

    turns: LengthDist = Field(LengthDist(dist="fixed", value=4), description=(
        "Turns per session (fixed, uniform, lognormal; trace: each ShareGPT conversation's own turns, with "
        f"prompt_len and output_len dist = \"trace\"). At most {L.MAX_TURNS:,}."))

    @model_validator(mode="after")
    def _bounded(self):
        top = self.turns.value if self.turns.dist == "fixed" else self.turns.max
        if top is not None and top > L.MAX_TURNS:
            raise ValueError(f"turns: at most {L.MAX_TURNS:,} turns a session, got {top:,}")
        return self


class PrefixConfig(_Section):
    """Groups of requests that share a system prompt, so prefix caching has something to find."""

    num_groups: Annotated[int, Field(ge=1, le=L.MAX_PREFIX_GROUPS)] = Field(1, description=(
        "Number of distinct shared prefixes (system prompts); a member joins one uniformly."))
    prefix_len: Annotated[int, Field(ge=1, le=L.MAX_MODEL_LEN)] = Field(512, description=(
        "Tokens of each shared prefix, added in front of the member's sampled prompt."))
    fraction: Fraction = Field(1.0, description="Share of requests that carry a group's prefix, in (0, 1].")
    prompts_per_group: Optional[Annotated[int, Field(ge=1, le=L.MAX_PREFIX_GROUPS)]] = Field(None, description=(
        "A fixed pool of prompts: each group has this many whole prompts (its system prompt and a question of "
        "prompt_len tokens, drawn once), and requests send the num_groups × prompts_per_group prompts in a "
        "shuffled order, over and over, as llm-d's inference-perf shared_prefix data does: a prompt comes back "
        "every num_groups × prompts_per_group requests, so prefix caching can hit it whole. Needs fraction = 1 "
        "and synthetic prompt lengths. Default: none (every member's question is new)."))

    @model_validator(mode="after")
    def _bounded(self):
        if self.num_groups * self.prefix_len > L.MAX_PREFIX_TOKENS:
            raise ValueError(f"num_groups × prefix_len = {self.num_groups * self.prefix_len:,} tokens, more than "
                             f"{L.MAX_PREFIX_TOKENS:,}")
        if self.prompts_per_group is not None:
            if self.fraction != 1.0:
                raise ValueError("prompts_per_group: a pool of whole prompts needs fraction = 1 (every request "
                                 "sends one of them)")
            if self.num_groups * self.prompts_per_group > L.MAX_PREFIX_GROUPS:
                raise ValueError(f"num_groups × prompts_per_group = {self.num_groups * self.prompts_per_group:,} "
                                 f"prompts, more than {L.MAX_PREFIX_GROUPS:,}")
        return self


ColumnName = Annotated[str, Field(min_length=1, max_length=L.MAX_NAME_CHARS), AfterValidator(_one_line(L.MAX_NAME_CHARS))]


class TraceColumns(_Section):
    """Which columns of your own CSV log hold what ([workload.trace.columns], format = "csv")."""

    arrival: Optional[ColumnName] = Field(None, description=(
        "The column holding each request's arrival time. Leave it out for a log of lengths only, replayed "
        "at a synthetic arrival rate."))
    arrival_unit: Literal["s", "ms", "us", "ns", "datetime"] = Field("s", description=(
        "The arrival column's unit: seconds, milliseconds, microseconds or nanoseconds (any origin: the first "
        "arrival becomes 0), or datetime (e.g. 2024-05-01 12:00:03.25 or 2024-05-01T12:00:03)."))
    prompt_tokens: ColumnName = Field(description="The column of prompt (input) token counts.")
    output_tokens: ColumnName = Field(description="The column of output (generated) token counts.")


class TraceConfig(_Section):
    """A request trace to replay: its arrival times, lengths, or both; or a dataset of lengths."""

    format: Literal["azure", "mooncake", "csv", "sharegpt", "vllm_bench"] = Field(description=(
        "azure: Azure LLM 2023 CSV (TIMESTAMP, ContextTokens, GeneratedTokens); mooncake: JSONL with "
        "timestamp (ms), input_length, output_length, hash_ids; csv: your own CSV log, columns named by "
        "[workload.trace.columns] (default arrival_s, prompt_tokens, output_tokens); sharegpt: a ShareGPT-style "
        "JSON list of conversations (lengths only: the first two turns, as vllm bench serve --dataset-name "
        "sharegpt samples them); vllm_bench: a vllm bench serve --save-result --save-detailed JSON (lengths "
        "only: its input_lens and output_lens)."))
    path: PathText = Field(description="The trace file, relative to the scenario file.")
    max_requests: Optional[Annotated[int, Field(ge=1, le=L.MAX_REQUESTS)]] = Field(None, description=(
        "Replay only the first this many rows (in arrival order). Default: all."))
    skip_rows: Annotated[int, Field(ge=0, le=L.MAX_REQUESTS)] = Field(0, description=(
        "Of those rows, skip this many first: the replay starts at the next one, its arrival at t = 0. "
        "kvsim plan replays a trace's disjoint windows this way, one per seed (a replayed trace has nothing "
        "else a seed could change)."))
    columns: Optional[TraceColumns] = Field(None, description=(
        "format csv: which columns hold the arrival time, prompt and output tokens. Default: the header "
        "arrival_s, prompt_tokens, output_tokens, times in seconds."))
    bytes_per_token: Optional[Annotated[float, Field(ge=0.5, le=64)]] = Field(None, description=(
        "format sharegpt: a turn's tokens are estimated as its UTF-8 bytes / this (about 4 for Llama-3-class "
        "tokenizers, in English and in CJK text alike); default 4. For exact counts, tokenize the dataset "
        "yourself and give a csv with the columns."))

    @model_validator(mode="after")
    def _format_keys(self):
        if self.columns is not None and self.format != "csv":
            raise ValueError(f"columns: only for format \"csv\", not {self.format!r}")
        if self.bytes_per_token is not None and self.format != "sharegpt":
            raise ValueError(f"bytes_per_token: only for format \"sharegpt\", not {self.format!r}")
        return self

    @property
    def has_times(self) -> bool:
        """Whether the file holds arrival times (a dataset of lengths does not)."""
        if self.format in ("sharegpt", "vllm_bench"):
            return False
        return self.format != "csv" or self.columns is None or self.columns.arrival is not None


class WorkloadConfig(_Section):
    """The requests: arrivals, prompt and output lengths, shared prefixes, or a trace."""

    seed: Seed = Field(0, description="Random seed of arrivals, lengths and prefix groups: same seed, same requests.")
    num_requests: Optional[Annotated[int, Field(ge=1, le=L.MAX_REQUESTS)]] = Field(None, description=(
        "Stop after this many requests (or at duration_s, whichever comes first)."))
    duration_s: Optional[Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)]] = Field(None, description=(
        "Stop at the first arrival after this many simulated seconds."))
    start_s: Optional[Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]] = Field(None, description=(
        "Replay only the arrivals at or after this many seconds: a window of a longer workload, its requests "
        "keeping their times and ids (open loops; with duration_s, the window [start_s, duration_s])."))
    arrival: ArrivalConfig = Field(ArrivalConfig(rate=1.0), description="The arrival process.")
    prompt_len: LengthDist = Field(LengthDist(dist="fixed", value=512), description="Prompt length distribution.")
    output_len: LengthDist = Field(LengthDist(dist="fixed", value=128), description=(
        "Output length distribution: every request generates exactly this many tokens (no early EOS)."))
    prefix: Optional[PrefixConfig] = Field(None, description="Shared system-prompt groups (none by default).")
    trace: Optional[TraceConfig] = Field(None, description="A trace to replay (none by default).")
    max_concurrency: Optional[Annotated[int, Field(ge=1, le=L.MAX_CONCURRENCY)]] = Field(None, description=(
        "Clients: at most this many requests (sessions, with [workload.sessions]) in flight, each client "
        "sending its next one when its last ended (and think_time_s passed); arrivals wait for a free client in "
        "order. vllm bench serve --max-concurrency (a semaphore over the arrival process); with arrival process "
        "immediate, a closed loop (what kvsim plan then searches). Default: no limit (an open loop)."))
    think_time_s: Optional[TimeDist] = Field(None, description=(
        "A client's pause after each reply before its next request (a session's next turn), seconds. "
        "Needs max_concurrency or [workload.sessions]. Default: none."))
    sessions: Optional[SessionConfig] = Field(None, description=(
        "Multi-turn sessions (none by default): requests come as conversations whose turns carry what was "
        "said before, so prefix caching is exercised as in chat."))

    @model_validator(mode="after")
    def _consistent(self):
        uses_trace = (self.arrival.process == "trace" or self.prompt_len.dist == "trace"
                      or self.output_len.dist == "trace")
        if uses_trace and self.trace is None:
            raise ValueError("arrival process or lengths come from a trace, but [workload.trace] is missing")
        if self.arrival.process == "trace" and not self.trace.has_times:
            raise ValueError(f"arrival.process: the {self.trace.format} trace has no arrival times: use poisson, "
                             "gamma or deterministic arrivals, with prompt_len and output_len dist = \"trace\"")
        if self.trace is None and self.num_requests is None and self.duration_s is None and self.arrival.curve is None:
            raise ValueError("give num_requests or duration_s")
        if self.prefix is not None and self.prefix.prompts_per_group is not None and (
                self.prompt_len.dist == "trace" or self.sessions is not None):
            raise ValueError("prefix.prompts_per_group: a pool of fixed prompts draws its questions from a synthetic "
                             "prompt_len, without [workload.sessions]")
        self._clients()
        if self.start_s is not None:
            if self.max_concurrency is not None or self.sessions is not None or self.arrival.process == "immediate":
                raise ValueError("start_s: a window of arrivals is for open loops (no max_concurrency, sessions or "
                                 "immediate arrivals)")
            if self.duration_s is not None and self.start_s >= self.duration_s:
                raise ValueError(f"start_s ({self.start_s:g}) must be before duration_s ({self.duration_s:g})")
        if self.num_requests is None and self.duration_s is not None and self.arrival.process not in ("trace", "immediate") \
                and self.arrival.curve is None:
            expected = self.arrival.rate * self.duration_s
            if expected > L.MAX_REQUESTS:
                raise ValueError(f"arrival.rate × duration_s = {expected:,.0f} requests, more than "
                                 f"{L.MAX_REQUESTS:,}: set num_requests or shorten duration_s")
        return self

    def _clients(self) -> None:
        """Closed-loop and session keys that only work together."""
        if self.think_time_s is not None and self.max_concurrency is None and self.sessions is None:
            raise ValueError("think_time_s: a think time needs clients: set max_concurrency or [workload.sessions]")
        if (self.arrival.process == "immediate" and self.max_concurrency is None and self.num_requests is None):
            raise ValueError("arrival.process 'immediate' without max_concurrency sends everything at t = 0: "
                             "give num_requests")
        if self.sessions is None:
            return
        dataset = self.trace is not None and self.trace.format == "sharegpt"
        traced = [k for k, d in (("sessions.turns", self.sessions.turns), ("prompt_len", self.prompt_len),
                                 ("output_len", self.output_len)) if d.dist == "trace"]
        if traced and (not dataset or len(traced) < 3):
            raise ValueError("sessions from a dataset: sessions.turns, prompt_len and output_len all dist = \"trace\", "
                             "with a [workload.trace] of format \"sharegpt\" (its conversations' turns)")


class SloConfig(_Section):
    """Latency bounds (milliseconds; leave one out for no bound) and the percentile they are judged at.

    Per request: `ttft_ms` (time to first token), `tpot_ms` (time per output token: the request's
    mean gap between tokens after the first) and `e2e_ms`. A request is *good* when it meets every
    per-request bound; goodput and `slo_attainment` count good requests. Per token: `itl_ms` bounds
    every inter-token gap of every request (token-level ITL), so it is judged only at the percentile.
    The scenario *meets its SLO* when, at `percentile`, every given figure is within its bound and
    at least that share of requests was served; rejected requests count as infinitely late
    (kvsim.results.verdict).
    """

    ttft_ms: Optional[Millis] = Field(2000.0, description="Per request: time to first token bound in ms (none: no bound).")
    tpot_ms: Optional[Millis] = Field(100.0, description=(
        "Per request: bound in ms on the mean gap between a request's output tokens after the first (TPOT) "
        "(none: no bound)."))
    itl_ms: Optional[Millis] = Field(None, description=(
        "Per token: bound in ms on every gap between two tokens of a request (token-level ITL), judged at "
        "`percentile` (none by default)."))
    e2e_ms: Optional[Millis] = Field(None, description="Per request: end-to-end latency bound in ms (none by default).")
    percentile: Annotated[float, Field(gt=0, le=100)] = Field(99.0, description=(
        "The percentile every bound is judged at: the scenario meets its SLO when each figure at this percentile "
        "(rejected requests counting as infinitely late) is within its bound."))


class CostConfig(_Section):
    """GPU hourly prices for `kvsim plan --target-rate`; they replace the presets' prices
    (kvsim.scenario.catalog.GPU_PRICES)."""

    gpu_hour_usd: Annotated[dict[Annotated[PlainName, AfterValidator(_gpu_preset)],
                                 Annotated[float, Field(gt=0, le=1e6)]], Field(max_length=64)] = Field(
        {}, description="US$ per GPU per hour, by GPU preset name, e.g. { \"H100-SXM\" = 2.49 }.")
    source: Annotated[str, Field(max_length=L.MAX_TEXT_CHARS), AfterValidator(_text)] = Field(
        "", description="Where the prices come from.")
    date: Annotated[str, Field(max_length=L.MAX_NAME_CHARS), AfterValidator(_text)] = Field(
        "", description="When the prices were read.")


# vLLM's speculative methods (vllm/config/speculative.py SpeculativeMethod): EAGLE heads, multi-token
# prediction layers (each MTP model type an alias of "mtp"), n-gram prompt lookup and a separate draft model.
MTP_ALIASES = ("deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp")
SPEC_METHODS = ("eagle", "eagle3", "mtp", *MTP_ALIASES, "ngram", "draft_model")


class SpeculativeConfig(_Section):
    """Speculative decoding as vLLM V1 runs it (--speculative-config): each decoding sequence's step
    verifies its drafts in one target forward pass. kvsim.perf.acceptance holds the published acceptance
    the defaults come from."""

    method: Literal[SPEC_METHODS] = Field(description=(  # type: ignore[valid-type]
        "eagle or eagle3 (a draft head of one decoder layer on the target's hidden states), mtp (the model's "
        "own multi-token-prediction layers; deepseek_mtp, qwen3_next_mtp, glm4_moe_mtp, mimo_mtp, ernie_mtp "
        "are vLLM's aliases), ngram (prompt lookup: no draft model) or draft_model (a separate small model, "
        "speculative.draft_model). vLLM: speculative_config.method."))
    num_speculative_tokens: Annotated[int, Field(ge=1, le=L.MAX_SPEC_TOKENS)] = Field(description=(
        "Draft tokens k a step proposes per sequence; the verify step schedules 1 + k tokens per decoding "
        "sequence. vLLM: speculative_config.num_speculative_tokens."))
    acceptance: Optional[Annotated[list[Annotated[float, Field(ge=0, le=1)]],
                                   Field(min_length=1, max_length=L.MAX_SPEC_TOKENS)]] = Field(None, description=(
        "Acceptance per draft position, as vLLM's spec-decode metrics report it: p_i = the share of drafts "
        "whose first i tokens were all accepted (non-increasing, at least num_speculative_tokens values; ngram: "
        "of the steps that propose). Default: the method's published preset (speculative.dataset)."))
    acceptance_rate: Optional[Annotated[float, Field(ge=0, le=1)]] = Field(None, description=(
        "Instead of `acceptance`: each draft accepted with this probability given the ones before it were "
        "(p_i = a^i; a step yields (1 - a^(k+1)) / (1 - a) tokens on average)."))
    dataset: Optional[Label] = Field(None, description=(
        "The published acceptance preset to use (kvsim.perf.acceptance): eagle and ngram: sharegpt, gsm8k, "
        "cnn_dailymail, instructcoder (Llama-3.1-8B, SpecDecode-Bench); eagle3: humaneval, gsm8k, cnn_dailymail "
        "(RedHatAI's Llama-4-Maverick speculator card); mtp: gpqa (GLM-4.5-Air), deepseek_v3. Default: sharegpt, "
        "sharegpt, cnn_dailymail, gpqa. draft_model has no preset: give acceptance or acceptance_rate."))
    proposal_rate: Optional[Fraction] = Field(None, description=(
        "ngram only: the share of steps whose prompt lookup finds a match and proposes drafts (the others "
        "verify one token). Default: the preset's."))
    draft_model: Optional[Label] = Field(None, json_schema_extra={"enum": list(MODELS)}, description=(
        "draft_model only: the draft's model preset (e.g. Qwen3-0.6B for Qwen3-8B); or draft_hf_config."))
    draft_hf_config: Optional[PathText] = Field(None, description=(
        "draft_model only: the draft's Hugging Face config.json, relative to the scenario file."))
    draft_num_layers: Optional[Annotated[int, Field(ge=1, le=64)]] = Field(None, description=(
        "eagle, eagle3: decoder layers of the draft head (default 1, as the published heads); mtp: MTP layers "
        "used (default: the model's num_nextn_predict_layers)."))
    draft_vocab_size: Optional[Annotated[int, Field(ge=1, le=2**22)]] = Field(None, description=(
        "eagle3: the head's reduced draft vocabulary (default 32,000, the published EAGLE-3 heads'; never "
        "more than the model's). Other methods draft over the model's vocabulary."))
    seed: Seed = Field(0, description=(
        "Seed of the acceptance draws: each request's draws are a function of (seed, request, output "
        "position), so results do not depend on how steps are grouped."))

    @model_validator(mode="after")
    def _consistent(self):
        given = [k for k in ("acceptance", "acceptance_rate", "dataset") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of acceptance, acceptance_rate or dataset, not {' and '.join(given)}")
        if self.acceptance is not None:
            if len(self.acceptance) < self.num_speculative_tokens:
                raise ValueError(f"acceptance: {len(self.acceptance)} positions for num_speculative_tokens = "
                                 f"{self.num_speculative_tokens}")
            if any(b > a for a, b in zip(self.acceptance, self.acceptance[1:])):
                raise ValueError("acceptance: per-position rates cannot rise (accepting draft i needs the ones "
                                 "before it accepted)")
        if self.proposal_rate is not None and self.method != "ngram":
            raise ValueError("proposal_rate: only for method \"ngram\"")
        drafts = [k for k in ("draft_model", "draft_hf_config") if getattr(self, k) is not None]
        if self.method == "draft_model":
            if len(drafts) != 1:
                raise ValueError("method \"draft_model\" needs exactly one of draft_model or draft_hf_config")
            if not given:
                raise ValueError("method \"draft_model\": a draft's acceptance depends on the pair: give "
                                 "acceptance or acceptance_rate")
        elif drafts:
            raise ValueError(f"{drafts[0]}: only for method \"draft_model\"")
        if self.draft_vocab_size is not None and self.method != "eagle3":
            raise ValueError("draft_vocab_size: only for method \"eagle3\"")
        if self.draft_num_layers is not None and self.method in ("ngram", "draft_model"):
            raise ValueError(f"draft_num_layers: not for method \"{self.method}\"")
        return self

    @property
    def base_method(self) -> str:
        """The method with vLLM's MTP aliases folded into "mtp"."""
        return "mtp" if self.method in MTP_ALIASES else self.method


Watts = Annotated[float, Field(gt=0, le=L.MAX_WATTS)]


class EnergyConfig(_Section):
    """Energy and its cost (kvsim.perf.energy): a power model of the GPU preset, the host's share, the
    facility's PUE and the electricity price. With this section summary.json, the report and plan give
    joules per output token, kWh and energy $ per million tokens."""

    gpu_idle_w: Optional[Watts] = Field(None, description=(
        "Watts one GPU draws with the model loaded and no kernel running. Default: the preset's (measured)."))
    gpu_max_w: Optional[Watts] = Field(None, description=(
        "The GPU's power limit in watts (nvidia-smi -pl): what a step can draw at most; at most the "
        "preset's board power. Default: the preset's board power (datasheet TDP)."))
    host_w_per_gpu: Optional[Annotated[float, Field(ge=0, le=L.MAX_WATTS)]] = Field(None, description=(
        "Watts of the server around each GPU (CPUs, memory, NICs, fans) while serving. Default: the preset's "
        "(H100: 350 W, from an 8-GPU HGX node's measured 8.4 kW peak less its GPUs)."))
    pue: Annotated[float, Field(ge=1, le=5)] = Field(1.56, description=(
        "Power usage effectiveness: facility energy / IT energy (Uptime Institute's 2024 survey average 1.56; "
        "hyperscale sites report 1.1-1.2)."))
    usd_per_kwh: Annotated[float, Field(ge=0, le=L.MAX_USD_PER_KWH)] = Field(0.081, description=(
        "Electricity price in US$ per kWh (default: the US industrial average of 2024, EIA Electric Power "
        "Monthly, 8.1 cents)."))
    source: Annotated[str, Field(max_length=L.MAX_TEXT_CHARS), AfterValidator(_text)] = Field(
        "", description="Where your power figures or price come from.")


class OutputConfig(_Section):
    """Where and what a run writes."""

    dir: PathText = Field("results", description=(
        "Folder that receives <dir>/<scenario name>/; relative to the current working directory. "
        "kvsim only replaces a results folder it wrote itself (or an empty one)."))
    timeseries_interval_s: Optional[Annotated[float, Field(ge=L.MIN_INTERVAL_S, le=L.MAX_DURATION_S)]] = Field(
        None, description=(
            "Sampling interval of timeseries.csv in simulated seconds. Unset: about 1,000 rows per replica, "
            "the arrival window / 1000 rounded up to 1, 2 or 5 x 10^k s, at least 0.25 s (a 10-minute run "
            "gets 1 s, an hour-long trace 5 s)."))
    report_html: bool = Field(True, description="Write the self-contained report.html.")


class BackendConfig(_Section):
    """What prices an engine step: the analytic roofline model or the real Triton engine."""

    name: Label = Field("analytic", json_schema_extra={"enum": ["analytic", "triton"]}, description=(
        "analytic (roofline step time, no GPU) or triton (real kernels on an NVIDIA GPU); more may be "
        "installed through the kvsim.backends entry point."))
    calibration: Optional[PathText] = Field(None, description=(  # relative to the scenario
        "analytic: JSON file of roofline coefficients (kvsim calibrate writes one), relative to the scenario "
        "file, or a shipped engine: vllm, triton. Default: the GPU preset's shipped vLLM calibration, else "
        "built-in H100-class coefficients. A file or triton prices with the roofline (pricing = auto)."))
    pricing: Literal["auto", "measured", "roofline"] = Field("auto", description=(
        "analytic: what prices a step. measured: the sum of real vLLM kernel timings (engine.vllm_version); "
        "roofline: the calibrated roofline model; auto: measured where kernel tables ship for the GPU and "
        "neither backend.calibration nor a datasheet override asks for the roofline."))
    kernel_tables: Optional[PathText] = Field(None, description=(  # relative to the scenario
        "analytic: a kernel-table file (.npz) that kvsim calibrate converted from AIConfigurator's tables, "
        "relative to the scenario file; prices steps in place of the shipped tables."))
    server_terms: Optional[PathText] = Field(None, description=(  # relative to the scenario
        "analytic, measured pricing: a server-terms file (JSON) that kvsim calibrate --serving fitted to your "
        "own serving runs, relative to the scenario file; replaces the GPU's shipped server terms (the API "
        "server, the engine's host time a step, what a step costs beyond its kernels)."))
    step_time_scale: Annotated[float, Field(ge=0.5, le=2.0)] = Field(1.0, description=(
        "analytic: every step's price times this (a sensitivity knob: kvsim plan checks its safe rate at "
        "1.05 and reports how the knee moves at 0.95 and 1.05)."))
    device: Label = Field("cuda:0", description="triton: the torch device to run on.")
    seed: Seed = Field(0, description="triton: seed of the random model weights.")
    enforce_eager: bool = Field(False, description=(
        "triton: no CUDA graphs for decode steps. vLLM: --enforce-eager."))


class Scenario(_Section):
    """One kvsim experiment: a model on some GPUs, serving a workload, under one or more KV-cache policies."""

    name: Optional[PlainName] = Field(None, description=(
        "The results folder's name (<output.dir>/<name>/): letters, digits, '_', '-', '+', '.', at most 100 "
        "characters. Default: the scenario file's name without .toml."))
    description: Annotated[str, Field(max_length=L.MAX_TEXT_CHARS), AfterValidator(_text)] = Field("", description="Free text shown in summary.json.")
    model: ModelConfig = Field(description="The model: a preset or a Hugging Face config.json.")
    hardware: HardwareConfig = Field(HardwareConfig(), description="GPUs, parallelism and routing.")
    engine: EngineConfig = Field(EngineConfig(), description="vLLM engine arguments shared by every policy.")
    policies: Annotated[list[PolicyConfig], Field(min_length=1, max_length=64)] = Field(description=(
        "KV-cache policies to compare ([[policies]] tables), each replaying the same requests."))
    workload: WorkloadConfig = Field(description="The requests to replay.")
    slo: SloConfig = Field(SloConfig(), description="Latency bounds and the percentile they are judged at.")
    disaggregation: Optional[DisaggregationConfig] = Field(None, description=(
        "Disaggregated prefill and decode pools and the KV link between them (none: every policy aggregated)."))
    kv_offload: Optional[KvOffloadConfig] = Field(None, description=(
        "KV-cache offload tiers (CPU, disk) behind a KV connector (none: the GPU cache alone)."))
    cost: Optional[CostConfig] = Field(None, description="GPU prices for kvsim plan --target-rate.")
    autoscaling: Optional[AutoscalingConfig] = Field(None, description=(
        "Replicas that come and go under an autoscaler (kvsim.scenario.autoscaling; none: hardware.num_replicas "
        "replicas throughout)."))
    speculative: Optional[SpeculativeConfig] = Field(None, description=(
        "Speculative decoding (none by default): draft tokens verified in each decoding step."))
    energy: Optional[EnergyConfig] = Field(None, description=(
        "Energy and its cost (none by default: no energy figures)."))
    output: OutputConfig = Field(OutputConfig(), description="The results folder.")
    backend: BackendConfig = Field(BackendConfig(), description="The step-time backend.")
    # Set by load_scenario, not by the file: where relative paths start, and the file for errors.
    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<scenario>")

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def source(self) -> str:
        return self._source

    def located(self, source: str, base_dir: Path) -> "Scenario":
        """The scenario as read from `source`, its relative paths starting at `base_dir`."""
        self._base_dir, self._source = base_dir, source
        return self

    @model_validator(mode="after")
    def _unique_policy_names(self):
        names = [p.name for p in self.policies]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"policy names must be unique, repeated: {', '.join(sorted(dup))}")
        return self

    @model_validator(mode="after")
    def _disaggregation(self):
        for i, p in enumerate(self.policies):
            if p.disaggregated and self.disaggregation is None:
                raise ValueError(f"policies[{i}].disaggregated: the scenario has no [disaggregation] section")
            if p.disaggregated and p.allocator != "paged":
                raise ValueError(f"policies[{i}].allocator: disaggregated serving needs the paged allocator "
                                 "(vLLM's NixlConnector moves KV blocks)")
        return self

    @model_validator(mode="after")
    def _autoscaled(self):
        if self.autoscaling is not None:
            check_autoscaled(self)
        return self

    def _speculative_policies(self):
        for i, p in enumerate(self.policies):
            if (p.speculative or p.num_speculative_tokens) and self.speculative is None:
                key = "speculative" if p.speculative else "num_speculative_tokens"
                raise ValueError(f"policies[{i}].{key}: the scenario has no [speculative] section")
            if self.speculative is not None and self.speculative.acceptance is not None and \
                    len(self.speculative.acceptance) < (p.num_speculative_tokens or 0):
                raise ValueError(f"policies[{i}].num_speculative_tokens: speculative.acceptance gives "
                                 f"{len(self.speculative.acceptance)} positions")
        return self

    def speculates(self, policy: PolicyConfig) -> bool:
        """Whether the policy runs the scenario's [speculative] decoding (by default: when there is one and
        the policy is served on [hardware] with the paged allocator, which kvsim simulates it on)."""
        if self.speculative is None or policy.speculative is False:
            return False
        return bool(policy.speculative) or (policy.allocator == "paged" and not self.disaggregated(policy))

    @model_validator(mode="after")
    def _kv_offload(self):
        for i, p in enumerate(self.policies):
            if p.kv_offload and self.kv_offload is None:
                raise ValueError(f"policies[{i}].kv_offload: the scenario has no [kv_offload] section")
            if p.kv_offload and p.allocator != "paged":
                raise ValueError(f"policies[{i}].kv_offload: KV offload needs the paged allocator (vLLM's "
                                 "connectors move KV blocks; a contiguous slab has none)")
            if p.kv_offload and self.disaggregated(p):
                raise ValueError(f"policies[{i}].kv_offload: offload tiers on disaggregated pools are not "
                                 "simulated: set disaggregated = false or kv_offload = false")
        return self

    def offloaded(self, policy: PolicyConfig) -> bool:
        """Whether the policy is served with the [kv_offload] tiers (by default: when the scenario has them,
        the allocator is paged and the policy is served aggregated)."""
        if policy.kv_offload is None:
            return self.kv_offload is not None and policy.allocator == "paged" and not self.disaggregated(policy)
        return policy.kv_offload

    def disaggregated(self, policy: PolicyConfig) -> bool:
        """Whether the policy is served by the [disaggregation] pools (by default: when the scenario has
        them and the policy's allocator is paged)."""
        if policy.disaggregated is None:
            return self.disaggregation is not None and policy.allocator == "paged"
        return policy.disaggregated

    def resolve(self, path: str) -> Path:
        """A path from the scenario, made absolute against the scenario's folder."""
        p = _expanduser(Path(path))
        return p if p.is_absolute() else (self.base_dir / p)

    def prefix_caching(self, policy: PolicyConfig) -> bool:
        if policy.allocator != "paged":
            return False
        return self.engine.enable_prefix_caching if policy.enable_prefix_caching is None else policy.enable_prefix_caching


def _expanduser(path: Path) -> Path:
    try:
        return path.expanduser()
    except RuntimeError:  # ~user of no such user: the path as written
        return path


def results_dir(scenario: Scenario) -> Path:
    """`<output.dir>/<name>`: output.dir relative to the current working directory."""
    return _expanduser(Path(scenario.output.dir)) / (scenario.name or "scenario")


_BOUND_WORDS = {"greater_than": "greater than", "greater_than_equal": "at least", "less_than": "less than",
                "less_than_equal": "at most"}


def format_validation_error(source: str, err: ValidationError) -> str:
    """The first problem of a pydantic error as `file: key.path: reason` (one line)."""
    first = err.errors()[0]
    loc = tuple(x for x in first["loc"] if not (isinstance(x, str) and (x.startswith("function-") or x == "[key]")))
    msg = first["msg"].replace("Value error, ", "")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "literal_error":
        msg = msg.replace("Input should be", "must be")
    elif first["type"] in _BOUND_WORDS:
        bound = next(iter(first["ctx"].values()))
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        msg = f"must be {_BOUND_WORDS[first['type']]} {bound:,}, got {str(first['input'])[:40]}"
    elif first["type"] == "finite_number":
        msg = f"must be a finite number, got {first['input']}"
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {key_path(loc)}: {msg}{tail}"


def scenario_from_dict(data: dict, source: str = "<scenario>", base_dir: Path = Path(".")) -> Scenario:
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        raise KvsimError(format_validation_error(source, err)) from None
    return sc.located(source, base_dir)


def name_from_stem(stem: str) -> str:
    """A scenario file's name made into a plain `name` (other characters become '_')."""
    name = re.sub(r"\.{2,}", ".", re.sub(r"[^\w.+-]+", "_", stem)).lstrip(".")[:L.MAX_NAME_CHARS]
    return name or "scenario"


def scenario_from_toml(text: str, source: str, base_dir: Path, overrides: Iterable[str] = (),
                       default_name: Optional[str] = None) -> Scenario:
    """Validate scenario TOML text; `overrides` are `--set dotted.key=value` strings applied first."""
    data = parse_toml(text, source)
    if default_name is not None:
        data.setdefault("name", default_name)
    if overrides:
        data = apply_overrides(data, overrides)
        check_values(data, source)
    return scenario_from_dict(data, source, base_dir)


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read and validate a scenario TOML file, with `--set` overrides applied before validation."""
    path = user_path(path, "scenario file")
    text = read_text(path, "scenario file", MAX_TOML_BYTES)
    return scenario_from_toml(text, str(path), path.resolve().parent, overrides, default_name=name_from_stem(path.stem))


def json_schema() -> str:
    return json.dumps(Scenario.model_json_schema(), indent=2)
