"""Speed of disaggregated serving (issue 19's targets): the whole CLI on the disaggregated Mooncake
scenario (12,031 requests, two policies) within 10 s, and a prefill:decode plan for chat within 60 s
on 2 cores. Each is run several times, interleaved with the aggregated Mooncake scenario (the same
trace on four aggregated replicas, three policies) as a paired reference, since this machine's
speed varies with its load: medians, and the ratio of each pair.

    python benchmarks/disagg_speed.py            # writes benchmarks/results/disagg_speed.md
    python benchmarks/disagg_speed.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "disagg_speed.md"
CASES = {
    "run mooncake_disagg.toml (2 policies, 2P+2D)": ["run", "scenarios/mooncake_disagg.toml", "--quiet"],
    "run mooncake.toml (3 policies, 4 aggregated; reference)": ["run", "scenarios/mooncake.toml", "--quiet"],
    "plan disaggregated.toml --target-rate 28 (2 workers)": ["plan", "scenarios/disaggregated.toml", "--target-rate",
                                                             "28", "--workers", "2", "--quiet"],
    "plan disaggregated.toml --target-rate 28, H100 and H200 per pool (2 workers)": [
        "plan", "scenarios/disaggregated.toml", "--target-rate", "28", "--gpu", "H100-SXM", "--gpu", "H200",
        "--workers", "2", "--quiet"],
}


def timed(args: list[str], out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    extra = ["--out", str(out)]
    subprocess.run([sys.executable, "-m", "kvsim", *args, *extra], cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, cmd in CASES.items():
                results[name].append(timed(cmd, Path(tmp) / f"o{i}-{len(results[name])}-{abs(hash(name))}"))
                print(f"run {i + 1}: {name}: {results[name][-1][0]:.2f} s wall, {results[name][-1][1]:.2f} s CPU",
                      flush=True)
    load = os.getloadavg()[0]
    keys = list(CASES)
    ratios = [d[0] / a[0] for d, a in zip(results[keys[0]], results[keys[1]])]
    lines = ["# Disaggregated serving: speed", "",
             f"`python benchmarks/disagg_speed.py --runs {args.runs}` on this project's 2-core machine (load average "
             f"{load:.1f} when it ended: other jobs shared the cores, so CPU seconds say more than wall seconds).", "",
             "| command | wall s: median (min–max) | CPU s: median | target | met: wall / CPU |",
             "| --- | --- | --- | --- | --- |"]
    targets = {keys[0]: 10.0, keys[1]: None, keys[2]: 60.0, keys[3]: 60.0}
    for name, runs in results.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        wall, cpu, target = statistics.median(walls), statistics.median(cpus), targets[name]
        met = "–" if target is None else f"{'yes' if wall <= target else 'no'} / {'yes' if cpu <= target else 'no'}"
        lines.append(f"| `kvsim {' '.join(CASES[name])}` | {wall:.2f} ({min(walls):.2f}–{max(walls):.2f}) | {cpu:.2f} | "
                     f"{'–' if target is None else f'≤ {target:g} s'} | {met} |")
    cpu_ratios = [d[1] / a[1] for d, a in zip(results[keys[0]], results[keys[1]])]
    lines += ["", f"Disaggregated Mooncake / aggregated Mooncake, wall time of each pair: median {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}); the aggregated scenario runs three policies on four replicas, "
                  "the disaggregated two on four instances; CPU time of each pair: median "
                  f"{statistics.median(cpu_ratios):.2f}.", ""]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
