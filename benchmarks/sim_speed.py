"""Simulator speed benchmark: import time, the Azure and Mooncake traces through the whole CLI, and a
million synthetic requests; optionally paired against another checkout.

    python benchmarks/sim_speed.py                          # every row, 3 repeats
    python benchmarks/sim_speed.py --baseline /tmp/main     # each row run alternately here and there
    python benchmarks/sim_speed.py --only import,azure --repeat 7
    python benchmarks/sim_speed.py --requests 100000 --skip-million
    python benchmarks/sim_speed.py --pair-pricing            # measured pricing (new) vs roofline (base), here

Every figure comes from a fresh process (`python -m kvsim run ... --quiet`), measured by `os.wait4`:
wall seconds, CPU seconds (user + system) and peak RSS. With `--baseline DIR` (a checkout of another
commit, e.g. `git archive COMMIT | tar -x -C DIR`) each repeat runs the baseline and this tree back
to back, in alternating order, and the table gives both medians and the median of the per-repeat
ratios (new / baseline): on a shared machine only paired figures compare. `--pair-pricing` pairs
this tree with itself, `backend.pricing = "measured"` (new) against `"roofline"` (base).

Rows and targets (issue 16): the imports of an Azure whole CLI run (`python -X importtime`, the
top-level modules' cumulative times summed, the lazy ones included) <= 0.15 s; Azure conversation trace,
policy paged, whole CLI <= 1.0 s (and its simulation alone, `run_scenario` without writing);
scenarios/mooncake.toml (3 policies, 4 replicas, prefix caching) whole CLI <= 5 s and <= 500 MiB;
1,000,000 synthetic requests whole CLI <= 40 s (and <= 1 GiB).
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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

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

# The simulation alone, in a fresh process: prints its seconds and the engine events.
SIMULATE = """
import json, sys
from kvsim.pipeline import run_scenario
from kvsim.scenario.config import load_scenario
sc = load_scenario(sys.argv[1])
if len(sys.argv) > 2:
    sc = sc.model_copy(update={"backend": sc.backend.model_copy(update={"pricing": sys.argv[2]})})
