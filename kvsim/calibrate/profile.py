"""`kvsim profile`: step times of the triton engine over a grid of step shapes, written as a CSV.

No simulation: a `ModelRunner` (random weights, the model's real shapes) is driven directly with
synthetic sequences whose block tables point at distinct, shuffled cache blocks. Each shape is a
pure-decode step (batch x context; CUDA graph as the engine replays it, and eager for a few), a
prefill step (chunk x cached context, one or several sequences) or a mixed step (decodes plus one
prefill chunk). A step is timed as `TritonBackend.execute` times it: host preparation plus device
work, synchronized; the CSV row holds the median of the repeats and the `Batch` aggregates the
analytic model prices the same step from. `kvsim calibrate` reads these files.
"""

from __future__ import annotations

import csv
import gc
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.batch import Batch
from kvsim.errors import KvsimError
from kvsim.sequence import Request, Sequence

COLUMNS = ("source", "grid", "gpu", "device", "model", "kv_cache_dtype", "tp", "cuda_graph", "phase", "decode_seqs",
           "decode_context", "prefill_seqs", "prefill_chunk", "prefill_cached", "num_prefill_seqs",
           "num_prefill_tokens", "prefill_attn_pairs", "prefill_context_tokens", "num_decode_seqs",
           "decode_context_tokens", "step_s", "step_min_s", "cpu_s", "prepare_s", "spread", "repeats",
           "device_allocs", "graph_batch")
SOURCE = "kvsim-profile"

# GPU presets by the device name torch reports.
_DEVICE_PRESETS = (("H100", "H100-SXM"), ("H200", "H200"), ("A100", "A100-80GB"), ("L40S", "L40S"), ("B200", "B200"))


@dataclass(slots=True, frozen=True)
class Shape:
    """One step: `decode_seqs` decodes holding `decode_context` tokens each (the new one included), and
    `prefill_seqs` chunks of `prefill_chunk` new tokens after `prefill_cached` cached ones each."""

    phase: str
    decode_seqs: int = 0
    decode_context: int = 0
    prefill_seqs: int = 0
    prefill_chunk: int = 0
    prefill_cached: int = 0
    eager: bool = False  # a pure decode step run without its CUDA graph

    @property
    def cache_tokens(self) -> int:
        return self.decode_seqs * self.decode_context + self.prefill_seqs * (self.prefill_cached + self.prefill_chunk)

    @property
    def max_len(self) -> int:
        return max(self.decode_context, self.prefill_cached + self.prefill_chunk)


def default_grid(full: bool = True, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                 max_num_seqs: int = 256) -> list[Shape]:
    """The shapes `kvsim profile` times: enough of each phase to fit the step model's terms and to
    hold some out. `full=False` is the cut-down grid used for the quantized caches."""
    batches = (1, 2, 4, 8, 16, 32, 64, 128, 256) if full else (1, 4, 16, 64, 256)
    contexts = (128, 512, 1024, 2048, 4096, 8192, 16384) if full else (512, 2048, 8192)
    chunks = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if full else (64, 512, 2048, 8192)
    cached = (0, 1024, 4096, 12288) if full else (0, 4096)
    shapes = [Shape("decode", b, c) for b in batches for c in contexts]
    shapes += [Shape("decode", b, 1024, eager=True) for b in ((1, 8, 64, 256) if full else (8, 64))]
    shapes += [Shape("prefill", prefill_seqs=1, prefill_chunk=n, prefill_cached=c) for n in chunks for c in cached]
    shapes += [Shape("prefill", prefill_seqs=s, prefill_chunk=n) for s, n in ((4, 512), (8, 256), (16, 128), (4, 2048))
               if full or s == 4]
    for d in ((4, 16, 64, 128, 256) if full else (4, 64)):
        for c in ((512, 2048) if full else (2048,)):
            for n in ((128, 512, 2048) if full else (512, 2048)):
                for pc in (0, 2048):
                    shapes.append(Shape("mixed", d, c, 1, n, pc))
    return [s for s in shapes if s.max_len <= max_model_len and s.cache_tokens <= max_cache_tokens
            and s.decode_seqs <= max_num_seqs and s.prefill_seqs * s.prefill_chunk <= 8192]


