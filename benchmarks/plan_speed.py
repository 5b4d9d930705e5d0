"""Capacity-planning speed: `kvsim plan` on chat.toml, a Llama-3.1-70B deployment search, executors
compared (same bytes, and how much faster), and how the per-point request count moves the knee.

    python benchmarks/plan_speed.py                       # all sections, every local core
    python benchmarks/plan_speed.py --workers 1,2 --ray   # also a local Ray instance
    python benchmarks/plan_speed.py --only plan --workers 1,16

Prints markdown tables. Targets (issue 11): chat plan (5 policies, 3 seeds, ±2%) <= 60 s on 2
cores; 70B deployment search over 6 GPUs x TP {1,2,4,8} x replicas <= 180 s on 2 cores; plan.csv
and sweep.csv byte-identical from 1 worker, N workers and Ray.

    python benchmarks/plan_speed.py --only fast --workers 2 [--case chat,70b,pd,moe]

Issue 27: each case run the default (fast) way and with `exhaustive=True` on this commit, paired in
one process (fast first, then exhaustive, on a fresh pool of --workers each), with wall and CPU
seconds, the load average before each run, the points simulated, and whether the answers agree
(kvsim.planning.agree: safe rates within 1%, binding constraints, the deployment chosen). Targets:
chat plan <= 10 s, the 70B deployment search at 20 req/s <= 30 s, the P:D search of
scenarios/disaggregated.toml <= 10 s, plan on moe.toml <= 20 s (wall, 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.planning.capacity import plan  # noqa: E402
from kvsim.planning.deploy import deploy  # noqa: E402
from kvsim.planning.executors import InlineExecutor, PoolExecutor, RayExecutor  # noqa: E402
from kvsim.planning.output import csv_text  # noqa: E402
from kvsim.scenario.config import load_scenario  # noqa: E402

CHAT = ROOT / "scenarios" / "chat.toml"
SEVENTY_B = ["model.name=Llama-3.1-70B"]


def executor(kind: str):
    if kind == "ray":
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        return RayExecutor()
    workers = int(kind)
    return InlineExecutor() if workers == 1 else PoolExecutor(workers)


def close(ex, kind: str) -> None:
    ex.close()
    if kind == "ray":
        import ray

        ray.shutdown()


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (pool workers; not Ray's)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def plan_rows(kinds: list[str]) -> list[str]:
    sc = load_scenario(CHAT)
    rows = []
    for kind in kinds:
        ex = executor(kind)
        t0, c0, before = time.perf_counter(), cpu_s(), load()
        result = plan(sc, seeds=3, resolution=0.02, executor=ex)
        wall = time.perf_counter() - t0
        close(ex, kind)
        cpu = "–" if kind == "ray" else f"{cpu_s() - c0:.1f}"
        text = csv_text([p.row() for p in result.policies]) + csv_text(result.points)
        best = max(result.policies, key=lambda p: p.safe_rate)
        rows.append(f"| chat plan, 5 policies × 3 seeds, ±2% | {kind} | {wall:.1f} | {cpu} | {before} | {len(result.points)} | "
                    f"{digest(text)} | {best.policy} {best.safe_rate:.2f} req/s |")
    return rows


def deploy_rows(kinds: list[str], target: float) -> list[str]:
    sc = load_scenario(CHAT, SEVENTY_B)
    rows = []
    for kind in kinds:
        ex = executor(kind)
        t0, c0, before = time.perf_counter(), cpu_s(), load()
        result = deploy(sc, target, policy="paged", seeds=3, executor=ex)
        wall = time.perf_counter() - t0
        close(ex, kind)
        cpu = "–" if kind == "ray" else f"{cpu_s() - c0:.1f}"
        text = csv_text([d.row() for d in result.deployments]) + csv_text(result.points)
        best = result.deployments[0]
        rows.append(f"| 70B at {target:g} req/s: 6 GPUs × TP 1,2,4,8 × replicas | {kind} | {wall:.1f} | {cpu} | {before} | "
                    f"{len(result.points)} | {digest(text)} | {best.label} ${best.usd_per_hour:.2f}/h |")
    return rows


class TimedInline(InlineExecutor):
    """Runs tasks inline and records each one's CPU seconds with its chain: (policy, seed) while
    searching, one chain per task after (the checks at the max rate, which wait for every search)."""

    def __init__(self):
        self.tasks = []  # (phase, chain, cpu seconds)

    def submit(self, fn, *args):
        t0 = time.process_time()
        fut = super().submit(fn, *args)
        self.tasks.append((args[1], args[3], time.process_time() - t0))
        return fut


def makespan(tasks, workers: int) -> float:
    """Wall time of the plan's task graph on `workers` cores, from measured task costs: each
    (policy, seed) search is a chain (a rate depends on the last one's answer) run greedily as
    workers free up; the checks at the max rate (the last task of each chain) start once every
    search is done and are list-scheduled too."""
    import heapq

    chains: dict = {}
    for policy, seed, cost in tasks:
        chains.setdefault((policy, seed), []).append(cost)
    searches = [c[:-1] for c in chains.values()]
    checks = sorted((c[-1] for c in chains.values()), reverse=True)
    free = [0.0] * workers  # when each worker is next free
    ready = [(0.0, i, 0) for i in range(len(searches))]  # (ready at, chain, position)
    heapq.heapify(ready)
    end = 0.0
    while ready:
        at, i, pos = heapq.heappop(ready)
        w = min(range(workers), key=lambda k: free[k])
        start = max(at, free[w])
        free[w] = start + searches[i][pos]
        end = max(end, free[w])
        if pos + 1 < len(searches[i]):
            heapq.heappush(ready, (free[w], i, pos + 1))
    free = [end] * workers
    for cost in checks:
        w = min(range(workers), key=lambda k: free[k])
        free[w] += cost
    return max(free)


def scaling_rows(cores: list[int]) -> list[str]:
    sc = load_scenario(CHAT)
    ex = TimedInline()
    plan(sc, seeds=3, resolution=0.02, executor=ex)
    total = sum(t[2] for t in ex.tasks)
    return [f"| {w} | {makespan(ex.tasks, w):.1f} | {total / makespan(ex.tasks, w):.1f}× |" for w in cores]


def requests_rows(counts: list[int], kind: str) -> list[str]:
    sc = load_scenario(CHAT)
    rows = []
    for n in counts:
        ex = executor(kind)
        t0 = time.perf_counter()
        result = plan(sc, policies=["contiguous", "paged", "paged-fp8"], seeds=3, num_requests=n, executor=ex)
        wall = time.perf_counter() - t0
        close(ex, kind)
        cells = " | ".join(f"{p.safe_rate:.2f} ({p.mean_rate:.2f}, {p.ci_low:.2f}–{p.ci_high:.2f})" for p in result.policies)
        rows.append(f"| {n} | {cells} | {wall:.1f} |")
    return rows


FAST_CASES = {
    "chat": ("`plan scenarios/chat.toml`", lambda ex, exh: plan(load_scenario(CHAT), executor=ex, exhaustive=exh)),
    "70b": ("70B at 20 req/s, every GPU preset × TP 1,2,4,8 (policy paged)",
            lambda ex, exh: deploy(load_scenario(CHAT, SEVENTY_B), 20.0, policy="paged", executor=ex, exhaustive=exh)),
    "pd": ("P:D search, `plan scenarios/disaggregated.toml --target-rate 28`",
           lambda ex, exh: _pd(ex, exh)),
    "moe": ("`plan scenarios/moe.toml`",
            lambda ex, exh: plan(load_scenario(ROOT / "scenarios" / "moe.toml"), executor=ex, exhaustive=exh)),
}


def _pd(ex, exhaustive: bool):
    from kvsim.planning.disagg import pd_deploy

    return pd_deploy(load_scenario(ROOT / "scenarios" / "disaggregated.toml"), 28.0, executor=ex, exhaustive=exhaustive)


def _answer(result) -> str:
    if hasattr(result, "policies"):
        return "; ".join(f"{p.policy} {p.safe_rate:.4g} ({p.binding})" for p in result.policies)
    if hasattr(result, "aggregated"):
        d = result.best
        agg = result.aggregated.deployments[0] if result.aggregated.deployments else None
        return (f"P:D {d.label if d else '–'} ${d.usd_per_hour if d else 0:.2f}/h; aggregated "
                f"{agg.label if agg else '–'}")
    d = result.deployments[0]
    return f"{d.label} ${d.usd_per_hour:.2f}/h, safe {d.safe_rate:.4g} ({d.binding})"


def _points(result) -> int:
    return len(result.points) + (len(result.aggregated.points) if hasattr(result, "aggregated") else 0)


def fast_rows(cases: list[str], workers: int) -> list[str]:
    from kvsim.planning.agree import differences

    rows = []
    for case in cases:
        label, run = FAST_CASES[case]
        got, times = {}, {}
        for exhaustive in (False, True):
            ex = executor(str(workers))
            t0, c0, before = time.perf_counter(), cpu_s(), load()
            got[exhaustive] = run(ex, exhaustive)
            wall = time.perf_counter() - t0
            close(ex, str(workers))
            times[exhaustive] = (wall, cpu_s() - c0, before)
        diff = differences(got[False], got[True])
        (fw, fc, fl), (ew, ec, el) = times[False], times[True]
        rows.append(f"| {label} | {fw:.1f} | {fc:.1f} | {fl} | {_points(got[False])} | {ew:.1f} | {ec:.1f} | {el} | "
                    f"{_points(got[True])} | {ew / fw:.2f}× | {'same' if not diff else '; '.join(diff)} | "
                    f"{_answer(got[False])} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default=str(os.cpu_count()), help="comma-separated worker counts")
    ap.add_argument("--ray", action="store_true", help="also on a local Ray instance (all cores)")
    ap.add_argument("--only", choices=("plan", "deploy", "requests", "scaling", "fast"))
    ap.add_argument("--case", default="chat,70b,pd,moe", help="with --only fast: the cases, comma-separated")
    ap.add_argument("--target", type=float, default=20.0)
    args = ap.parse_args()
    kinds = args.workers.split(",") + (["ray"] if args.ray else [])
    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    if args.only == "fast":
        print("| case | fast wall s | fast CPU s | load before | fast points | exhaustive wall s | exhaustive CPU s | "
              "load before | exhaustive points | speed-up (wall) | answers | answer (fast) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        fast_rows(args.case.split(","), int(args.workers.split(",")[0]))
        return
    if args.only in (None, "plan", "deploy"):
        print("| run | executor | wall s | CPU s | load avg before | points | sha256 of plan.csv + points.csv | answer |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        if args.only in (None, "plan"):
            print("\n".join(plan_rows(kinds)), flush=True)
        if args.only in (None, "deploy"):
            print("\n".join(deploy_rows(kinds, args.target)), flush=True)
    if args.only in (None, "scaling"):
        print("\n| cores | chat plan wall s (task graph replayed with measured CPU s per point) | speed-up |")
        print("| --- | --- | --- |")
        print("\n".join(scaling_rows([1, 2, 4, 8, 16, 32])), flush=True)
    if args.only in (None, "requests"):
        print("\n| requests a point | contiguous max req/s (95% CI) | paged | paged-fp8 | wall s |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(requests_rows([1000, 2000, 3000, 4000, 6000], kinds[-1] if kinds[-1] != "ray" else "2")))


if __name__ == "__main__":
    main()