r = run_scenario(sc, policies=["paged"], write=False)
s = r.summaries["paged"]
print(json.dumps([r.runs[0].wall_s, s["engine_events"], s["engine_steps"]]))
"""


class Tree(NamedTuple):
    """A checkout to run, and the `--set` overrides every kvsim run of it gets."""

    path: Path
    sets: tuple = ()

    def set_args(self) -> list[str]:
        return [a for s in self.sets for a in ("--set", s)]


def run(tree: Tree, argv: list[str]) -> dict:
    """Wall s, CPU s (user + system) and peak RSS MiB of one process run in `tree`, and its stdout
    (os.wait4: the child's own rusage)."""
    env = {**os.environ, "PYTHONPATH": str(tree.path)}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, *argv], cwd=tree.path, env=env, stdout=subprocess.PIPE, stderr=err,
                                text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed in {tree.path}: {err.read().strip()[-400:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024, "out": out}


def row_import(tree: Tree, tmp: Path) -> dict:
    """Seconds of imports in a whole Azure CLI run (`-X importtime`, top-level modules summed: the
    lazy imports of the run included, each tree's own start-up settings applied)."""
    out = tmp / f"imports-{time.monotonic_ns()}"
    args = ["-X", "importtime", "-m", "kvsim", "run", str(ROOT / "scenarios/azure_conv.toml"), "--policy", "paged",
            "--quiet", "--out", str(out), *tree.set_args()]
    with tempfile.TemporaryFile("w+") as err:
        subprocess.run([sys.executable, *args], cwd=tree.path, env={**os.environ, "PYTHONPATH": str(tree.path)},
                       stdout=subprocess.DEVNULL, stderr=err, check=True)
        err.seek(0)
        micros = sum(int(line.split("|")[1]) for line in err
                     if line.startswith("import time:") and line.split("|")[2].startswith(" ") and
                     not line.split("|")[2].startswith("  ") and line.split("|")[1].strip().isdigit())
    return {"wall": micros / 1e6, "cpu": None, "rss": None}


def row_azure_sim(tree: Tree, tmp: Path) -> dict:
    pricing = [s.split("=", 1)[1] for s in tree.sets if s.startswith("backend.pricing=")]
    r = run(tree, ["-c", SIMULATE, str(ROOT / "scenarios/azure_conv.toml"), *pricing])
    sim, events, steps = json.loads(r["out"].strip().splitlines()[-1])
    return {**r, "wall": sim, "cpu": None, "rss": None, "events": events, "steps": steps}


def _cli(tree: Tree, tmp: Path, args: list[str]) -> dict:
    out = tmp / f"out-{time.monotonic_ns()}"
    r = run(tree, ["-m", "kvsim", "run", *args, "--quiet", "--out", str(out), *tree.set_args()])
    pol = json.loads((out / "summary.json").read_text())["policies"].values()
    return {**r, "events": sum(p["engine_events"] for p in pol), "steps": sum(p["engine_steps"] for p in pol)}


def row_azure(tree: Tree, tmp: Path) -> dict:
    return _cli(tree, tmp, [str(ROOT / "scenarios/azure_conv.toml"), "--policy", "paged"])


def row_mooncake(tree: Tree, tmp: Path) -> dict:
    return _cli(tree, tmp, [str(ROOT / "scenarios/mooncake.toml")])


def row_million(tree: Tree, tmp: Path, n: int) -> dict:
    path = tmp / f"million-{n}.toml"
    path.write_text(SYNTHETIC.format(n=n))
    return _cli(tree, tmp, [str(path)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout, measured alternately with this one")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--million-repeat", type=int, default=None, help="repeats of the million row (default --repeat)")
    ap.add_argument("--only", default="import,azure-sim,azure,mooncake,million")
    ap.add_argument("--skip-million", action="store_true")
    ap.add_argument("--pair-pricing", action="store_true",
                    help="measured pricing (new) against the roofline (base), both in this tree")
    args = ap.parse_args()
    n = args.requests
    rows = {
        "import": ("imports of the Azure whole CLI run (-X importtime, top level summed)", row_import, "<= 0.15 s"),
        "azure-sim": ("azure_conv, paged: simulation", row_azure_sim, ""),
        "azure": ("azure_conv, paged: whole CLI run", row_azure, "<= 1.0 s"),
        "mooncake": ("mooncake, 3 policies: whole CLI run", row_mooncake, "<= 5 s, <= 500 MiB"),
        "million": (f"{n:,} synthetic requests: whole CLI run", lambda t, d: row_million(t, d, n),
                    "<= 40 s, <= 1024 MiB"),
    }
    chosen = [k for k in args.only.split(",") if k in rows and not (k == "million" and args.skip_million)]
    if args.pair_pricing:
        trees = [("new", Tree(ROOT, ("backend.pricing=measured",))), ("base", Tree(ROOT, ("backend.pricing=roofline",)))]
    else:
        trees = [("new", Tree(ROOT))] + ([("base", Tree(args.baseline.resolve()))] if args.baseline else [])
    print(f"cpu: {os.cpu_count()} cores, python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}; "
          f"new = {ROOT}" + (f", base = {args.baseline}" if args.baseline else ""))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in chosen:
            name, fn, target = rows[key]
            reps = args.million_repeat if key == "million" and args.million_repeat else args.repeat
            got = {label: [] for label, _ in trees}
            for i in range(reps):
                order = trees if i % 2 == 0 else trees[::-1]
                for label, tree in order:
                    got[label].append(fn(tree, Path(tmp)))
            results[key] = (name, target, got)
            print(f"  {name}: done ({os.getloadavg()[0]:.2f} load)", file=sys.stderr)
    print_table(results, len(trees) > 1)


def _med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(x, spec=".2f") -> str:
    return "" if x is None else format(x, spec)


def print_table(results: dict, paired: bool) -> None:
    if paired:
        print("| run | base wall s | new wall s | new / base (median of pairs) | base CPU s | new CPU s "
              "| base RSS MiB | new RSS MiB | engine events | target |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    else:
        print("| run | wall s (median) | all walls | CPU s (median) | peak RSS MiB | engine events | engine steps | target |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, target, got in results.values():
        new = got["new"]
        med = {k: _med(r[k] for r in new) for k in ("wall", "cpu", "rss")}
        ev = new[-1].get("events")
        if paired:
            base = got["base"]
            bmed = {k: _med(r[k] for r in base) for k in ("wall", "cpu", "rss")}
            ratio = _med(a["wall"] / b["wall"] for a, b in zip(new, base))
            print(f"| {name} | {_fmt(bmed['wall'], '.3f')} | {_fmt(med['wall'], '.3f')} | {_fmt(ratio, '.3f')} "
                  f"| {_fmt(bmed['cpu'])} | {_fmt(med['cpu'])} | {_fmt(bmed['rss'], ',.0f')} | {_fmt(med['rss'], ',.0f')} "
                  f"| {'' if ev is None else f'{ev:,}'} | {target} |")
        else:
            walls = ", ".join(f"{r['wall']:.2f}" for r in new)
            steps = new[-1].get("steps")
            print(f"| {name} | {_fmt(med['wall'], '.3f')} | {walls} | {_fmt(med['cpu'])} | {_fmt(med['rss'], ',.0f')} "
                  f"| {'' if ev is None else f'{ev:,}'} | {'' if steps is None else f'{steps:,}'} | {target} |")


if __name__ == "__main__":
    main()
