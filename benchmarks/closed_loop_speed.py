"""Closed-loop speed: the chat load sent by clients (`vllm bench serve --max-concurrency`) against the
same requests arriving open loop, each pair simulated back to back in fresh processes.

    python benchmarks/closed_loop_speed.py                    # every row, 5 repeats
    python benchmarks/closed_loop_speed.py --repeat 7 --only chat
    python benchmarks/closed_loop_speed.py --write            # also benchmarks/results/closed_loop_speed.md

Rows (issue 20, item 8):
- chat: scenarios/chat.toml (5 policies, one H100, 3,000 requests) as it is, Poisson 14 req/s, against
  the same requests from 64 clients in a closed loop (arrival immediate, max_concurrency 64: about
  the same throughput). Target: the closed loop within 1.3x of the open loop.
- chat-3-replicas: the same on three replicas (least loaded). A fused decode run on one replica
  stops where another replica's step in progress ends (the closed loop's next request may go to it),
  so a closed loop on several replicas costs more events: reported, no target.
- multi_turn: scenarios/multi_turn.toml (3 policies, 2 replicas, 128 users in sessions), alone.

Each figure is the simulation alone (`run_scenario` without writing, in a fresh `python` per run:
its wall seconds and engine events); the table gives medians and the median of the per-repeat
ratios (closed / open), the repeats alternating which runs first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOSED = ["workload.arrival={ process = \"immediate\" }", "workload.max_concurrency=64"]
THREE = ["hardware.num_replicas=3"]
CLOSED_36 = ["workload.arrival={ process = \"immediate\" }", "workload.max_concurrency=36"]  # about the open loop's 14 req/s on 3 replicas
ROWS = {  # name -> (scenario, open-loop overrides, closed-loop overrides or None)
    "chat": ("scenarios/chat.toml", [], CLOSED),
    "chat-3-replicas": ("scenarios/chat.toml", THREE, THREE + CLOSED_36),
    "multi_turn": ("scenarios/multi_turn.toml", None, []),
}

SIMULATE = """
import json, sys, time
from kvsim.pipeline import run_scenario
from kvsim.scenario.config import load_scenario
sc = load_scenario(sys.argv[1], json.loads(sys.argv[2]))
t, c = time.perf_counter(), time.process_time()
r = run_scenario(sc, write=False)
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c, "events": sum(x.events for x in r.runs),
                  "rps": {k: s["throughput"]["requests_per_s"] for k, s in r.summaries.items()}}))
"""


def simulate(scenario: str, overrides: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", SIMULATE, scenario, json.dumps(overrides)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def row(name: str, repeat: int) -> dict:
    scenario, open_set, closed_set = ROWS[name]
    runs = {"open": [], "closed": []}
    for i in range(repeat):
        order = [("open", open_set), ("closed", closed_set)]
        for kind, sets in (order if i % 2 == 0 else order[::-1]):
            if sets is not None:
                runs[kind].append(simulate(scenario, sets))
        print(f"  {name} repeat {i + 1}: " + ", ".join(f"{k} {v[-1]['wall']:.2f} s" for k, v in runs.items() if v),
              file=sys.stderr)
    out = {"name": name}
    for kind, rs in runs.items():
        if rs:
            out[kind] = {"wall": statistics.median(r["wall"] for r in rs), "cpu": statistics.median(r["cpu"] for r in rs),
                         "events": rs[0]["events"], "rps": rs[0]["rps"]}
    if runs["open"] and runs["closed"]:
        out["ratio"] = statistics.median(c["wall"] / o["wall"] for o, c in zip(runs["open"], runs["closed"]))
        out["cpu_ratio"] = statistics.median(c["cpu"] / o["cpu"] for o, c in zip(runs["open"], runs["closed"]))
    return out


def table(rows: list[dict], repeat: int) -> str:
    lines = [f"Simulation alone, fresh process per run, medians of {repeat}: wall seconds, CPU seconds (the "
             "process's own, less sensitive to other jobs on the machine) and the median of the per-repeat "
             "closed / open ratios.", "",
             "| row | open loop: wall s, CPU s (events) | closed loop: wall s, CPU s (events) | closed / open: wall, CPU "
             "| req/s open → closed (first policy) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        o, c = r.get("open"), r.get("closed")
        first = next(iter((c or o)["rps"]))
        lines.append(
            f"| {r['name']} | " + (f"{o['wall']:.2f}, {o['cpu']:.2f} ({o['events']:,})" if o else "–") + " | "
            + (f"{c['wall']:.2f}, {c['cpu']:.2f} ({c['events']:,})" if c else "–") + " | "
            + (f"{r['ratio']:.2f}x, {r['cpu_ratio']:.2f}x" if "ratio" in r else "–") + " | "
            + (f"{o['rps'][first]:.1f} → " if o else "") + f"{c['rps'][first]:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default=",".join(ROWS), help="comma-separated row names")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/closed_loop_speed.md")
    args = ap.parse_args()
    rows = [row(name, args.repeat) for name in args.only.split(",")]
    text = table(rows, args.repeat)
    print(text)
    if args.write:
        (ROOT / "benchmarks/results/closed_loop_speed.md").write_text(
            "# Closed-loop speed (`python benchmarks/closed_loop_speed.py --write`)\n\n" + text + "\n")


if __name__ == "__main__":
    main()
