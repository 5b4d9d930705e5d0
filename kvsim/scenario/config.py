"""Scenario files: the TOML schema, strict validation and one-line errors.

A scenario has the sections model, hardware, engine, policies (one or more, compared in one run),
workload, slo, output and backend. Names follow vLLM's engine arguments where vLLM has them, so a
user can carry a serving config over. `load_scenario(path)` returns a validated `Scenario` or raises
`KvsimError` naming the file, the key path and the reason. Relative paths inside a scenario are
resolved against the scenario file's folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from kvsim.errors import KvsimError, read_text
from kvsim.scenario.overrides import apply_overrides

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "int8", "int4")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelConfig(_Section):
    """A preset name from kvsim.scenario.catalog, or a Hugging Face config.json."""

    name: Optional[str] = None
    hf_config: Optional[str] = None
    dtype: Literal["bfloat16", "float16", "float32", "fp8"] = "bfloat16"

    @model_validator(mode="after")
    def _one_source(self):
        if (self.name is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'name' (a preset) or 'hf_config' (a config.json path)")
        return self


class HardwareConfig(_Section):
    """A GPU preset, optional overrides of its datasheet figures, and how many GPUs serve."""

    gpu: str = "H100-SXM"
    tensor_parallel_size: PosInt = 1
    num_replicas: PosInt = 1
    # prefix_affinity: to the replica whose prefix cache holds most of the prompt, load permitting
    router: Literal["least_loaded", "round_robin", "prefix_affinity"] = "least_loaded"
    gpu_memory_utilization: Fraction = 0.9
    memory_gib: Optional[PosFloat] = None
    hbm_bandwidth_gbps: Optional[PosFloat] = None
    bf16_tflops: Optional[PosFloat] = None
    fp8_tflops: Optional[PosFloat] = None
    fp32_tflops: Optional[PosFloat] = None
    nvlink_gbps: Optional[PosFloat] = None  # GB/s each way (half the datasheet's bidirectional figure)
    pcie_gbps: Optional[PosFloat] = None  # GB/s each way


class EngineConfig(_Section):
    """vLLM engine arguments, with vLLM's defaults (V1 `vllm serve`; see kvsim.scenario.defaults)."""

    block_size: Literal[1, 8, 16, 32, 64, 128] = 16
    max_num_seqs: Optional[PosInt] = None  # None: vLLM's default for the GPU (1024 on >= 70 GiB but A100, else 256)
    max_num_batched_tokens: Optional[PosInt] = None  # None: vLLM's default for the GPU (8192, else 2048)
    max_model_len: Optional[PosInt] = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    swap_space: NonNegFloat = 4.0  # GiB of host memory per GPU for swapped-out KV, as vLLM
    activation_reserve_gib: Optional[NonNegFloat] = None  # None: estimated from the model
    fixed_reserve_gib: Optional[NonNegFloat] = None  # None: vLLM's non-torch memory (see kvsim.perf.memory)


class PolicyConfig(_Section):
    """One KV-cache policy to compare: allocator, cache dtype and prefill mode."""

    name: str
    allocator: Literal["paged", "contiguous"] = "paged"
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"  # type: ignore[valid-type]
    # fp8: "per_tensor" as vLLM (no scale bytes in the blocks) or "per_token" (a float32 scale per
    # token and head, as kvsim's triton kernels store them); int8/int4 are always per token.
    kv_cache_scales: Literal["per_tensor", "per_token"] = "per_tensor"
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: Optional[PosInt] = None  # None: engine.max_num_batched_tokens (the chunk budget)
    enable_prefix_caching: Optional[bool] = None  # None: engine.enable_prefix_caching (paged only)
    contiguous_reserve: Literal["max_model_len", "known_output"] = "max_model_len"

    @model_validator(mode="after")
    def _contiguous_has_no_prefix_cache(self):
        if self.allocator == "contiguous" and self.enable_prefix_caching:
            raise ValueError("prefix caching needs the paged allocator")
        return self


