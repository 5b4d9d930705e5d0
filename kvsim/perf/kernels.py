"""Measured vLLM kernel times: the shipped tables (NVIDIA AIConfigurator's), checked and loaded.

The tables are NVIDIA AIConfigurator's timings of real vLLM kernels (github.com/ai-dynamo/aiconfigurator,
Apache-2.0; `kernel_data/LICENSE`), converted once by `kvsim.calibrate.aiconfigurator` into one compressed
`.npz` per GPU preset and vLLM release (`kernel_data/<gpu>-vllm-<version>.npz`, provenance under its
`meta`): dense grids in ms per call, NaN where a shape was not timed, rounded to float16 (0.05%).
Shipping them converted keeps pyarrow out of kvsim's dependencies and the package independent of the
raw tables; a few hundred KiB of grids load in milliseconds. `kvsim.perf.kernel_curves` cuts them down
to one model's shapes.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError

DATA_DIR = Path(__file__).parent / "kernel_data"
GPU_STEMS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm", "A100-80GB": "a100_sxm", "B200": "b200_sxm"}
# array name -> (dimensions, axis names) every kernel-table file must hold
_GEMM_AXES = ("m", "n", "k")
_CONTEXT_AXES = ("kv", "head_dim", "heads", "isl", "batch")
_GENERATION_AXES = ("kv", "head_dim", "heads", "batch", "step")


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))


def release_of(version: str) -> str:
    """The release X.Y.Z a version string names ("0.16" -> "0.16.0"; "v0.16.1rc2", "0.16.1.post1" -> "0.16.1")."""
    parts = version.strip().lstrip("v").split(".")
    digits = []
    for p in parts[:3]:
        lead = len(p) - len(p.lstrip("0123456789"))
        digits.append(p[:lead] or "0")
        if lead < len(p):
            break
    return ".".join(str(int(d)) for d in (digits + ["0", "0"])[:3])


def nearest_release(versions: list[str], wanted: str) -> str:
    """The shipped release that prices `wanted` (kvsim.perf.basis says so in its label): the same release,
    else the newest shipped before it (its kernels are the ones that release inherited: vLLM keeps a kernel
    until a release changes it, so a table never describes a release older than it was timed on), else,
    for a release older than every table, the oldest shipped."""
    want = version_key(release_of(wanted))
    older = [v for v in versions if version_key(v) <= want]
    return max(older, key=version_key) if older else min(versions, key=version_key)


def shipped_versions(gpu_name: str) -> list[str]:
    """vLLM releases whose kernel tables ship for this GPU preset, oldest first ([] for none)."""
    stem = GPU_STEMS.get(gpu_name)
    if stem is None:
        return []
    found = [p.name[len(stem) + 6:-4] for p in DATA_DIR.glob(f"{stem}-vllm-*.npz")]
    return sorted(found, key=version_key)


def shipped_path(gpu_name: str, version: str) -> Path:
    return DATA_DIR / f"{GPU_STEMS[gpu_name]}-vllm-{version}.npz"


@dataclass(slots=True, frozen=True)
class MoeTable:
    """vLLM's fused MoE layer timed per configuration (rows of `config`: hidden, moe intermediate size,
    top-k, experts, moe TP, moe EP, routing code) over the tokens entering it: `ms` [config, tokens]."""

    config: np.ndarray
    tokens: np.ndarray
    ms: np.ndarray


MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "mxfp4", "nvfp4", "int4")
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")
MLA_FAMILIES = {"mla_context": ("heads", "isl", "batch"), "mla_generation": ("heads", "batch", "step")}


@dataclass(slots=True, frozen=True)
class Grid:
    """One kernel family's timings: `axes` (name -> sorted int array) and `ms` over them (NaN: not timed)."""

    axes: dict
    ms: np.ndarray


