"""Simulation speed by model family: the Azure conversation trace (19,366 requests, policy paged,
max_model_len 8,192) served by a dense model, mixture-of-experts models and sliding-window models,
each simulation alone in a fresh process, the cases run in turn and repeated; medians, and the median
of the per-repeat ratios to the dense model's time, wall and CPU (a shared machine: only paired figures
compare, and CPU time is the less disturbed by other jobs).

    python benchmarks/model_speed.py [--repeat 5]   # writes benchmarks/results/model_speed.md
    python benchmarks/model_speed.py --baseline /tmp/base   # and, paired, a checkout of an earlier commit
                                                             # (git archive COMMIT | tar -x -C /tmp/base)

Targets (issue 18): a MoE scenario simulates as fast as a dense one of the same load (within 1.3x); a
sliding-window one (gpt-oss-20b, gemma-2) within 1.5x. Every case is priced by the roofline
(backend.pricing = "roofline": the measured tables do not price sliding windows, and one pricer for
all isolates the engine), and the MoE pair again with measured kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_speed import Tree, run  # noqa: E402

SIMULATE = """
import json, sys, time
from kvsim.pipeline import run_scenario
from kvsim.scenario.config import load_scenario
sc = load_scenario(sys.argv[1], ["model.name=" + sys.argv[2], "engine.max_model_len=8192",
                                 "backend.pricing=" + sys.argv[3]])
cpu = time.process_time()
r = run_scenario(sc, policies=["paged"], write=False)
cpu = time.process_time() - cpu
s = r.summaries["paged"]
print(json.dumps([r.runs[0].wall_s, cpu, s["engine_events"], s["engine_steps"]]))
"""
CASES = [  # (label, model, pricing, kind)
    ("Llama-3.1-8B", "Llama-3.1-8B", "roofline", "dense"),
    ("Qwen3-30B-A3B", "Qwen3-30B-A3B", "roofline", "MoE"),
    ("gpt-oss-20b", "gpt-oss-20b", "roofline", "sliding window + MoE"),
    ("gemma-2-9b", "gemma-2-9b", "roofline", "sliding window"),
    ("Llama-3.1-8B (measured)", "Llama-3.1-8B", "measured", "dense"),
    ("Qwen3-30B-A3B (measured)", "Qwen3-30B-A3B", "measured", "MoE"),
]


def paired(a: list, b: list) -> float:
    """The median of the per-repeat ratios a / b."""
    return statistics.median(x / y for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="a checkout of an earlier commit, timed in the same repeats")
    args = ap.parse_args()
    trees = {"": Tree(ROOT), **({"base": Tree(args.baseline.resolve())} if args.baseline else {})}
    scenario = str(ROOT / "scenarios" / "azure_conv.toml")
    times: dict = {(t, c[0]): [] for t in trees for c in CASES}
    cpus: dict = {(t, c[0]): [] for t in trees for c in CASES}
    counts: dict = {}
    for r in range(args.repeat):
        order = CASES if r % 2 == 0 else CASES[::-1]
        for label, model, pricing, _ in order:
            for name, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                out = run(tree, ["-c", SIMULATE, scenario, model, pricing])
                wall, cpu, events, steps = json.loads(out["out"])
                times[name, label].append(wall)
                cpus[name, label].append(cpu)
                counts[name, label] = (events, steps)
    head = ("| model | kind | pricing | simulation s (median) | CPU s (median) | engine events / steps "
            "| vs dense, wall (paired median) | vs dense, CPU (paired median) |")
    if args.baseline:
        head += " baseline: vs dense, CPU (paired median) | CPU vs baseline (paired median) |"
    lines = [head, "|" + " --- |" * head.count(" |")]
    for label, model, pricing, kind in CASES:
        base = "Llama-3.1-8B" + (" (measured)" if pricing == "measured" else "")
        events, steps = counts["", label]
        lines.append(f"| {model} | {kind} | {pricing} | {statistics.median(times['', label]):.2f} | "
                     f"{statistics.median(cpus['', label]):.2f} | {events:,} / {steps:,} | "
                     f"{paired(times['', label], times['', base]):.2f}x | {paired(cpus['', label], cpus['', base]):.2f}x |")
        if args.baseline:
            lines[-1] += (f" {paired(cpus['base', label], cpus['base', base]):.2f}x | "
                          f"{paired(cpus['', label], cpus['base', label]):.2f}x |")
        print(lines[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / "model_speed.md"
    how = f"--repeat {args.repeat}" + (" --baseline BASE" if args.baseline else "")
    out.write_text(f"# Simulation speed by model family\n\n`python benchmarks/model_speed.py {how}` "
                   "(see its docstring). A 2-core machine shared with other jobs: the figures vary between runs; "
                   "compare the paired ratios.\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
