"""Measurements the step-time model is fitted to, read from the tables that hold them.

Each reader turns a file into `Observation`s: one measured time and what the model needs to price the
same work. Three table formats are recognized by their CSV header:

- `kvsim profile` CSVs: whole engine steps (the `Batch` aggregates of each step shape);
- Vidur operator profiles (`compute/<gpu>/<model>/mlp.csv`): per-layer GEMM time (qkv, o, gate_up and
  down projections summed) and small-kernel time (norms, RoPE, activation, residual add), in ms, by
  num_tokens and tensor-parallel size; the model's shape comes from the same row;
- Vidur collective profiles (`network/<gpu>_*/all_reduce.csv`): one all-reduce, in ms, by message size
  (bytes) and number of workers.

`vllm bench serve --save-result` JSONs become observations through `serving_observations`, with a
scenario that describes the server and workload they measured (fitted by simulating it).
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kvsim.errors import KvsimError
from kvsim.scenario.files import parse_json, read_text
from kvsim.scenario.catalog import GPUS, MODELS, ModelSpec
from kvsim.scenario.limits import MAX_MS

BATCH_FIELDS = ("num_prefill_seqs", "num_prefill_tokens", "prefill_attn_pairs", "prefill_context_tokens",
                "num_decode_seqs", "decode_context_tokens", "decode_max_context", "decode_shared_tokens")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SMALL_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
MAX_CELL = 2.0**53  # any number in a table (times, token counts, bytes): finite, and exact as an integer
MAX_THROUGHPUT = 1e9  # tokens per second in a serving result (a thousand times any real deployment)
# How far a vllm bench serve result's workload may be from the scenario's and still measure it. The
# count and the rate are configured numbers on both sides (vllm rescales its arrival gaps to the rate
# it was given), so they must agree but for rounding and for a duration-cut scenario's Poisson count
# (sd 1/sqrt(n): 3% at 1,000). Mean lengths are sampled separately on each side: a lognormal length of
# sigma 0.8 has a mean 4% noisy at 500 requests, and vllm's random prompts re-tokenize a few tokens
# off, so 10% is 2-3 sigma; a mean 10% off moves step time and so TTFT/TPOT by about the 10% that
# validation is meant to resolve.
WORKLOAD_TOLERANCE = {"requests": 0.05, "mean input tokens": 0.10, "mean output tokens": 0.10, "request rate": 0.02}
_PATH_GPUS = {"h100": "H100-SXM", "a100": "A100-80GB", "h200": "H200"}
# vllm bench serve figures (ms unless named) and where kvsim's summary holds the same figure.
SERVING_FIGURES = {
    "median_ttft_ms": ("ttft_s", "p50"), "p99_ttft_ms": ("ttft_s", "p99"), "mean_ttft_ms": ("ttft_s", "mean"),
    "median_tpot_ms": ("tpot_s", "p50"), "mean_tpot_ms": ("tpot_s", "mean"), "p99_tpot_ms": ("tpot_s", "p99"),
    "median_itl_ms": ("itl_s", "p50"), "mean_itl_ms": ("itl_s", "mean"), "p99_itl_ms": ("itl_s", "p99"),
    "median_e2el_ms": ("e2e_s", "p50"), "mean_e2el_ms": ("e2e_s", "mean"), "p99_e2el_ms": ("e2e_s", "p99"),
    "output_throughput": ("throughput", "output_tokens_per_s"),
}


@dataclass(slots=True, frozen=True)
class Observation:
    """One measured time. `counts` is what the model prices: a step's Batch aggregates (BATCH_FIELDS),
    (num_tokens,) for a layer's GEMMs or small kernels, (message bytes,) for an all-reduce."""

    kind: str  # step, gemm, elementwise, allreduce, serving
    measured: float  # seconds (serving: the figure in kvsim's units)
    gpu: str
    source: str  # file:line
    model: Optional[ModelSpec] = None
    tp: int = 1
    kv_cache_dtype: str = "auto"
    graph_batch: int = 0  # steps: the CUDA graph's (padded) batch size, 0 when eager
    counts: tuple = ()
    phase: str = ""  # slice label: decode, prefill, mixed, gemm, elementwise, allreduce, serving
    band: str = ""  # slice label: a batch-size band
    grid: str = "fit"  # "heldout": a shape kept out of the fit, to test it on
    group: str = ""  # observations of one group share a hold-out fold
    serving: Optional[tuple] = None  # (scenario path, policy, summary key path)
    max_model_len: int = 0  # steps: the engine's, which caps its decode kernel's splits (0: not recorded)
    table: str = ""  # the file it was read from (a fit may give each table its own host coefficients)