class KernelTables:
    """One kernel-table file, checked: every array a step needs, consistent shapes, positive times."""

    def __init__(self, path: Path):
        self.path = Path(path)
        arrays = _read_npz(self.path)
        self.meta = self._meta(arrays)
        self.gemm = {d: self._grid(arrays, f"gemm/{d}", _GEMM_AXES) for d in GEMM_DTYPES
                     if f"gemm/{d}/ms" in arrays or d == "bfloat16"}
        self.context = {d: self._grid(arrays, f"context/{d}", _CONTEXT_AXES) for d in ("bfloat16", "fp8")
                        if f"context/{d}/ms" in arrays or d == "bfloat16"}
        self.generation = {d: self._grid(arrays, f"generation/{d}", _GENERATION_AXES) for d in ("bfloat16", "fp8")
                           if f"generation/{d}/ms" in arrays or d == "bfloat16"}
        self.allreduce = {mode: self._grid(arrays, "allreduce", ("gpus", "size"), f"{mode}_ms")
                          for mode in ("graph", "eager")}
        # optional tables (a release may lack them; models that need them are priced by the roofline)
        self.moe = {d: self._moe(arrays, d) for d in MOE_DTYPES if f"moe/{d}/ms" in arrays}
        # attention timed with a sliding window: (family, kv dtype, window) -> grid over the same axes
        self.windowed = {}
        for name in arrays:
            parts = name.split("/")
            if len(parts) == 5 and parts[0] == "window" and parts[4] == "ms" and parts[1].isdigit():
                family, kvd, window = parts[2], parts[3], int(parts[1])
                axes = _CONTEXT_AXES if family == "context" else _GENERATION_AXES
                self.windowed[(family, kvd, window)] = self._grid(arrays, "/".join(parts[:4]), axes)
        self.mla = {(family, kvd, gemm): self._grid(arrays, f"{family}/{kvd}/{gemm}", axes)
                    for family, axes in MLA_FAMILIES.items() for kvd in ("bfloat16", "fp8")
                    for gemm in ("bfloat16", "fp8_block") if f"{family}/{kvd}/{gemm}/ms" in arrays}

    @property
    def vllm_version(self) -> str:
        return self.meta["vllm_version"]

    def _meta(self, arrays: dict) -> dict:
        raw = arrays.get("meta")
        try:
            meta = json.loads(str(raw[()]))
            if not isinstance(meta, dict) or not isinstance(meta.get("vllm_version"), str):
                raise ValueError
        except (TypeError, ValueError, IndexError, KeyError):
            raise KvsimError(f"{self.path}: meta: missing or not the provenance record kvsim writes") from None
        return meta

    def _grid(self, arrays: dict, prefix: str, axis_names: tuple, ms_name: str = "ms") -> Grid:
        axes = {}
        for name in axis_names:
            a = arrays.get(f"{prefix}/{name}")
            if a is None:
                raise KvsimError(f"{self.path}: {prefix}/{name}: missing")
            if a.ndim != 1 or a.dtype.kind not in "iu" or len(a) < 1 or (a < 0).any() or (np.diff(a) <= 0).any():
                raise KvsimError(f"{self.path}: {prefix}/{name}: must be increasing non-negative integers")
            axes[name] = a.astype(np.int64)
        ms = arrays.get(f"{prefix}/{ms_name}")
        if ms is None:
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: missing")
        shape = tuple(len(a) for a in axes.values())
        if ms.dtype.kind != "f" or ms.shape != shape:
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: expected floats of shape {shape}, got {ms.dtype} {ms.shape}")
        ms = ms.astype(np.float64)
        finite = ms[~np.isnan(ms)]
        if finite.size == 0 or not np.isfinite(finite).all() or (finite <= 0).any():
            raise KvsimError(f"{self.path}: {prefix}/{ms_name}: times must be positive numbers (NaN: not timed)")
        return Grid(axes, ms)


    def _moe(self, arrays: dict, dtype: str) -> MoeTable:
        config, tokens, ms = (arrays.get(f"moe/{dtype}/{n}") for n in ("config", "tokens", "ms"))
        if config is None or tokens is None or config.ndim != 2 or config.shape[1] != 7 or \
                ms.shape != (len(config), len(tokens)) or (np.diff(tokens) <= 0).any():
            raise KvsimError(f"{self.path}: moe/{dtype}: expected config [n, 7], increasing tokens and ms [n, tokens]")
        ms = ms.astype(np.float64)
        finite = ms[~np.isnan(ms)]
        if finite.size == 0 or (finite <= 0).any() or not np.isfinite(finite).all():
            raise KvsimError(f"{self.path}: moe/{dtype}/ms: times must be positive numbers (NaN: not timed)")
        return MoeTable(config.astype(np.int64), tokens.astype(np.int64), ms)


def _read_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise KvsimError(f"{path}: kernel tables not found") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise KvsimError(f"{path}: not a kernel-table file ({str(exc).splitlines()[0][:100]})") from None


@lru_cache(maxsize=8)
def load_tables(path) -> KernelTables:
    return KernelTables(Path(path))
