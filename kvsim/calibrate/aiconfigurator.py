"""NVIDIA AIConfigurator's vLLM kernel timings (Parquet) into kvsim's kernel-table files.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) times real vLLM kernels on real GPUs,
one call per row, and publishes them per GPU and vLLM release under
`aic-core/src/aiconfigurator_core/systems/data/<gpu>/`. `convert(root, gpu, version)` reads the
tables a step needs and returns the arrays `kvsim.perf.kernels.KernelTables` loads: dense grids (NaN
where a shape was not timed) in milliseconds, as published:

- `gemm/<dtype>/{m,n,k,ms}`: dense GEMMs (m tokens x k) by (k x n): bfloat16, per-tensor fp8 (`fp8`),
  128x128-block fp8 (`fp8_block`, DeepSeek-style checkpoints) and NVFP4 (`nvfp4`, Blackwell only);
- `context/<kv dtype>/{kv,head_dim,heads,isl,batch,ms}`: prefill attention over `isl` new tokens and
  no cache; `kv` 0 stands for MHA (as in AIConfigurator's own loader), else the KV heads;
- `generation/<kv dtype>/{kv,head_dim,heads,batch,step,ms}`: one decode token per sequence attending
  to `step` keys, its own included (the collector builds `seq_lens = [step]`, `query_lens = [1]`:
  collector/vllm/collect_attn.py);
- `window/<w>/context/...` and `window/<w>/generation/...` (where the release has them): the same two
  attention tables timed with a sliding window of `w` tokens (`window_size` w, e.g. gpt-oss's 128),
  over the same axes: `isl` and `step` stay the whole prompt or context, the kernel reads the window;
- `allreduce/{gpus,size,graph_ms,eager_ms}`: vLLM's `tensor_model_parallel_all_reduce` of `size`
  bfloat16 elements inside a CUDA graph and eagerly (collector/collect_all_reduce.py; whatever vLLM
  dispatches at that size: its custom all-reduce, or NCCL beyond the custom one's limit);
- `moe/<moe dtype>/{config,tokens,ms}` (where the release has them): vLLM's fused MoE layer
  (`fused_experts`: routed experts only, no router and no shared experts) on one rank, at `tokens`
  tokens entering it; one row per `config` = (hidden, moe intermediate size before TP, top-k, experts,
  moe TP, moe EP, routing: 0 balanced, else the power law's exponent x 100), kept as rows because the
  configurations are a few model shapes, not a grid (collector/vllm/collect_moe.py);
- `mla_context/<kv dtype>/<gemm dtype>/{heads,isl,batch,ms}` and
  `mla_generation/<kv dtype>/<gemm dtype>/{heads,batch,step,ms}` (where the release has them): the whole
  DeepSeek-V3 MLA attention module (projections, attention, output; collector/vllm/collect_mla_module.py)
  per layer and rank, `heads` the query heads on the rank, `step` the keys a decode token attends to.

Of several kernels timed for one table (FA3 and FA4 on Hopper, FlashInfer and Triton on Blackwell),
the one with the most rows is kept: the backend vLLM picks by default for that GPU. Repeated shapes
keep their median. A release whose folder holds a `reuse.yaml` takes that table from the release it
names (AIConfigurator's own rule). Pure numpy once read; reading needs `pyarrow` (not a kvsim
dependency: the shipped files are already converted).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.publish import UNVETTED, write_bytes_atomic

SOURCE_REPO = "ai-dynamo/aiconfigurator"
SOURCE_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
SOURCE_FOLDER = "aic-core/src/aiconfigurator_core/systems/data"
AIC_GPUS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm", "A100-80GB": "a100_sxm", "B200": "b200_sxm"}
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")
KV_DTYPES = ("bfloat16", "fp8")
# (family folder, file, backend) of each table a step needs
TABLES = {
    "gemm": ("gemm", "gemm_perf.parquet", "vllm"),
    "context": ("attention", "context_attention_perf.parquet", "vllm"),
    "generation": ("attention", "generation_attention_perf.parquet", "vllm"),
    "allreduce": ("comm", "custom_allreduce_perf.parquet", "vllm"),
}
# tables a release may lack: the model families that need them fall back to the roofline
OPTIONAL = {
    "moe": ("moe", "moe_perf.parquet", "vllm"),
    "mla_context": ("mla", "mla_context_module_perf.parquet", "vllm"),
    "mla_generation": ("mla", "mla_generation_module_perf.parquet", "vllm"),
}
# the collector's moe_dtype -> kvsim's: int4_wo is vLLM's Marlin int4 weight-only MoE (w4a16, Kimi-K2.5's experts)
MOE_DTYPES = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "w4a16_mxfp4": "mxfp4", "nvfp4": "nvfp4",
              "int4_wo": "int4"}
COLUMNS = {
    "moe": ("kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency"),
    "mla_context": ("kernel_source", "kv_cache_dtype", "gemm_type", "num_heads", "isl", "batch_size", "latency"),
    "mla_generation": ("kernel_source", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "step", "latency"),
    "gemm": ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"),
    "context": ("kernel_source", "kv_cache_dtype", "num_key_value_heads", "head_dim", "num_heads", "isl",
                "batch_size", "latency"),
    "generation": ("kernel_source", "kv_cache_dtype", "num_key_value_heads", "head_dim", "num_heads",
                   "batch_size", "step", "latency"),
    "allreduce": ("backend", "allreduce_dtype", "num_gpus", "message_size", "latency"),
}


def _reuse_from(folder: Path, table: str) -> str | None:
    """The release a `reuse.yaml` beside `folder` sends `table` to (None: none)."""
    path = folder / "reuse.yaml"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    for block in re.split(r"\n-\s+", "\n" + text):
        if re.search(rf"table:\s*{re.escape(table)}\b", block):
            found = re.search(r"from_version:\s*['\"]?([\w.]+)", block)
            if found:
                return found.group(1)
    return None


def table_file(root: Path, aic_gpu: str, family: str, version: str) -> tuple[Path, str]:
    """The Parquet file of `family` for `version` and the release it was timed on (reuse followed)."""
    folder_name, filename, backend = TABLES.get(family) or OPTIONAL[family]
    folder = root / aic_gpu / folder_name / backend / version
    path = folder / filename
    if path.is_file():
        return path, version
    donor = _reuse_from(folder, filename.removesuffix(".parquet"))
    if donor is not None and donor != version:
        donor_path = root / aic_gpu / folder_name / backend / donor / filename
        if donor_path.is_file():
            return donor_path, donor
    raise KvsimError(f"{path}: not found (no {family} table for vLLM {version} on {aic_gpu})")


def versions(root: Path, aic_gpu: str) -> list[str]:
    """Releases with every table a step needs (reuse followed), oldest first."""
    base = root / aic_gpu
    found = set()
    for family, (folder_name, _, backend) in TABLES.items():
        for d in (base / folder_name / backend).glob("*"):
            found.add(d.name)
    out = []
    for v in found:
        try:
            for family in TABLES:
                table_file(root, aic_gpu, family, v)
        except KvsimError:
            continue
        out.append(v)
    return sorted(out, key=version_key)


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.]", version))


def read_columns(path: Path, columns: tuple) -> dict:
    """{column: numpy array} of a Parquet file, or one line naming the file and the column at fault."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise KvsimError(f"{path}: reading AIConfigurator's Parquet tables needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own types for bad files
        raise KvsimError(f"{path}: not a readable Parquet table ({str(exc).splitlines()[0][:120]})") from None
    out = {}
    for col in columns:
        if col not in table.column_names:
            raise KvsimError(f"{path}: missing column {col}")
        out[col] = table.column(col).to_numpy(zero_copy_only=False)
    if table.num_rows == 0:
        raise KvsimError(f"{path}: no rows")
    try:
        lat = out["latency"].astype(float)
    except (TypeError, ValueError):
        raise KvsimError(f"{path}: latency: not numbers") from None
    bad = ~np.isfinite(lat) | (lat <= 0)
    if bad.any():
        raise KvsimError(f"{path}: latency: row {int(np.argmax(bad))} is not a positive number ({lat[bad][0]!r})")
    out["latency"] = lat
    return out


def _most_rows(sources: np.ndarray, mask: np.ndarray) -> str:
    names, counts = np.unique(sources[mask], return_counts=True)
    return str(names[np.argmax(counts)])


def _grid(keys: list[np.ndarray], values: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """A dense grid over the sorted distinct values of each key column; cells hold the median of their rows."""
    axes = [np.unique(k) for k in keys]
    idx = tuple(np.searchsorted(a, k) for a, k in zip(axes, keys))
    flat = np.ravel_multi_index(idx, [len(a) for a in axes])
    order = np.argsort(flat, kind="stable")
    flat, vals = flat[order], values[order]
    cells, starts = np.unique(flat, return_index=True)
    grid = np.full(int(np.prod([len(a) for a in axes])), np.nan)
    for cell, lo, hi in zip(cells, starts, [*starts[1:], len(flat)]):
        grid[cell] = np.median(vals[lo:hi])
    return axes, grid.reshape([len(a) for a in axes])


def _gemm(cols: dict, path: Path, arrays: dict, meta: dict) -> None:
    for dtype in GEMM_DTYPES:
        mask = cols["gemm_dtype"] == dtype
        if not mask.any():
            continue
        source = _most_rows(cols["kernel_source"], mask)
        mask &= cols["kernel_source"] == source
        (m, n, k), ms = _grid([cols[c][mask].astype(np.int64) for c in ("m", "n", "k")], cols["latency"][mask])
        for name, a in (("m", m), ("n", n), ("k", k)):
            arrays[f"gemm/{dtype}/{name}"] = a.astype(np.int64)
        arrays[f"gemm/{dtype}/ms"] = ms.astype(np.float32)
        meta[f"gemm/{dtype}"] = {"kernel_source": source, "rows": int(mask.sum())}
    if "gemm/bfloat16/ms" not in arrays:
        raise KvsimError(f"{path}: gemm_dtype: no bfloat16 rows")


def _attention(family: str, cols: dict, path: Path, arrays: dict, meta: dict) -> None:
    windows = sorted(int(w) for w in np.unique(cols["window_size"]) if w) if "window_size" in cols else []
    for window in (0, *windows):
        prefix = f"window/{window}/{family}" if window else family
        _attention_rows(prefix, family, cols, window, arrays, meta)
    if f"{family}/bfloat16/ms" not in arrays:
        raise KvsimError(f"{path}: kv_cache_dtype: no bfloat16 rows")


def _attention_rows(prefix: str, family: str, cols: dict, window: int, arrays: dict, meta: dict) -> None:
    """One attention table's grids (per KV dtype) of the rows timed with sliding window `window` (0: none)."""
    last = ("isl", "batch_size") if family == "context" else ("batch_size", "step")
    names = ("isl", "batch") if family == "context" else ("batch", "step")
    for kvd in KV_DTYPES:
        mask = cols["kv_cache_dtype"] == kvd
        if "window_size" in cols:
            mask &= cols["window_size"] == window
        if not mask.any():
            continue
        source = _most_rows(cols["kernel_source"], mask)
        mask &= cols["kernel_source"] == source
        heads = cols["num_heads"][mask].astype(np.int64)
        kv = cols["num_key_value_heads"][mask].astype(np.int64)
        kv = np.where(kv == heads, 0, kv)  # MHA: AIConfigurator's kv_n = 0
        keys = [kv, cols["head_dim"][mask].astype(np.int64), heads] + [cols[c][mask].astype(np.int64) for c in last]
        axes, ms = _grid(keys, cols["latency"][mask])
        for name, a in zip(("kv", "head_dim", "heads", *names), axes):
            arrays[f"{prefix}/{kvd}/{name}"] = a.astype(np.int64)
        arrays[f"{prefix}/{kvd}/ms"] = ms.astype(np.float32)
        meta[f"{prefix}/{kvd}"] = {"kernel_source": source, "rows": int(mask.sum())}


def _allreduce(cols: dict, path: Path, arrays: dict, meta: dict) -> None:
    mask = cols["allreduce_dtype"] == "bfloat16"
    for mode in ("graph", "eager"):
        m = mask & (cols["backend"] == f"vllm_{mode}")
        if not m.any():
            raise KvsimError(f"{path}: backend: no vllm_{mode} rows")
        (gpus, size), ms = _grid([cols["num_gpus"][m].astype(np.int64), cols["message_size"][m].astype(np.int64)],
                                 cols["latency"][m])
        if mode == "graph":
            arrays["allreduce/gpus"], arrays["allreduce/size"] = gpus, size
        elif not (np.array_equal(gpus, arrays["allreduce/gpus"]) and np.array_equal(size, arrays["allreduce/size"])):
            raise KvsimError(f"{path}: message_size: the graph and eager rows time different sizes")
        arrays[f"allreduce/{mode}_ms"] = ms.astype(np.float32)
        meta[f"allreduce/{mode}"] = {"kernel_source": f"vLLM_custom_{mode}", "rows": int(m.sum())}


def _routing(distribution: np.ndarray) -> np.ndarray:
    """AIConfigurator's routing names as codes: balanced 0, power_law_A the exponent A x 100."""
    out = np.zeros(len(distribution), dtype=np.int64)
    for name in np.unique(distribution):
        code = 0 if name in ("balanced", "uniform") else round(100 * float(str(name).rsplit("_", 1)[-1]))
        out[distribution == name] = code
    return out


def _moe(cols: dict, path: Path, arrays: dict, meta: dict) -> None:
    for raw, dtype in MOE_DTYPES.items():
        mask = cols["moe_dtype"] == raw
        if not mask.any():
            continue
        source = _most_rows(cols["kernel_source"], mask)
        mask &= cols["kernel_source"] == source
        keys = [cols[c][mask].astype(np.int64) for c in ("hidden_size", "inter_size", "topk", "num_experts",
                                                         "moe_tp_size", "moe_ep_size")]
        keys.append(_routing(cols["distribution"][mask]))
        configs = np.stack(keys, axis=1)
        unique, row = np.unique(configs, axis=0, return_inverse=True)
        (_, tokens), ms = _grid([row.reshape(-1).astype(np.int64), cols["num_tokens"][mask].astype(np.int64)],
                                cols["latency"][mask])
        arrays[f"moe/{dtype}/config"] = unique.astype(np.int64)
        arrays[f"moe/{dtype}/tokens"] = tokens.astype(np.int64)
        arrays[f"moe/{dtype}/ms"] = ms.astype(np.float32)
        meta[f"moe/{dtype}"] = {"kernel_source": source, "rows": int(mask.sum())}


def _mla(family: str, cols: dict, path: Path, arrays: dict, meta: dict) -> None:
    last = ("isl", "batch_size") if family == "mla_context" else ("batch_size", "step")
    names = ("isl", "batch") if family == "mla_context" else ("batch", "step")
    for kvd in KV_DTYPES:
        for gemm in ("bfloat16", "fp8_block"):
            mask = (cols["kv_cache_dtype"] == kvd) & (cols["gemm_type"] == gemm)
            if not mask.any():
                continue
            timed = set(np.unique(cols["kernel_source"][mask]))
            # vLLM v0.11.0 decodes MLA with FlashMLA on Hopper (block size 64); else the most timed backend
            source = "FLASHMLA" if family == "mla_generation" and "FLASHMLA" in timed else \
                _most_rows(cols["kernel_source"], mask)
            mask &= cols["kernel_source"] == source
            keys = [cols["num_heads"][mask].astype(np.int64)] + [cols[c][mask].astype(np.int64) for c in last]
            axes, ms = _grid(keys, cols["latency"][mask])
            for name, a in zip(("heads", *names), axes):
                arrays[f"{family}/{kvd}/{gemm}/{name}"] = a.astype(np.int64)
            arrays[f"{family}/{kvd}/{gemm}/ms"] = ms.astype(np.float32)
            meta[f"{family}/{kvd}/{gemm}"] = {"kernel_source": source, "rows": int(mask.sum())}


def convert(root, gpu: str, version: str) -> tuple[dict, dict]:
    """(arrays, provenance) of one GPU preset and vLLM release from an AIConfigurator data folder."""
    root = Path(root)
    aic_gpu = AIC_GPUS.get(gpu, gpu)
    arrays: dict = {}
    meta: dict = {"gpu": gpu, "vllm_version": version, "source": {
        "repository": SOURCE_REPO, "commit": SOURCE_COMMIT, "folder": f"{SOURCE_FOLDER}/{aic_gpu}",
        "license": "Apache-2.0, Copyright NVIDIA CORPORATION & AFFILIATES"}, "units": "ms per kernel call",
        "tables": {}}
    for family in (*TABLES, *OPTIONAL):
        try:
            path, timed_on = table_file(root, aic_gpu, family, version)
        except KvsimError:
            if family in OPTIONAL:
                continue
            raise
        windowed = family in ("context", "generation") and _has_column(path, "window_size")
        cols = read_columns(path, COLUMNS[family] + (("window_size",) if windowed else ()))
        tmeta: dict = {}
        if family == "gemm":
            _gemm(cols, path, arrays, tmeta)
        elif family == "allreduce":
            _allreduce(cols, path, arrays, tmeta)
        elif family == "moe":
            _moe(cols, path, arrays, tmeta)
        elif family.startswith("mla"):
            _mla(family, cols, path, arrays, tmeta)
        else:
            _attention(family, cols, path, arrays, tmeta)
        rel = path.relative_to(root).as_posix()
        for key, value in tmeta.items():
            meta["tables"][key] = {**value, "file": f"{SOURCE_FOLDER}/{rel}", "timed_on_vllm": timed_on}
    return arrays, meta


def _has_column(path: Path, column: str) -> bool:
    import pyarrow.parquet as pq

    try:
        return column in pq.read_schema(path).names
    except Exception:
        return False


def write_tables(path, arrays: dict, meta: dict, vetted=UNVETTED) -> None:
    """The kernel-table file written all or nothing: compressed .npz, times rounded to float16 (0.05%,
    half the bytes), provenance as JSON under "meta"; over nothing, or only the file `vetted` (a stamp
    from kvsim.scenario.publish.vet_output when the command started; not given: vetted now)."""
    buffer = io.BytesIO()
    small = {k: v.astype(np.float16) if v.dtype.kind == "f" else v.astype(np.int32) for k, v in arrays.items()}
    np.savez_compressed(buffer, meta=np.array(json.dumps(meta, sort_keys=True)), **small)
    write_bytes_atomic(Path(path), buffer.getvalue(), "kernel tables", vetted=vetted)
