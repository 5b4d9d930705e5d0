"""Eager (host-bound) steps timed as `kvsim profile` times them and as serving meets them (GPU).

    python benchmarks/host_bound_steps.py [--rounds 15]

`kvsim profile` repeats one shape back to back and keeps the least of its passes' medians; a serving
run never repeats a step. Here a few eager shapes of Llama-3.1-8B (small prefill chunks beside
ragged decodes, as chunked-prefill serving makes them) are timed both ways on one engine: `block`
(profile.time_step, two passes, least median and median of all), and `interleaved` (rounds visiting
every shape once in a new random order each round; median per shape). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shapes():
    from kvsim.calibrate.shapes import Shape, lognormal_contexts

    rng = np.random.default_rng(3)
    out = [Shape.ragged(lognormal_contexts(rng, d, 700, 0.7, 4096), chunk) for d, chunk in
           ((6, 32), (6, 128), (16, 128), (6, 512), (16, 1024))]
    return out + [Shape("prefill", prefill_seqs=1, prefill_chunk=128), Shape("mixed", 4, 512, 1, 128, 0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--model", default="Llama-3.1-8B")
    args = ap.parse_args()
    import torch

    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig
    from kvsim.calibrate.profile import build_step, time_step
    from kvsim.scenario.catalog import MODELS

    runner = ModelRunner(MODELS[args.model], RunnerConfig(max_num_seqs=128, max_model_len=4096))
    sync = lambda: torch.cuda.synchronize(runner.device)  # noqa: E731
    order = np.random.default_rng(0).permutation(runner.num_blocks)
    built = [build_step(s, order, runner.block_size)[:2] for s in shapes()]
    block = [[time_step(runner, seqs, counts, sync, 1, 5, 0.2)["step_s"] for seqs, counts in built] for _ in range(2)]
    rng, inter = np.random.default_rng(1), [[] for _ in built]
    for _ in range(args.rounds):
        for i in rng.permutation(len(built)):
            seqs, counts = built[i]
            t0 = time.perf_counter()
            runner.execute_model(seqs, counts)
            sync()
            inter[i].append(time.perf_counter() - t0)
    print(f"# Eager steps, back to back vs interleaved: {args.model}, {torch.cuda.get_device_name()}\n")
    print("| shape | block: least pass median ms | block: pass medians ms | interleaved: median ms | "
          "interleaved p10-p90 ms | interleaved / block least |")
    print("| --- | ---: | --- | ---: | --- | ---: |")
    for s, b0, b1, times in zip(shapes(), *block, inter):
        name = f"{s.decode_seqs} decodes (longest {s.decode_context}) + chunk {s.prefill_chunk}"
        med = statistics.median(times)
        p10, p90 = np.percentile(times, [10, 90])
        print(f"| {name} | {min(b0, b1) * 1e3:.2f} | {b0 * 1e3:.2f}, {b1 * 1e3:.2f} | {med * 1e3:.2f} | "
              f"{p10 * 1e3:.2f}-{p90 * 1e3:.2f} | {med / min(b0, b1):.3f} |")


if __name__ == "__main__":
    main()
