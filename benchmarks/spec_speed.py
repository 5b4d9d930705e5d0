"""What speculative decoding costs the simulator: a run with it against the same run without, paired.

    python benchmarks/spec_speed.py                 # 5 pairs a scenario
    python benchmarks/spec_speed.py --repeat 9

Each scenario is simulated twice per pair, with [speculative] (EAGLE-3, k = 3) and without, back to
back in alternating order, each in a fresh process (`python -m kvsim run ... --quiet`, its results
written): the whole command's CPU seconds (os.wait4: user + system) and wall seconds, and the CPU seconds of
`run_scenario` alone (the simulation and its results folder, without the interpreter's start-up). The table gives
medians and the median of the per-pair ratios (with / without). Target (issue 30): a run with
speculation costs at most 1.5x the same run without. Results: benchmarks/results/spec_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = """
name = "{name}"
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100-SXM"
[engine]
max_model_len = 8192
[[policies]]
name = "paged"
[workload]
seed = 5
num_requests = {n}
{arrival}
prompt_len = {{ dist = "lognormal", mean = 600, sigma = 0.8, max = 6000 }}
output_len = {{ dist = "lognormal", mean = {out}, sigma = 0.8, max = 2000 }}
[output]
report_html = false
"""
SPEC = '\n[speculative]\nmethod = "eagle3"\nnum_speculative_tokens = 3\n'
SCENARIOS = {
    "chat, Poisson 8 req/s, 3,000 requests": dict(n=3000, out=250, arrival='arrival = { process = "poisson", rate = 8.0 }'),
    "busy, Poisson 25 req/s, 3,000 requests": dict(n=3000, out=150, arrival='arrival = { process = "poisson", rate = 25.0 }'),
    "closed loop, 64 clients, 2,000 requests": dict(n=2000, out=300, arrival='max_concurrency = 64\narrival = { process = "immediate" }'),
    "light, Poisson 1 req/s, 600 requests, long replies": dict(n=600, out=800, arrival='arrival = { process = "poisson", rate = 1.0 }'),
}

RUNNER = """
import json, sys, time
from kvsim.pipeline import run_scenario
from kvsim.scenario.config import load_scenario
sc = load_scenario(sys.argv[1])
t0 = time.process_time()
r = run_scenario(sc, out_dir=sys.argv[2], force=True)
print(json.dumps({"sim_s": time.process_time() - t0, "events": sum(p.events for p in r.runs)}))
"""


def timed(path: Path, out: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(path), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout = proc.stdout.read()
    if status != 0:
        raise SystemExit(f"{path}: {proc.stderr.read()}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, **json.loads(stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for label, kw in SCENARIOS.items():
            plain = tmp / "plain.toml"
            spec = tmp / "spec.toml"
            plain.write_text(BASE.format(name="plain", **kw))
            spec.write_text(BASE.format(name="spec", **kw) + SPEC)
            pairs = []
            for i in range(args.repeat):
                order = [(spec, "s"), (plain, "p")] if i % 2 == 0 else [(plain, "p"), (spec, "s")]
                got = {tag: timed(path, tmp / f"out-{tag}") for path, tag in order}
                pairs.append(got)
                print(label, i, {t: {k: round(v, 3) for k, v in g.items()} for t, g in got.items()}, flush=True)
            med = lambda key, tag: statistics.median(p[tag][key] for p in pairs)  # noqa: E731
            ratio = lambda key: statistics.median(p["s"][key] / p["p"][key] for p in pairs)  # noqa: E731
            rows.append({"scenario": label, "pairs": args.repeat, "events_plain": pairs[0]["p"]["events"],
                         "events_spec": pairs[0]["s"]["events"],
                         **{f"{key}_{tag}": med(key, t) for key in ("cpu", "wall", "sim_s") for tag, t in (("plain", "p"), ("spec", "s"))},
                         **{f"ratio_{key}": ratio(key) for key in ("cpu", "wall", "sim_s")}})
    out = ROOT / "benchmarks" / "results"
    (out / "spec_speed.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| scenario | engine events without / with | whole run CPU s without / with | ratio | wall ratio | "
             "simulation s without / with | ratio |", "|" + " --- |" * 7]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['events_plain']:,} / {r['events_spec']:,} | {r['cpu_plain']:.2f} / "
                     f"{r['cpu_spec']:.2f} | {r['ratio_cpu']:.2f} | {r['ratio_wall']:.2f} | {r['sim_s_plain']:.2f} / "
                     f"{r['sim_s_spec']:.2f} | {r['ratio_sim_s']:.2f} |")
    (out / "spec_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