def build_step(shape: Shape, blocks: np.ndarray, block_size: int) -> tuple[list[Sequence], list[int], Batch]:
    """Sequences for `shape` whose block tables take consecutive ids of `blocks`, their new-token
    counts, and the Batch the scheduler would have built (decodes first, as the runner packs them)."""
    seqs, counts, batch, next_block = [], [], Batch(), 0
    rows = [(shape.decode_context - 1, 1)] * shape.decode_seqs
    rows += [(shape.prefill_cached, shape.prefill_chunk)] * shape.prefill_seqs
    for i, (computed, new) in enumerate(rows):
        total = computed + new
        need = -(-total // block_size)
        if next_block + need > len(blocks):
            raise KvsimError(f"profile shape {shape} needs more than the {len(blocks)} cache blocks")
        prompt = computed if new == 1 else total  # a decode's prompt is done; a chunk ends its prompt
        seq = Sequence(Request(i, 0.0, prompt, 1 << 20))
        seq.block_table = blocks[next_block:next_block + need].tolist()
        next_block += need
        seq.num_computed_tokens, seq.num_tokens = computed, total
        seq.num_output_tokens = total - prompt
        seqs.append(seq)
        counts.append(new)
        batch.add(seq, new)
    return seqs, counts, batch


def time_step(runner, seqs, counts, sync, warmup: int, repeats: int, target_s: float) -> dict:
    """Median and least seconds of `runner.execute_model` plus a synchronize, over at least `repeats`
    runs (more for quick steps, up to `target_s` of timing), with the median host CPU seconds of a step
    and of its input preparation."""
    for _ in range(warmup):
        t0 = time.perf_counter()
        runner.execute_model(seqs, counts)
        sync()
    if time.perf_counter() - t0 > 0.05:  # a long step (GPU-bound, steady): fewer repeats
        repeats = min(repeats, 3)
    times, cpu = [], []
    while len(times) < repeats or (sum(times) < target_s and len(times) < 4 * repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        runner.execute_model(seqs, counts)
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    prep = []
    for _ in range(3):
        t0 = time.perf_counter()
        runner.prepare(seqs, counts)
        prep.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "step_min_s": min(times), "cpu_s": statistics.median(cpu),
            "prepare_s": statistics.median(prep), "repeats": len(times)}


def heldout_grid(seed: int, per_phase: int, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                 max_num_seqs: int = 256) -> list[Shape]:
    """Random shapes off the regular grid (log-uniform batches, contexts and chunks), to test a fit on."""
    rng = np.random.default_rng(seed)

    def logu(lo, hi):
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))

    shapes: list[Shape] = []
    while len(shapes) < 3 * per_phase:
        kind = ("decode", "prefill", "mixed")[len(shapes) % 3]
        cached = 0 if rng.random() < 0.4 else logu(64, 12288)
        if kind == "decode":
            shape = Shape("decode", logu(1, max_num_seqs), logu(64, max_model_len))
        elif kind == "prefill":
            seqs = 1 if rng.random() < 0.75 else logu(2, 8)
            shape = Shape("prefill", prefill_seqs=seqs, prefill_chunk=logu(16, 8192 // seqs), prefill_cached=cached)
        else:
            shape = Shape("mixed", logu(1, 128), logu(64, 8192), 1, logu(16, 4096), cached)
        if shape.max_len <= max_model_len and shape.cache_tokens <= max_cache_tokens:
            shapes.append(shape)
    return shapes


def _combine(passes: list[dict]) -> dict:
    """One shape's passes as one row: the least of the passes' medians (the host of a shared machine has
    slow spells of seconds that would otherwise decide the figure), the least time, summed counts."""
    med = [t["step_s"] for t in passes]
    return {"step_s": min(med), "step_min_s": min(t["step_min_s"] for t in passes),
            "cpu_s": statistics.median(t["cpu_s"] for t in passes),
            "prepare_s": statistics.median(t["prepare_s"] for t in passes), "spread": max(med) / min(med),
            "repeats": sum(t["repeats"] for t in passes), "device_allocs": sum(t["device_allocs"] for t in passes)}


def _device_allocs(device) -> int:
    """cudaMalloc calls plus allocator retries so far (a step that makes any is not in steady state)."""
    if device.type != "cuda":
        return 0
    import torch

    stats = torch.cuda.memory_stats(device)
    return stats.get("num_device_alloc", 0) + stats.get("num_alloc_retries", 0)


def gpu_preset(device_name: str) -> str:
    for key, preset in _DEVICE_PRESETS:
        if key in device_name:
            return preset
    raise KvsimError(f"--gpu: no GPU preset matches the device '{device_name}': name one with --gpu")


def profile_runner(runner, spec_name: str, kv_cache_dtype: str, shapes, gpu: str, device_name: str, out,
                   repeats: int = 5, target_s: float = 0.2, passes: int = 2, deadline: float = float("inf"),
                   grid: str = "fit", log=None) -> int:
    """Time `shapes` on `runner` in `passes` passes, each in a new random order (a slow spell of the host
    then hits different shapes each time), and write a CSV row per shape to `out` (a csv.DictWriter):
    `step_s` is the least of the passes' medians, `spread` the largest over the least. Returns the rows."""
    import torch

    cuda = runner.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(runner.device)) if cuda else (lambda: None)
    order = np.random.default_rng(0).permutation(runner.num_blocks)
    rng = np.random.default_rng(1)
    timed: dict[int, list[dict]] = {}
    for p in range(passes):
        for i in (rng.permutation(len(shapes)) if p else range(len(shapes))):
            if time.monotonic() > deadline:
                break
            shape = shapes[i]
            seqs, counts, _ = build_step(shape, order, runner.block_size)
            graphs = runner._graphs
            if shape.eager:
                runner._graphs = {}
            allocs = _device_allocs(runner.device)
            try:
                t = time_step(runner, seqs, counts, sync, 1, repeats, target_s)
            finally:
                runner._graphs = graphs
            t["device_allocs"] = _device_allocs(runner.device) - allocs
            for seq in seqs:
                runner.free(seq)
            timed.setdefault(int(i), []).append(t)
    best = {i: _combine(ts) for i, ts in timed.items()}
    if len(best) < len(shapes) and log:
        log(f"kvsim profile: time is up, {len(shapes) - len(best)} {spec_name} shapes left out")
    for i in sorted(best):
        shape, t = shapes[i], best[i]
        _, _, batch = build_step(shape, order, runner.block_size)
        graph = shape.phase == "decode" and not shape.eager and bool(runner.graph_sizes) and \
            shape.decode_seqs <= max(runner.graph_sizes)
        padded = next((b for b in runner.graph_sizes if b >= shape.decode_seqs), 0) if graph else 0
        out.writerow({
            "source": SOURCE, "grid": grid, "gpu": gpu, "device": device_name, "model": spec_name,
            "kv_cache_dtype": kv_cache_dtype, "tp": 1, "cuda_graph": int(graph), "phase": shape.phase,
            "decode_seqs": shape.decode_seqs, "decode_context": shape.decode_context,
            "prefill_seqs": shape.prefill_seqs, "prefill_chunk": shape.prefill_chunk,
            "prefill_cached": shape.prefill_cached, "num_prefill_seqs": batch.num_prefill_seqs,
            "num_prefill_tokens": batch.num_prefill_tokens, "prefill_attn_pairs": batch.prefill_attn_pairs,
            "prefill_context_tokens": batch.prefill_context_tokens, "num_decode_seqs": batch.num_decode_seqs,
            "decode_context_tokens": batch.decode_context_tokens, "step_s": f"{t['step_s']:.7g}",
            "step_min_s": f"{t['step_min_s']:.7g}", "cpu_s": f"{t['cpu_s']:.7g}", "prepare_s": f"{t['prepare_s']:.7g}",
            "spread": f"{t['spread']:.4g}", "repeats": t["repeats"], "device_allocs": t["device_allocs"],
            "graph_batch": padded})
    return len(best)


@dataclass(slots=True)
class ProfileOptions:
    grid: str = "fit"  # "fit": the regular grid; "heldout": random shapes off it; "both"
    full_dtypes: tuple = ("auto",)  # KV dtypes that get the full regular grid (others a cut-down one)
    heldout_per_phase: int = 20  # random shapes per phase for a full-grid dtype (a third of that for others)
    repeats: int = 5
    passes: int = 2
    max_seconds: float = float("inf")
    max_model_len: int = 16384
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9


def shapes_for(opts: ProfileOptions, kv: str, cache_tokens: int) -> list[tuple[str, Shape]]:
    """(grid name, shape) pairs to time for one KV dtype, given the tokens the cache holds."""
    full = kv in opts.full_dtypes
    out = []
    if opts.grid in ("fit", "both"):
        out += [("fit", s) for s in default_grid(full, opts.max_model_len, cache_tokens, opts.max_num_seqs)]
    if opts.grid in ("heldout", "both"):
        n = opts.heldout_per_phase if full else max(1, opts.heldout_per_phase // 3)
        out += [("heldout", s) for s in heldout_grid(sum(map(ord, kv)), n, opts.max_model_len,
                                                       cache_tokens, opts.max_num_seqs)]
    return out


def run_profile(models: list[str], kv_dtypes: list[str], out_path, opts: ProfileOptions, gpu: str | None = None,
                device: str = "cuda:0", log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> int:
    """Profile every (model, kv dtype) and write one CSV; returns the number of rows. On an error the
    CSV is removed (nothing half-written); when time runs out, the rows timed so far are kept."""
    from kvsim.scenario.catalog import MODELS

    specs = {k.lower(): v for k, v in MODELS.items()}
    unknown = [m for m in models if m.lower() not in specs]
    if unknown:
        raise KvsimError(f"--model: unknown model {', '.join(unknown)} (presets: {', '.join(MODELS)})")
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        raise KvsimError(f"kvsim profile needs torch and triton: {exc} (pip install kvsim[gpu])") from None
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise KvsimError("kvsim profile needs an NVIDIA GPU: torch.cuda.is_available() is False")
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    gpu = gpu or gpu_preset(device_name)
    try:
        with open(out_path, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=COLUMNS)
            out.writeheader()
            return _profile_all([specs[m.lower()] for m in models], kv_dtypes, opts, dev, gpu, device_name, out, f,
                                log)
    except BaseException:
        Path(out_path).unlink(missing_ok=True)  # ours: nothing half-written stays behind
        raise


def _profile_all(specs, kv_dtypes, opts: ProfileOptions, dev, gpu, device_name, out, f, log) -> int:
    import torch

    from backends.triton_engine.runner import ModelRunner, RunnerConfig

    deadline = time.monotonic() + opts.max_seconds
    rows = 0
    for kv in kv_dtypes:
        for spec in specs:
            if time.monotonic() > deadline:
                log(f"kvsim profile: time is up before {spec.name} kv={kv}")
                continue
            t0 = time.monotonic()
            cfg = RunnerConfig(max_num_seqs=opts.max_num_seqs, max_num_batched_tokens=8192,
                               max_model_len=opts.max_model_len + 1024, kv_cache_dtype=kv,
                               gpu_memory_utilization=opts.gpu_memory_utilization, device=str(dev))
            runner = ModelRunner(spec, cfg)
            todo = shapes_for(opts, kv, int(runner.num_blocks * runner.block_size * 0.95))
            log(f"kvsim profile: {spec.name} kv={kv}: {runner.num_blocks} blocks, {len(todo)} shapes, "
                f"set up in {time.monotonic() - t0:.1f} s")
            for grid in ("fit", "heldout"):
                shapes = [s for g, s in todo if g == grid]
                if shapes:
                    rows += profile_runner(runner, spec.name, kv, shapes, gpu, device_name, out, opts.repeats,
                                           passes=opts.passes, deadline=deadline, grid=grid, log=log)
                    f.flush()
            log(f"kvsim profile: {spec.name} kv={kv}: done in {time.monotonic() - t0:.1f} s")
            del runner
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows
