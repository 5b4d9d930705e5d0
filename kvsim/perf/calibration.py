"""The step-time model's coefficients (`Calibration`), their JSON files, and the calibrations shipped
per GPU preset in `kvsim/perf/calibrations/`.

A calibration file is a JSON object: either the coefficients themselves, or (as `kvsim calibrate`
writes them) `{"coefficients": {...}, "provenance": {...}, ...}`. Coefficients it leaves out keep
their defaults. `backend.calibration` names such a file, or one of the shipped ones by engine:
`"vllm"` (the default: vLLM V1 as public data show it) or `"triton"` (kvsim's own GPU engine).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.scenario.files import read_json_object
from kvsim.scenario.publish import UNVETTED, write_text_atomic

SHIPPED_DIR = Path(__file__).parent / "calibrations"
ENGINES = ("vllm", "triton")
EFFICIENCIES = ("compute_efficiency", "attention_efficiency", "memory_efficiency", "allreduce_efficiency")
_META_KEYS = ("written_by", "gpu", "engine", "description", "provenance", "fit", "sources")


@dataclass(slots=True, frozen=True)
class Calibration:
    """Coefficients from datasheet peaks to achieved times. The defaults are vLLM V1's on an H100
    (kvsim/perf/calibrations/H100-SXM.json, rounded; it gives each figure's source), used for GPU
    presets that ship no calibration of their own."""

    compute_efficiency: float = 0.76  # GEMMs: achieved / peak dense FLOP/s
    gemm_pad_tokens: float = 245.0  # rows a GEMM's compute is charged beyond its tokens (tile and wave quantization)
    attention_efficiency: float = 0.55  # attention FLOPs: achieved / peak
    memory_efficiency: float = 0.76  # achieved / datasheet HBM bandwidth (weights, KV, activations)
    graph_step_overhead_s: float = 0.0005  # fixed cost of a CUDA-graph (pure decode) step
    step_overhead_s: float = 0.0005  # fixed cost of an eager or piecewise-graph (prefill, mixed) step
    eager_layer_s: float = 0.0  # host time to launch one layer eagerly: a floor under the GPU time
    eager_attention_s: float = 0.0  # host time per layer per attention kernel kind launched (decode, prefill)
    eager_quantized_s: float = 0.0  # host time per layer to launch the decode kernels of a quantized KV cache
    layer_overhead_s: float = 0.0  # per layer: the floor of the small kernels (norms, RoPE, activation, KV store)
    attention_floor_s: float = 0.0  # per layer: the least an attention kernel takes
    prefill_key_s: float = 0.0  # per layer and cached key: one prefill attention program's serial time
    decode_key_s: float = 0.0  # per layer and key: one decode attention program's serial time over its split
    per_seq_overhead_s: float = 2.5e-6  # host work per scheduled sequence
    allreduce_latency_s: float = 2.9e-5  # per all-reduce call, whatever the tensor parallel size
    allreduce_efficiency: float = 0.78  # achieved bus bandwidth / NVLink bandwidth per direction
    dequant_flops_per_element: float = 27.0  # per KV element read from a quantized cache (int4: twice)
    quantized_prefill_factor: float = 1.0  # prefill attention time with a quantized KV cache / with 16-bit
    quantized_prefill_token_s: float = 0.0  # per layer and new token: a quantized cache's prefill attention beyond that

    def to_dict(self) -> dict:
        return asdict(self)


COEFFICIENTS = tuple(f.name for f in fields(Calibration))


def coefficient_bounds(key: str) -> tuple[float, float]:
    """An efficiency divides achieved rates: [0.001, 1]; a time (a key ending in _s) at most 10 s; any other
    coefficient at most 1e6."""
    if key in EFFICIENCIES:
        return 0.001, 1.0
    return 0.0, 10.0 if key.endswith("_s") else 1e6


def check_coefficients(data: dict, source: str) -> dict:
    """{name: float} from a JSON object of coefficients, or KvsimError naming the key at fault."""
    out = {}
    for key, value in data.items():
        if key not in COEFFICIENTS:
            raise KvsimError(f"{source}: {key}: unknown calibration key (known: {', '.join(COEFFICIENTS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KvsimError(f"{source}: {key}: must be a number, got {str(value)[:40]}")
        low, high = coefficient_bounds(key)
        if not low <= value <= high:
            raise KvsimError(f"{source}: {key}: must be in [{low:g}, {high:g}], got {value!r}")
        out[key] = float(value)
    return out


def load_calibration(path) -> Calibration:
    """A Calibration from a JSON file (coefficients at the top level or under "coefficients")."""
    path = Path(path)
    data = read_json_object(path, "calibration (backend.calibration)")
    if "coefficients" in data:
        extra = [k for k in data if k != "coefficients" and k not in _META_KEYS]
        if extra:
            raise KvsimError(f"{path}: {extra[0]}: unknown key (known: coefficients, {', '.join(_META_KEYS)})")
        if not isinstance(data["coefficients"], dict):
            raise KvsimError(f"{path}: coefficients: must be a JSON object")
        data = data["coefficients"]
    return Calibration(**check_coefficients(data, str(path)))


def shipped_path(gpu_name: str, engine: str = "vllm") -> Path:
    """Where the calibration shipped for this GPU preset and engine lives (it may not exist)."""
    return SHIPPED_DIR / (f"{gpu_name}.json" if engine == "vllm" else f"{gpu_name}-{engine}.json")


def resolve_calibration(scenario, gpu_name: str) -> tuple[Calibration, str]:
    """The scenario's calibration and where it came from: `backend.calibration` as a file or a shipped
    engine name, else the shipped vLLM calibration of the GPU preset, else the built-in defaults."""
    name = scenario.backend.calibration
    if name is None or name in ENGINES:
        path = shipped_path(gpu_name, name or "vllm")
        if path.exists():
            return load_calibration(path), f"shipped:{path.name}"
        if name is not None:
            shipped = sorted(p.name for p in SHIPPED_DIR.glob("*.json"))
            raise KvsimError(f"{scenario.source}: backend.calibration: no shipped '{name}' calibration for GPU "
                             f"{gpu_name} (shipped: {', '.join(shipped)}); give a calibration file")
        return Calibration(), "built-in defaults"
    path = scenario.resolve(name)
    return load_calibration(path), str(path)


def write_calibration(path, calibration: Calibration, may_replace=None, vetted=UNVETTED, **meta) -> None:
    """A calibration file as `load_calibration` reads it, with provenance and fit figures beside it (finite
    JSON; an existing file is replaced only when `may_replace(path)` says kvsim wrote it, or, `vetted` by
    kvsim.scenario.publish.vet_output when the command started, only that file as it was then)."""
    data = {k: v for k, v in meta.items() if v is not None}
    data["coefficients"] = calibration.to_dict()
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n", "calibration", may_replace, vetted)
