"""Every run the fast plan stops early is one the whole run finds unsustainable (issue 27).

    python benchmarks/early_stop_check.py [--requests N] [SCENARIO.toml ...]

For each scenario (default: every shipped one a plan can take on the analytic backend), `kvsim plan`
runs the fast way on one worker; every point it simulates is recorded with its arguments. Each point
that was stopped early is then simulated whole, and its verdict compared: a stopped point must be
unsustainable when run to its end. Points not stopped ran whole with the watch attached, and
tests/test_fast_plan.py checks such a record is the very record of a run without it. `--requests`
caps the requests a point (default: the plan's own, at most 3000). Prints a markdown table: points,
stopped, stopped by which rule, disagreements (must be 0), CPU seconds of the stopped runs against
their whole runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.errors import KvsimError  # noqa: E402
from kvsim.planning.capacity import plan  # noqa: E402
from kvsim.planning.executors import InlineExecutor  # noqa: E402
from kvsim.planning.points import evaluate_point, is_stopped  # noqa: E402
from kvsim.scenario.config import load_scenario  # noqa: E402


class Recording(InlineExecutor):
    """Runs inline and keeps (args, record, CPU seconds) of every evaluate_point."""

    def __init__(self):
        self.calls = []

    def submit(self, fn, *args):
        t0 = time.process_time()
        fut = super().submit(fn, *args)
        if fn is evaluate_point and fut.exception() is None:
            self.calls.append((args, fut.result(), time.process_time() - t0))
        return fut


def check(path: str, requests) -> str:
    sc = load_scenario(path)
    if sc.backend.name != "analytic":
        return f"| {path} | – | – | – | – | – | not analytic |"
    ex = Recording()
    t0 = time.process_time()
    try:
        plan(sc, num_requests=requests, executor=ex)
    except KvsimError as exc:
        return f"| {path} | – | – | – | – | – | {exc} |"
    plan_cpu = time.process_time() - t0
    stopped = [(args, rec, cpu) for args, rec, cpu in ex.calls if is_stopped(rec)]
    rules, wrong, whole_cpu, stop_cpu = Counter(), 0, 0.0, 0.0
    for args, rec, cpu in stopped:
        t1 = time.process_time()
        whole = evaluate_point(*args[:7], False)
        whole_cpu += time.process_time() - t1
        stop_cpu += cpu
        wrong += bool(whole["sustainable"])
        rules["stable" if rec["stable"] is False else rec["binding_detail"].split(" bound")[0].split()[-1]] += 1
    shown = ", ".join(f"{k} {v}" for k, v in rules.most_common()) or "–"
    return (f"| {path} | {len(ex.calls)} | {len(stopped)} | {shown} | {wrong} | "
            f"{stop_cpu:.1f} / {whole_cpu:.1f} | plan {plan_cpu:.0f} CPU s |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int)
    ap.add_argument("scenarios", nargs="*")
    args = ap.parse_args()
    paths = args.scenarios or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").glob("*.toml"))
    print(f"load average before: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}; requests a point: "
          f"{args.requests or 'the plan default'}\n")
    print("| scenario | points | stopped early | by rule | stopped but sustainable whole | CPU s: stopped / whole | |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        print(check(path, args.requests), flush=True)


if __name__ == "__main__":
    main()