def token_band(tokens: int) -> str:
    return "1-16" if tokens <= 16 else "17-128" if tokens <= 128 else "129-1024" if tokens <= 1024 else ">1024"


def _float(value: str, where: str, column: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise KvsimError(f"{where}: {column}: not a number: {value!r}") from None
    if not x == x or x < 0:
        raise KvsimError(f"{where}: {column}: must be a non-negative number, got {value!r}")
    if x > MAX_CELL:
        raise KvsimError(f"{where}: {column}: must be at most {MAX_CELL:.0e}, got {value!r}")
    return x


def _time(ms_or_s: float, where: str, column: str) -> float:
    """A measured time: positive (a zero time has no relative error, and no kernel takes none)."""
    if not ms_or_s > 0:
        raise KvsimError(f"{where}: {column}: a measured time must be positive, got {ms_or_s:g}")
    return ms_or_s


def _int(value: str, where: str, column: str, low: int = 0) -> int:
    x = _float(value, where, column)
    if x != int(x) or x < low:
        raise KvsimError(f"{where}: {column}: must be a whole number{' >= %d' % low if low else ''}, got {value!r}")
    return int(x)


def _rows(path: Path, need: tuple) -> tuple[list[str], list[tuple[int, dict]]]:
    """The header and (line number, row) pairs of a CSV whose header holds every column in `need`."""
    lines = read_text(path, "table").splitlines()
    reader = csv.DictReader(lines)
    try:
        header = reader.fieldnames or []
        missing = [c for c in need if c not in header]
        if missing:
            raise KvsimError(f"{path}: missing column {missing[0]}")
        rows = [(i + 2, row) for i, row in enumerate(reader)]
    except csv.Error as exc:
        raise KvsimError(f"{path}:{reader.line_num}: bad CSV: {exc}") from None
    for line, row in rows:
        if None in row or None in row.values():  # more or fewer cells than the header names
            raise KvsimError(f"{path}:{line}: {'more' if None in row else 'fewer'} cells than the header's "
                             f"{len(header)} columns")
    return header, rows


def table_kind(path: Path) -> str:
    """"profile", "vidur-mlp" or "vidur-allreduce", from the CSV header."""
    first = read_text(path, "table").partition("\n")[0]
    header = next(csv.reader([first]), [])
    if "source" in header and "step_s" in header:
        return "profile"
    if "time_stats.attn_pre_proj.median" in header:
        return "vidur-mlp"
    if "time_stats.all_reduce.median" in header:
        return "vidur-allreduce"
    raise KvsimError(f"{path}: not a kvsim profile, Vidur mlp.csv or Vidur all_reduce.csv table "
                     f"(header starts {first[:60]!r})")


def gpu_from_path(path: Path, gpu: Optional[str]) -> str:
    if gpu:
        return gpu
    for part in reversed(Path(path).parts):
        for key, preset in _PATH_GPUS.items():
            if part.lower() == key or part.lower().startswith(key + "_"):
                return preset
    raise KvsimError(f"{path}: cannot tell the GPU from the path: give --gpu")


def graph_batch_of(row: dict, where: str) -> int:
    if "graph_batch" in row and row["graph_batch"] not in ("", None):
        return _int(row["graph_batch"], where, "graph_batch")
    if _int(row["cuda_graph"], where, "cuda_graph"):
        from kvsim.perf.roofline import VLLM_GRAPH_SIZES
        n = _int(row["num_decode_seqs"], where, "num_decode_seqs")
        return next(b for b in VLLM_GRAPH_SIZES if b >= n)
    return 0


def _longest_decode(row: dict, where: str) -> int:
    """The longest decode context: its own column, else `decode_context` (a profile's per-sequence
    context, a step log's longest; tables written before the column)."""
    for column in ("decode_max_context", "decode_context"):
        if row.get(column) not in ("", None):
            return _int(row[column], where, column)
    return 0


def read_profile(path: Path) -> list[Observation]:
    need = ("source", "gpu", "model", "kv_cache_dtype", "tp", "cuda_graph", "phase", "step_s") + BATCH_FIELDS[:-2]
    _, rows = _rows(path, need)
    models = {k.lower(): v for k, v in MODELS.items()}
    out = []
    for line, row in rows:
        where = f"{path}:{line}"
        model = models.get(row["model"].lower())
        if model is None:
            raise KvsimError(f"{where}: model: unknown model '{row['model']}' (presets: {', '.join(MODELS)})")
        if row["gpu"] not in GPUS:
            raise KvsimError(f"{where}: gpu: unknown GPU preset '{row['gpu']}' (presets: {', '.join(GPUS)})")
        counts = tuple(_int(row[c], where, c) for c in BATCH_FIELDS[:-2])
        counts += (_longest_decode(row, where) if counts[4] else 0,
                   _int(row.get("decode_shared_tokens") or 0, where, "decode_shared_tokens"))
        tokens = counts[1] + counts[4]
        phase = row["phase"]
        if phase not in ("decode", "prefill", "mixed"):
            raise KvsimError(f"{where}: phase: must be decode, prefill or mixed, got {phase!r}")
        out.append(Observation(
            "step", _time(_float(row["step_s"], where, "step_s"), where, "step_s"), row["gpu"], where, model,
            _int(row["tp"], where, "tp", low=1), row["kv_cache_dtype"], graph_batch_of(row, where), counts, phase,
            token_band(tokens), row.get("grid") or "fit",
            max_model_len=_int(row.get("max_model_len") or 0, where, "max_model_len"), table=str(path)))
    return out


def _vidur_model(row: dict, where: str, name: str) -> ModelSpec:
    heads = _int(row["n_head"], where, "n_head", low=1)
    hidden = _int(row["n_embd"], where, "n_embd", low=heads)
    return ModelSpec(name=name, num_hidden_layers=1, hidden_size=hidden, num_attention_heads=heads,
                     num_key_value_heads=_int(row["n_kv_head"], where, "n_kv_head", low=1), head_dim=hidden // heads,
                     intermediate_size=_int(row["n_expanded_embd"], where, "n_expanded_embd", low=1),
                     vocab_size=_int(row["vocab_size"], where, "vocab_size", low=1), max_position_embeddings=4096)


def read_vidur_mlp(path: Path, gpu: Optional[str] = None) -> list[Observation]:
    """Per-layer GEMM and small-kernel observations; models without a gated MLP are skipped (kvsim's
    model shapes are SwiGLU)."""
    gpu = gpu_from_path(path, gpu)
    need = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
            "num_tensor_parallel_workers")
    header, rows = _rows(path, need)
    rows = [(line, row) for line, row in rows if row["use_gated_mlp"].strip().lower() == "true"]
    if not rows:
        return []
    ops = [f"time_stats.{op}.median" for op in GEMM_OPS + SMALL_OPS]
    missing = [c for c in ops if c not in header]
    if missing:
        raise KvsimError(f"{path}: missing column {missing[0]}")
    name = f"vidur:{Path(path).parent.name}"
    out = []
    for line, row in rows:
        where = f"{path}:{line}"
        model = _vidur_model(row, where, name)
        tokens = _int(row["num_tokens"], where, "num_tokens", low=1)
        tp = _int(row["num_tensor_parallel_workers"], where, "num_tensor_parallel_workers", low=1)
        for kind, group in (("gemm", GEMM_OPS), ("elementwise", SMALL_OPS)):
            ms = _time(sum(_float(row[f"time_stats.{op}.median"], where, f"time_stats.{op}.median") for op in group),
                       where, f"time_stats.{group[0]}.median ... {group[-1]} (summed)")
            out.append(Observation(kind, ms / 1e3, gpu, where, model, tp, counts=(tokens,), phase=kind,
                                   band=token_band(tokens), group=f"{name}:{tokens}:{tp}", table=str(path)))
    return out


