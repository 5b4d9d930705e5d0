"""What a CPU offload tier costs the simulator (issue 28: a run with a CPU tier <= 1.3x the same run
without; the optimal bound <= 2x a run), paired in one run: each repeat runs the scenario's GPU-only
policy, its CPU-tier policy without the optimal bound and with it, each in a fresh process
(`python -m kvsim run --policy P`), and reports the CPU seconds (user + system, os.wait4) and the
median of the per-repeat ratios.

    python benchmarks/offload_speed.py [--repeat 3] [--cases multi_turn_offload,mooncake_offload]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"multi_turn_offload": ("gpu-only", "cpu-lru"), "mooncake_offload": ("gpu-prefix-cache", "cpu-offload")}


def cpu_seconds(args: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `python -m kvsim run ARGS` in a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", "run", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"kvsim failed: {proc.stderr.read().decode()[-500:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"cpu: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print("| scenario | GPU-only CPU s | + CPU tier | + CPU tier + optimal bound | tier / GPU-only | bound / tier run |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            base, tier = CASES[name]
            scenario = f"scenarios/{name}.toml"
            common = ["--quiet", "--workers", "1", "--force", "--set", "output.report_html=false"]
            runs = {"base": [], "tier": [], "bound": []}
            for _ in range(args.repeat):
                for key, extra in (("base", ["--policy", base]),
                                   ("tier", ["--policy", tier, "--set", "kv_offload.optimal_bound=false"]),
                                   ("bound", ["--policy", tier])):
                    runs[key].append(cpu_seconds([scenario, *extra, *common, "--out", f"{tmp}/{name}-{key}"])[0])
            med = {k: statistics.median(v) for k, v in runs.items()}
            tier_ratio = statistics.median(t / b for t, b in zip(runs["tier"], runs["base"]))
            bound_ratio = statistics.median(b / t for b, t in zip(runs["bound"], runs["tier"]))
            print(f"| {name} | {med['base']:.2f} | {med['tier']:.2f} | {med['bound']:.2f} | {tier_ratio:.2f}x | "
                  f"{bound_ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
