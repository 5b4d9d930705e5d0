"""Why serving's eager steps run slower than the profile's: the same mixed step timed four ways.

    python benchmarks/host_shape_probe.py [--model Qwen3-0.6B] [--steps 40]   # needs a GPU

`kvsim profile` times each shape by repeating it back to back. A serving run never repeats a step:
every eager step brings a new token count, and the simulator's Python runs between steps. This
times one mixed step (16 ragged decodes beside a prefill chunk) (a) repeated, as the profile does;
(b) with the chunk one size larger each step (a new shape every time, as in serving); (c) repeated,
with a few milliseconds of unrelated Python between steps (the scheduler's share of the host's
caches); (d) both; (e) chunk sizes never run before (first-time costs: kernel specializations,
GEMM heuristics, allocator blocks). Prints the median step and its ratio to (a), per model.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def busy_python(ms: float) -> None:
    """Unrelated host work, as a scheduler step does: small objects, dicts, a little arithmetic."""
    end = time.perf_counter() + ms / 1e3
    junk = {}
    while time.perf_counter() < end:
        for i in range(200):
            junk[i] = [i, str(i), (i, i + 1)]


def probe(spec_name: str, steps: int, between_ms: float) -> list[tuple]:
    import torch

    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig
    from kvsim.calibrate.shapes import Shape, build_step
    from kvsim.scenario.catalog import MODELS

    runner = ModelRunner(MODELS[spec_name], RunnerConfig(max_num_seqs=128, max_num_batched_tokens=8192,
                                                         max_model_len=8192, device="cuda:0"))
    order = np.random.default_rng(0).permutation(runner.num_blocks)
    contexts = tuple(np.clip(np.round(900 * np.exp(0.8 * np.random.default_rng(3).standard_normal(16))), 16,
                             6000).astype(int).tolist())

    def timed(chunk: int, gap: float) -> float:
        seqs, counts, _ = build_step(Shape.ragged(contexts, chunk), order, runner.block_size)
        if gap:
            busy_python(gap)
        t0 = time.perf_counter()
        runner.execute_model(seqs, counts)
        torch.cuda.synchronize()
        took = time.perf_counter() - t0
        for s in seqs:
            runner.free(s)
        return took

    for chunk in range(300, 300 + steps):  # warm every size (b) and (d) will meet: compile once
        timed(chunk, 0.0)
    rows = []
    for name, vary, gap in (("(a) one shape, back to back", False, 0.0), ("(b) a new chunk size each step", True, 0.0),
                            ("(c) one shape, Python between steps", False, between_ms),
                            ("(d) new sizes, Python between", True, between_ms),
                            ("(e) sizes never run before", None, 0.0)):
        base = 1000 if vary is None else 300
        times = [timed(base + (i if vary is not False else steps // 2), gap) for i in range(steps)]
        rows.append((spec_name, name, statistics.median(times) * 1e3))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--between-ms", type=float, default=3.0)
    args = ap.parse_args()
    import torch

    print("| model | timing | median step ms | vs (a) |\n| --- | --- | ---: | ---: |")
    for model in args.model or ["Qwen3-0.6B", "Llama-3.1-8B"]:
        rows = probe(model, args.steps, args.between_ms)
        gc.collect()  # the model and its cache go before the next one
        torch.cuda.empty_cache()
        for spec, name, ms in rows:
            print(f"| {spec} | {name} | {ms:.2f} | {ms / rows[0][2]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