class LengthDist(_Section):
    """Token-length distribution: fixed, uniform [min, max], lognormal (mean, sigma) or from the trace."""

    dist: Literal["fixed", "uniform", "lognormal", "trace"] = "fixed"
    value: Optional[PosInt] = None
    min: Optional[PosInt] = None
    max: Optional[PosInt] = None
    mean: Optional[PosFloat] = None
    sigma: Optional[PosFloat] = None

    @model_validator(mode="after")
    def _params(self):
        need = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma"), "trace": ()}
        missing = [k for k in need[self.dist] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {', '.join(missing)}")
        if self.dist == "uniform" and self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


class ArrivalConfig(_Section):
    """Poisson or gamma (bursty: cv > 1) arrivals at `rate` requests/s, or the trace's own times."""

    process: Literal["poisson", "gamma", "trace"] = "poisson"
    rate: Optional[PosFloat] = None
    cv: PosFloat = 1.0
    time_scale: PosFloat = 1.0  # trace replay: multiply inter-arrival gaps by this (0.5 = twice the load)

    @model_validator(mode="after")
    def _rate(self):
        if self.process != "trace" and self.rate is None:
            raise ValueError(f"process '{self.process}' needs 'rate' (requests per second)")
        return self


class PrefixConfig(_Section):
    """Groups of requests that share a system prompt, so prefix caching has something to find."""

    num_groups: PosInt = 1
    prefix_len: PosInt = 512
    fraction: Fraction = 1.0  # share of requests that carry a group's prefix


class TraceConfig(_Section):
    format: Literal["azure", "mooncake", "csv"]
    path: str
    max_requests: Optional[PosInt] = None


class WorkloadConfig(_Section):
    seed: NonNegInt = 0
    num_requests: Optional[PosInt] = None
    duration_s: Optional[PosFloat] = None
    arrival: ArrivalConfig = ArrivalConfig(rate=1.0)
    prompt_len: LengthDist = LengthDist(dist="fixed", value=512)
    output_len: LengthDist = LengthDist(dist="fixed", value=128)
    prefix: Optional[PrefixConfig] = None
    trace: Optional[TraceConfig] = None

    @model_validator(mode="after")
    def _consistent(self):
        uses_trace = (self.arrival.process == "trace" or self.prompt_len.dist == "trace"
                      or self.output_len.dist == "trace")
        if uses_trace and self.trace is None:
            raise ValueError("arrival process or lengths come from a trace, but [workload.trace] is missing")
        if self.trace is None and self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        return self


class SloConfig(_Section):
    """A request meets the SLO when every given bound holds (milliseconds)."""

    ttft_ms: Optional[PosFloat] = 2000.0
    itl_ms: Optional[PosFloat] = 100.0  # mean inter-token latency of the request (TPOT)
    e2e_ms: Optional[PosFloat] = None


class OutputConfig(_Section):
    dir: str = "results"
    timeseries_interval_s: PosFloat = 0.25
    report_html: bool = True


class BackendConfig(_Section):
    name: str = "analytic"
    calibration: Optional[str] = None  # JSON of roofline coefficients, relative to the scenario
    device: str = "cuda:0"  # triton backend
    seed: NonNegInt = 0  # triton backend: random weights
    enforce_eager: bool = False  # triton backend: no CUDA graphs for decode steps


class Scenario(_Section):
    name: Optional[str] = None
    description: str = ""
    model: ModelConfig
    hardware: HardwareConfig = HardwareConfig()
    engine: EngineConfig = EngineConfig()
    policies: Annotated[list[PolicyConfig], Field(min_length=1)]
    workload: WorkloadConfig
    slo: SloConfig = SloConfig()
    output: OutputConfig = OutputConfig()
    backend: BackendConfig = BackendConfig()
    # Set by load_scenario, not by the file: where relative paths start, and the file for errors.
    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<scenario>")

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def source(self) -> str:
        return self._source

    @model_validator(mode="after")
    def _unique_policy_names(self):
        names = [p.name for p in self.policies]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"policy names must be unique, repeated: {', '.join(sorted(dup))}")
        return self

    def resolve(self, path: str) -> Path:
        """A path from the scenario, made absolute against the scenario's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)

    def prefix_caching(self, policy: PolicyConfig) -> bool:
        if policy.allocator != "paged":
            return False
        return self.engine.enable_prefix_caching if policy.enable_prefix_caching is None else policy.enable_prefix_caching


def _key_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def format_validation_error(source: str, err: ValidationError) -> str:
    """The first problem of a pydantic error as `file: key.path: reason` (one line)."""
    first = err.errors()[0]
    loc = tuple(x for x in first["loc"] if not (isinstance(x, str) and x.startswith("function-")))
    msg = first["msg"].replace("Value error, ", "")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "literal_error":
        msg = msg.replace("Input should be", "must be")
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {_key_path(loc)}: {msg}{tail}"


def scenario_from_dict(data: dict, source: str = "<scenario>", base_dir: Path = Path(".")) -> Scenario:
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        raise KvsimError(format_validation_error(source, err)) from None
    sc._base_dir, sc._source = base_dir, source
    return sc


def scenario_from_toml(text: str, source: str, base_dir: Path, overrides: Iterable[str] = (),
                       default_name: Optional[str] = None) -> Scenario:
    """Validate scenario TOML text; `overrides` are `--set dotted.key=value` strings applied first."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KvsimError(f"{source}: invalid TOML: {exc}") from None
    if default_name is not None:
        data.setdefault("name", default_name)
    return scenario_from_dict(apply_overrides(data, overrides), source, base_dir)


def load_scenario(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read and validate a scenario TOML file, with `--set` overrides applied before validation."""
    path = Path(path)
    text = read_text(path, "scenario file")
    return scenario_from_toml(text, str(path), path.resolve().parent, overrides, default_name=path.stem)


def json_schema() -> str:
    return json.dumps(Scenario.model_json_schema(), indent=2)
