"""What speculative decoding costs the simulator: a run with it against the same run without, paired.

    python benchmarks/spec_speed.py                 # 5 pairs a scenario
    python benchmarks/spec_speed.py --repeat 9

Each scenario is simulated twice per pair, with [speculative] (EAGLE-3, k = 3) and without, back to
back in alternating order, each in a fresh process (`python -m kvsim run ... --quiet`, its results
written): the whole command's CPU seconds (os.wait4: user + system) and wall seconds, and the CPU seconds of
`run_scenario` alone (the simulation and its results folder, without the interpreter's start-up). The table gives
medians and the median of the per-pair ratios (with / without). Target (issue 30): a run with
speculation costs at most 1.5x the same run without. Results: benchmarks/results/spec_speed.md.

Where the simulation's time goes (benchmarks/results/spec_speed_profile.md), sampled with py-spy (not a
kvsim dependency: `pip install py-spy`) around the in-process loop of one case:

    py-spy record -r 250 -f raw -o spec.txt -- python benchmarks/spec_speed.py --loop spec --case chat --runs 10
    py-spy record -r 250 -f raw -o plain.txt -- python benchmarks/spec_speed.py --loop plain --case chat --runs 20
    python benchmarks/spec_speed.py --breakdown spec.txt plain.txt --runs 10 20
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


# py-spy frames (function names as it prints them) -> the part of a run they belong to, first match wins
PARTS = (
    ("a joining member's acceptance draws, every output position (Speculator.draws)", ("Speculator.draws",)),
    ("its steps added into the cohort's per-step sums and their prefix sums (Timeline.add)", ("Timeline.add",)),
    ("its blocks after each step (SpecCohort._held)", ("SpecCohort._held",)),
    ("the rest of its future: the walk over its positions, its step columns, their running sums "
     "(SpecCohort.join)", ("SpecCohort.join",)),
    ("a run's length and price (decode_run_within)",
     ("SpeculativePricer.decode_run_within", "MeasuredStepModel.decode_run_within")),
    ("a fused run's figures step by step (RunSeries.plan)", ("RunSeries.plan",)),
    ("a single step's price (step_time)", ("SpeculativePricer.step_time", "MeasuredStepModel.step_time")),
    ("scheduling, the rest (Replica.begin)", ("Replica.begin",)),
    ("completing steps, the rest (Replica.complete: postprocess, frees, metrics)", ("Replica.complete",)),
    ("the rest (event loop, arrivals, summary)", ("run_scenario",)),
)


def scenario_file(case: str, tag: str, tmp: Path) -> Path:
    label = next(k for k in SCENARIOS if k.startswith(case))
    path = tmp / f"{tag}.toml"
    path.write_text(BASE.format(name=tag, **SCENARIOS[label]) + (SPEC if tag == "spec" else ""))
    return path


def loop(tag: str, case: str, runs: int) -> None:
    """The simulation of one case `runs` times in this process (after one run that warms imports)."""
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        sc = load_scenario(scenario_file(case, tag, Path(tmp)))
    run_scenario(sc, write=False)
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        run_scenario(sc, write=False)
        times.append(time.process_time() - t0)
    print(json.dumps({"case": case, "tag": tag, "min_s": min(times), "median_s": statistics.median(times)}))


def parts(path: Path, runs: int) -> dict:
    """py-spy raw samples of a --loop run (`runs` + 1 runs of run_scenario) by part, a run's share."""
    out = {name: 0.0 for name, _ in PARTS}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        names = {frame.split(" (")[0] for frame in stack.split(";")}
        for name, frames in PARTS:
            if names.intersection(frames):
                out[name] += int(count) / (runs + 1)
                break
    return out


def breakdown(spec: Path, plain: Path, runs: tuple[int, int], case: str) -> None:
    s, p = parts(spec, runs[0]), parts(plain, runs[1])
    added = sum(s.values()) - sum(p.values())
    lines = ["| part of the simulation | samples a run without | with | added | share of what speculation adds |",
             "|" + " --- |" * 5]
    for name in sorted(s, key=lambda n: p[n] - s[n]):
        lines.append(f"| {name} | {p[name]:.0f} | {s[name]:.0f} | {s[name] - p[name]:+.0f} | "
                     f"{100 * (s[name] - p[name]) / added:.0f}% |")
    lines.append(f"| all | {sum(p.values()):.0f} | {sum(s.values()):.0f} | {added:+.0f} | "
                 f"ratio {sum(s.values()) / sum(p.values()):.2f} |")
    out = ROOT / "benchmarks" / "results"
    (out / "spec_speed_profile.json").write_text(json.dumps({"with": s, "without": p}, indent=1) + "\n")
    label = next(k for k in SCENARIOS if k.startswith(case))
    lines += ["", f"py-spy samples (250 a second) of `--loop --case {case}` ({label}), {runs[0]} runs with speculation and "
              f"{runs[1]} without, a run's share; load average {os.getloadavg()[0]:.1f} when written. Without "
              "speculation a member joins the cohort in O(1) counters; with it, its whole future (a draw for every "
              "output position, the walk p -> p + 1 + accepted(p), its steps' drafts, keys, gains and blocks) is "
              "computed with some 25 numpy calls when it joins and added into the cohort's sums, and each run's "
              "price is the verify pass plus k drafter passes (k + 1 affine pieces a run, or a run summed step by "
              "step where the price bends)."]
    (out / "spec_speed_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loop", choices=("spec", "plain"), help="run one case's simulation in this process")
    ap.add_argument("--case", default="chat", help="--loop's case: the start of its label")
    ap.add_argument("--runs", type=int, nargs="+", default=[10], help="--loop's runs; --breakdown's two")
    ap.add_argument("--breakdown", type=Path, nargs=2, metavar=("SPEC", "PLAIN"), help="py-spy raw files")
    args = ap.parse_args()
    if args.loop:
        return loop(args.loop, args.case, args.runs[0])
    if args.breakdown:
        return breakdown(*args.breakdown, tuple(args.runs), args.case)
    rows = []
    load = [os.getloadavg()[0]]
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
    load.append(os.getloadavg()[0])
    lines += ["", f"Medians of {args.repeat} pairs; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end "
              f"({os.cpu_count()} cores). Target (issue 30): a run with speculation costs at most 1.5x the same run "
              "without. Where the simulation's time goes: spec_speed_profile.md."]
    (out / "spec_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
