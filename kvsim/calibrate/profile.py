"""`kvsim profile`: step times of the triton engine over a grid of step shapes, written as a CSV.

No simulation: a `ModelRunner` (random weights, the model's real shapes) is driven directly with
synthetic sequences whose block tables point at distinct, shuffled cache blocks. Each shape
(kvsim.calibrate.shapes) is a pure-decode step (batch x context, or a ragged batch of contexts; CUDA
graph as the engine replays it, and eager for a few), a prefill step (chunk x cached context, one or
several sequences) or a mixed step (decodes plus one prefill chunk). A step is timed as
`TritonBackend.execute` times it: host preparation plus device work, synchronized; the CSV row holds
the median of the repeats and the `Batch` aggregates the analytic model prices the same step from.
`kvsim calibrate` reads these files.
"""

from __future__ import annotations

import csv
import gc
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from kvsim.calibrate.shapes import (Shape, anchor_grid, build_step, default_grid, heldout_grid,  # noqa: F401
                                    ragged_heldout_grid, serving_grid)
from kvsim.errors import KvsimError
from kvsim.scenario.publish import UNVETTED, atomic_output

COLUMNS = ("source", "grid", "gpu", "device", "model", "kv_cache_dtype", "tp", "cuda_graph", "phase", "decode_seqs",
           "decode_context", "prefill_seqs", "prefill_chunk", "prefill_cached", "num_prefill_seqs",
           "num_prefill_tokens", "prefill_attn_pairs", "prefill_context_tokens", "num_decode_seqs",
           "decode_context_tokens", "step_s", "step_min_s", "cpu_s", "prepare_s", "spread", "repeats",
           "device_allocs", "graph_batch", "decode_max_context", "max_model_len")
SOURCE = "kvsim-profile"

# GPU presets by the device name torch reports.
_DEVICE_PRESETS = (("H100", "H100-SXM"), ("H200", "H200"), ("A100", "A100-80GB"), ("L40S", "L40S"), ("B200", "B200"))


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
            allocs = _device_allocs(runner.device)
            with runner.eager(shape.eager):
                t = time_step(runner, seqs, counts, sync, 1, repeats, target_s)
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
            "graph_batch": padded, "decode_max_context": batch.decode_max_context,
            "max_model_len": runner.cfg.max_model_len})
    return len(best)


@dataclass(slots=True)
class ProfileOptions:
    grid: str = "fit"  # "fit": the regular grid; "heldout": random shapes off it; "both"; "serving" (see shapes_for)
    full_dtypes: tuple = ("auto",)  # KV dtypes that get the full regular grid (others a cut-down one)
    heldout_per_phase: int = 20  # random shapes per phase for a full-grid dtype (a third of that for others)
    repeats: int = 5
    passes: int = 2
    max_seconds: float = float("inf")
    max_model_len: int = 16384
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9


def shapes_for(opts: ProfileOptions, kv: str, cache_tokens: int) -> list[tuple[str, Shape]]:
    """(grid name, shape) pairs to time for one KV dtype, given the tokens the cache holds. "serving":
    the serving grid and a few regular-grid anchors (fitted) and random ragged decode batches (held out)."""
    full = kv in opts.full_dtypes
    limits = (opts.max_model_len, cache_tokens, opts.max_num_seqs)
    out = []
    if opts.grid in ("fit", "both"):
        out += [("fit", s) for s in default_grid(full, *limits)]
    if opts.grid in ("heldout", "both"):
        n = opts.heldout_per_phase if full else max(1, opts.heldout_per_phase // 3)
        out += [("heldout", s) for s in heldout_grid(sum(map(ord, kv)), n, *limits)]
    if opts.grid == "serving":
        out += [("fit", s) for s in serving_grid(full, *limits) + anchor_grid(full) if s.cache_tokens <= cache_tokens]
        n = opts.heldout_per_phase if full else max(1, opts.heldout_per_phase // 3)
        out += [("heldout", s) for s in ragged_heldout_grid(sum(map(ord, kv)) + 1, n, opts.max_model_len, cache_tokens,
                                                              min(opts.max_num_seqs, 128))]
    return out


def run_profile(models: list[str], kv_dtypes: list[str], out_path, opts: ProfileOptions, gpu: str | None = None,
                device: str = "cuda:0", log=lambda msg: print(msg, file=sys.stderr, flush=True),
                vetted=UNVETTED) -> int:
    """Profile every (model, kv dtype) and write one CSV; returns the number of rows. The CSV is written
    into a hidden temporary and published at the end (kvsim.scenario.publish: over nothing, or only the
    file `vetted` when the command started): on an error nothing is written; when time runs out, the rows
    timed so far are."""
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
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise KvsimError(f"--device: not a torch device: {device!r} ({str(exc).splitlines()[0][:80]})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise KvsimError("kvsim profile needs an NVIDIA GPU: torch.cuda.is_available() is False")
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    gpu = gpu or gpu_preset(device_name)
    with atomic_output(out_path, "the profile", vetted=vetted, mode="w", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        return _profile_all([specs[m.lower()] for m in models], kv_dtypes, opts, dev, gpu, device_name, out, f, log)


def _profile_all(specs, kv_dtypes, opts: ProfileOptions, dev, gpu, device_name, out, f, log) -> int:
    import torch

    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig

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