def read_vidur_allreduce(path: Path, gpu: Optional[str] = None) -> list[Observation]:
    """All-reduce observations within one node (rows spanning more GPUs than `devices_per_node` are
    skipped: kvsim's tensor parallelism runs over one node's NVLink)."""
    gpu = gpu_from_path(path, gpu)
    header, rows = _rows(path, ("time_stats.all_reduce.median", "num_workers", "size"))
    out = []
    for line, row in rows:
        where = f"{path}:{line}"
        size = _int(row["size"], where, "size", low=1)
        workers = _int(row["num_workers"], where, "num_workers", low=1)
        if "devices_per_node" in header and workers > _int(row["devices_per_node"], where, "devices_per_node"):
            continue
        ms = _time(_float(row["time_stats.all_reduce.median"], where, "time_stats.all_reduce.median"), where,
                   "time_stats.all_reduce.median")
        band = "<64KiB" if size < 1 << 16 else "<1MiB" if size < 1 << 20 else "<16MiB" if size < 1 << 24 else ">=16MiB"
        out.append(Observation("allreduce", ms / 1e3, gpu, where, tp=workers, counts=(size,), phase="allreduce",
                               band=band, group=f"{path}:{size}:{workers}", table=str(path)))
    return out


def merge_repeats(observations: list[Observation], across_tables: bool = True) -> list[Observation]:
    """Step observations of the same shape (in several profile files, unless not across_tables) as one,
    at the median time."""
    groups: dict[tuple, list[Observation]] = {}
    for o in observations:
        key = (o.kind, o.gpu, o.model, o.tp, o.kv_cache_dtype, o.graph_batch, o.max_model_len, o.counts, o.grid,
               "" if across_tables else o.table) if o.kind == "step" else (id(o),)
        groups.setdefault(key, []).append(o)
    out = []
    for obs in groups.values():
        first = obs[0]
        if len(obs) == 1:
            out.append(first)
        else:
            med = statistics.median(o.measured for o in obs)
            out.append(Observation(first.kind, med, first.gpu, f"{first.source} (+{len(obs) - 1} more)", first.model,
                                   first.tp, first.kv_cache_dtype, first.graph_batch, first.counts, first.phase,
                                   first.band, first.grid, first.group, max_model_len=first.max_model_len,
                                   table=first.table))
    return out


def read_tables(paths, gpu: Optional[str] = None, across_tables: bool = True) -> list[Observation]:
    """Every table's observations, repeated step shapes merged (across tables too, unless told not)."""
    out: list[Observation] = []
    for path in map(Path, paths):
        kind = table_kind(path)
        if kind == "profile":
            out += read_profile(path)
        elif kind == "vidur-mlp":
            out += read_vidur_mlp(path, gpu)
        else:
            out += read_vidur_allreduce(path, gpu)
    return merge_repeats(out, across_tables)


@dataclass(slots=True)
class BenchResult:
    """The figures of a `vllm bench serve --save-result` JSON, in kvsim's units (seconds, tok/s)."""

    path: Path
    figures: dict[str, float] = field(default_factory=dict)
    num_prompts: Optional[int] = None
    request_rate: Optional[float] = None  # inf: every request sent at once
    completed: Optional[int] = None
    total_input_tokens: Optional[int] = None
    total_output_tokens: Optional[int] = None
    max_concurrency: Optional[int] = None  # --max-concurrency (None: no limit)
    stated_concurrency: bool = False  # the JSON says max_concurrency (vLLM releases since late 2024 do)


def read_bench_result(path: Path) -> BenchResult:
    return bench_result(parse_json(read_text(path, "vllm bench serve result"), str(path)), path)


