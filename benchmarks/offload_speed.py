"""What a CPU offload tier costs the simulator (issue 28: a run with a CPU tier <= 1.3x the same run
without; the optimal bound <= 2x a run), paired in one run: each repeat runs the scenario's GPU-only
policy, its CPU-tier policy without the optimal bound and with it, each in a fresh process
(`python -m kvsim run --policy P`), and reports the CPU seconds (user + system, os.wait4) and the
median of the per-repeat ratios.

    python benchmarks/offload_speed.py [--repeat 3] [--cases multi_turn_offload,mooncake_offload,offload_sizing,llmd]

`llmd`: the first `--llmd-seconds` (default 120) of llm-d's tiered-prefix-cache workload
(benchmarks/offload_repro.py: Qwen3-32B, 8 x TP2, 16,256-token prompts, 1,016 offloaded blocks each),
GPU prefix cache alone against + a 200 GiB CPU tier, simulated in this process (no start-up),
alternating, CPU seconds of the simulation only. The tier's run simulates more engine steps (loads
end between steps and cut fused decode runs): both counts are printed.
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
CASES = {"multi_turn_offload": ("gpu-only", "cpu-lru"), "mooncake_offload": ("gpu-prefix-cache", "cpu-offload"),
         "offload_sizing": ("gpu-only", "cpu-tier")}
IN_PROCESS = ("llmd",)


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
    ap.add_argument("--llmd-seconds", type=float, default=120.0)
    args = ap.parse_args()
    print(f"cpu: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print("| scenario | GPU-only CPU s | + CPU tier | + CPU tier + optimal bound | tier / GPU-only | bound / tier run |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            if name in IN_PROCESS:
                llmd(args.repeat, args.llmd_seconds)
                continue
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


def llmd(repeat: int, seconds: float) -> None:
    """The llm-d case in this process: (CPU s, engine steps) per run, alternating without and with the tier."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import offload_repro
    from kvsim.engine.replica import Replica

    requests = [r for r in offload_repro.llmd_requests() if r.arrival_time < seconds]
    steps = [0]
    begin = Replica.begin

    def counted(self, now, next_arrival):
        step = begin(self, now, next_arrival)
        steps[0] += 1
        return step
    Replica.begin = counted
    runs: dict = {"base": [], "tier": []}
    for _ in range(repeat):
        for key, offload in (("base", None), ("tier", {"kv_offloading_size": 200, "host_memory_gib": 400,
                                                        "optimal_bound": False})):
            sc = offload_repro.scenario("Qwen3-32B", 8, 2, offload, 40960, True, "prefix_affinity")
            fresh = [type(r)(r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.token_ids) for r in requests]
            steps[0] = 0
            t0 = time.process_time()
            offload_repro.simulate(sc, fresh)
            runs[key].append((time.process_time() - t0, steps[0]))
    Replica.begin = begin
    base = statistics.median(t for t, _ in runs["base"])
    tier = statistics.median(t for t, _ in runs["tier"])
    ratio = statistics.median(t / b for (t, _), (b, _) in zip(runs["tier"], runs["base"]))
    print(f"| llmd first {seconds:g} s ({len(requests)} requests; engine steps {runs['base'][0][1]:,} / "
          f"{runs['tier'][0][1]:,}) | {base:.2f} | {tier:.2f} | - | {ratio:.2f}x | - |", flush=True)


if __name__ == "__main__":
    main()
