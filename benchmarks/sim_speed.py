"""Simulator speed benchmark: Azure trace replay and a million synthetic requests.

    python benchmarks/sim_speed.py            # Azure trace (sim + whole CLI), Mooncake CLI, 1,000,000 requests
    python benchmarks/sim_speed.py --requests 100000 --skip-mooncake
    python benchmarks/sim_speed.py --pricing measured,roofline   # each run priced both ways, interleaved

Prints a markdown table: wall seconds (median of --repeat runs where cheap), peak RSS of the CLI
process, engine events and the engine steps they stand for. Targets (issue 2): Azure simulation
<= 1.0 s and whole CLI run <= 3 s with one policy; 1M requests <= 60 s and <= 1 GB RSS. Issue 10:
scenarios/mooncake.toml (3 policies, 4 replicas, prefix caching) <= 5 s whole CLI and <= 500 MB RSS.
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
sys.path.insert(0, str(ROOT))

SYNTHETIC = """
name = "million"
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100-SXM"
[engine]
max_model_len = 8192
[[policies]]
name = "paged"
[workload]
seed = 7
num_requests = {n}
arrival = {{ process = "poisson", rate = 25.0 }}
prompt_len = {{ dist = "lognormal", mean = 600, sigma = 0.8, max = 6000 }}
output_len = {{ dist = "lognormal", mean = 150, sigma = 0.8, max = 1500 }}
prefix = {{ num_groups = 16, prefix_len = 256, fraction = 0.5 }}
[output]
timeseries_interval_s = 10.0
"""


def run_cli(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `python -m kvsim ...` process; its CPU seconds (user +
    system, which the machine's other load does not inflate as much) go to CPU_SECONDS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"kvsim failed ({proc.returncode}): {proc.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_SECONDS.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    rss = after.ru_maxrss / 1024  # the largest child so far
    return wall, rss


CPU_SECONDS: list[float] = []


def azure(repeat: int, pricings: list[str]) -> list[tuple]:
    """The Azure trace under each pricing, runs interleaved (this machine's speed drifts)."""
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario

    base = load_scenario(ROOT / "scenarios/azure_conv.toml")
    sims, clis, cpus, events, n = {p: [] for p in pricings}, {p: [] for p in pricings}, {p: [] for p in pricings}, {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for p in pricings:
                sc = base.model_copy(update={"backend": base.backend.model_copy(update={"pricing": p})})
                r = run_scenario(sc, policies=["paged"], write=False)
                sims[p].append(r.runs[0].wall_s)
                extra = r.summaries["paged"]
                events[p] = (extra["engine_events"], extra["engine_steps"])
                n = extra["requests"]["received"]
                clis[p].append(run_cli(["scenarios/azure_conv.toml", "--policy", "paged", "--quiet", "--out", tmp,
                                        "--set", f"backend.pricing={p}"])[0])
                cpus[p].append(CPU_SECONDS[-1])
    rows = []
    for p in pricings:
        rows.append((f"azure_conv, paged, {p}: simulation", n, statistics.median(sims[p]), "", *events[p], "<= 1.0 s"))
        rows.append((f"azure_conv, paged, {p}: whole CLI run", n, statistics.median(clis[p]), "", *events[p],
                     "<= 1.6 s (issue 17)", statistics.median(cpus[p])))
    return rows


def mooncake() -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        wall, rss = run_cli(["scenarios/mooncake.toml", "--quiet", "--out", str(Path(tmp) / "out")])
        import json
        s = json.loads((Path(tmp) / "out" / "summary.json").read_text())["policies"]
    p = s["paged-prefix-cache"]
    return [("mooncake, 3 policies: whole CLI run", p["requests"]["received"], wall, f"{rss:,.0f}",
             sum(x["engine_events"] for x in s.values()), sum(x["engine_steps"] for x in s.values()),
             "<= 5 s, <= 500 MiB")]


def synthetic(n: int, pricing: str) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.toml"
        path.write_text(SYNTHETIC.format(n=n))
        wall, rss = run_cli([str(path), "--quiet", "--out", str(Path(tmp) / "out"), "--set", f"backend.pricing={pricing}"])
        import json
        s = json.loads((Path(tmp) / "out" / "summary.json").read_text())["policies"]["paged"]
    return [(f"{n:,} synthetic requests, {pricing}: whole CLI run", n, wall, f"{rss:,.0f}", s["engine_events"],
             s["engine_steps"], "<= 60 s, <= 1024 MiB", CPU_SECONDS[-1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-azure", action="store_true")
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--pricing", default="measured,roofline",
                    help="comma-separated backend.pricing values to time (Azure and synthetic runs)")
    args = ap.parse_args()
    pricings = [p.strip() for p in args.pricing.split(",") if p.strip()]
    rows = [] if args.skip_azure else azure(args.repeat, pricings)
    rows += [] if args.skip_mooncake else mooncake()
    for p in pricings:
        rows += synthetic(args.requests, p)
    print(f"cpu: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print("| run | requests | wall s (median) | CPU s (median) | peak RSS MiB | engine events | engine steps | target |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, n, wall, rss, ev, steps, target, *cpu in rows:
        print(f"| {name} | {n:,} | {wall:.2f} | {f'{cpu[0]:.2f}' if cpu else ''} | {rss} | {ev:,} | {steps:,} | {target} |")


if __name__ == "__main__":
    main()