def bench_result(data, path: Path) -> BenchResult:
    """A `vllm bench serve --save-result` document (parsed JSON) read from `path`: its figures within
    bounds (times at most MAX_MS, throughput at most MAX_THROUGHPUT) and its workload description."""
    if not isinstance(data, dict) or "completed" not in data or "output_throughput" not in data:
        raise KvsimError(f"{path}: not a `vllm bench serve --save-result` JSON (no completed / output_throughput)")
    res = BenchResult(Path(path))
    for key in SERVING_FIGURES:
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            high = MAX_MS if key.endswith("_ms") else MAX_THROUGHPUT
            if value < 0:
                raise KvsimError(f"{path}: {key}: must be a non-negative number, got {value}")
            if value > high:
                raise KvsimError(f"{path}: {key}: must be at most {high:g}, got {value}")
            res.figures[key] = value / 1e3 if key.endswith("_ms") else float(value)
    res.num_prompts = _count(data, "num_prompts", path)
    res.completed = _count(data, "completed", path)
    for key in ("total_input_tokens", "total_output_tokens", "max_concurrency"):
        setattr(res, key, _count(data, key, path))
    res.stated_concurrency = "max_concurrency" in data
    rate = data.get("request_rate")
    if rate == "inf" or (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0):
        res.request_rate = float(rate)
    elif rate is not None:
        raise KvsimError(f"{path}: request_rate: must be a positive number or \"inf\", got {rate!r}")
    return res


def _count(data: dict, key: str, path) -> Optional[int]:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CELL:
        raise KvsimError(f"{path}: {key}: must be a whole number >= 0, got {value!r}")
    return value


def check_bench_workload(bench: BenchResult, scenario) -> None:
    """One line unless the benchmark ran the scenario's workload: its request count, mean input and output
    tokens a request and request rate, each within the tolerance WORKLOAD_TOLERANCE gives it (a
    benchmark of another workload is not a measurement of this scenario, however close its figures),
    and its --max-concurrency (`workload.max_concurrency`; `--request-rate inf` is arrival `immediate`)."""
    from kvsim.scenario.workload import generate_requests

    n = prompt = output = 0
    first = last = 0.0
    for r in generate_requests(scenario, max_model_len=1):  # 1: no trace row is expanded into tokens
        first, last = (r.arrival_time, r.arrival_time) if n == 0 else (first, r.arrival_time)
        n, prompt, output = n + 1, prompt + r.prompt_len, output + r.output_len
    arrival = scenario.workload.arrival
    rate = (math.inf if arrival.process == "immediate" else arrival.rate if arrival.process != "trace"
            else ((n - 1) / (last - first) if last > first else None))
    done = bench.completed or 0
    theirs = {"requests": bench.num_prompts if bench.num_prompts is not None else bench.completed,
              "mean input tokens": bench.total_input_tokens / done if done and bench.total_input_tokens else None,
              "mean output tokens": bench.total_output_tokens / done if done and bench.total_output_tokens else None,
              "request rate": bench.request_rate}
    ours = {"requests": n, "mean input tokens": prompt / n if n else None,
            "mean output tokens": output / n if n else None, "request rate": rate}
    off = []
    for what, tolerance in WORKLOAD_TOLERANCE.items():
        a, b = theirs[what], ours[what]
        if a is None or b is None or (math.isinf(a) and math.isinf(b)):
            continue
        if math.isinf(a) or math.isinf(b) or abs(a - b) > tolerance * b:
            off.append(f"{what} {_show(a)} vs {_show(b)} (±{tolerance:.0%})")
    if bench.stated_concurrency and bench.max_concurrency != scenario.workload.max_concurrency:
        off.append(f"max concurrency {bench.max_concurrency} vs {scenario.workload.max_concurrency}")
    if off:
        raise KvsimError(f"{bench.path}: the benchmark ran another workload than {scenario.source}: "
                         + "; ".join(off) + " (benchmark vs scenario): validate it against the scenario it ran")


def _show(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def serving_observations(scenario_path: Path, result_path: Path, policy: Optional[str] = None) -> list[Observation]:
    """One observation per figure of a vllm bench serve result; the scenario (its first policy unless
    named) describes the server and the workload the benchmark ran."""
    from kvsim.scenario.config import load_scenario

    scenario = load_scenario(scenario_path)
    bench = read_bench_result(result_path)
    check_bench_workload(bench, scenario)
    names = [p.name for p in scenario.policies]
    policy = policy or names[0]
    if policy not in names:
        raise KvsimError(f"{scenario_path}: no policy named {policy}")
    group = f"serving:{result_path}"
    return [Observation("serving", value, scenario.hardware.gpu, f"{result_path}:{key}",
                        tp=scenario.hardware.tensor_parallel_size, phase="serving", band=key, group=group,
                        serving=(str(scenario_path), policy, SERVING_FIGURES[key]), table=str(result_path))
            for key, value in bench.figures.items() if value > 0]
