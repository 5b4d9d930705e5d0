"""Byte identity of kvsim's outputs: run every shipped CPU scenario (and variants that reach the
preemption, swap, multi-replica and contiguous paths) plus a million-request run, hash the files
each writes, and compare against the hashes recorded from an earlier commit.

    python benchmarks/output_hashes.py --record          # write benchmarks/results/output_hashes.json
    python benchmarks/output_hashes.py                   # compare: prints every file that differs
    python benchmarks/output_hashes.py --skip-million -j 2 --only chat,mooncake

A refactoring must leave every hash as it was. When results change on purpose (a new step price,
a new router), rerun with --record in the same commit and say in the commit which cases changed
and why. The exit status is 1 when a file differs, so the script can gate a change.

Cases: scenarios/*.toml and scenarios/validate/*.toml except the GPU-only runs (the validate
scenarios run on the analytic backend, as `kvsim validate` simulates them); chat and shared_prefix
with a small KV cache (recompute and swap preemption); chat on 3 replicas per router; Mooncake with
the least-loaded router besides its own prefix-affinity one; 1,000,000 synthetic requests
(benchmarks/sim_speed.py's workload). `--only` takes case names or prefixes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "output_hashes.json"
FILES = ("summary.json", "requests.csv", "timeseries.csv")  # report.html is drawn from these
GPU_ONLY = {"gpu_smoke.toml"}  # the triton backend's own smoke run: nothing analytic to compare
ANALYTIC = ("--set", "backend.name=analytic")
TIGHT = ("--set", "hardware.gpu_memory_utilization=0.25")


def cases(million: int) -> dict[str, list[str]]:
    """Case name -> `python -m kvsim run` arguments (before --out)."""
    out = {}
    for path in sorted((ROOT / "scenarios").glob("*.toml")) + sorted((ROOT / "scenarios/validate").glob("*.toml")):
        if path.name in GPU_ONLY:
            continue
        text = path.read_text()
        extra = list(ANALYTIC) if 'name = "triton"' in text else []
        out[path.stem] = [str(path.relative_to(ROOT)), *extra]
    out["chat-tight-recompute"] = ["scenarios/chat.toml", *TIGHT]
    out["chat-tight-swap"] = ["scenarios/chat.toml", *TIGHT, "--set", "engine.preemption_mode=swap"]
    out["shared_prefix-tight"] = ["scenarios/shared_prefix.toml", *TIGHT]
    for router in ("least_loaded", "round_robin"):
        out[f"chat-3-replicas-{router}"] = ["scenarios/chat.toml", "--set", "hardware.num_replicas=3",
                                            "--set", f"hardware.router={router}"]
    out["shared_prefix-3-replicas-prefix_affinity"] = ["scenarios/shared_prefix.toml", "--set", "hardware.num_replicas=3",
                                              "--set", "hardware.router=prefix_affinity"]
    out["mooncake-least_loaded"] = ["scenarios/mooncake.toml", "--set", "hardware.router=least_loaded"]
    if million:
        out["million"] = ["MILLION", str(million)]
    return out


# Cases whose answers depend on the prefix-affinity router's view of the replicas' caches.
PREFIX_AFFINITY = {"mooncake", "shared_prefix-3-replicas-prefix_affinity"}


def run_case(name: str, args: list[str], tmp: Path) -> tuple[str, dict[str, str], float]:
    out = tmp / name
    if args[0] == "MILLION":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from sim_speed import SYNTHETIC

        toml = tmp / f"{name}.toml"
        toml.write_text(SYNTHETIC.format(n=int(args[1])))
        args = [str(toml)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvsim", "run", *args, "--quiet", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return name, {"error": proc.stderr.strip()[-500:]}, wall
    return name, {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in FILES}, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write the hashes to {RECORD.relative_to(ROOT)}")
    ap.add_argument("--only", help="comma-separated case names or prefixes")
    ap.add_argument("--skip-million", action="store_true")
    ap.add_argument("--million", type=int, default=1_000_000, help="requests of the synthetic case")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="cases run at once")
    args = ap.parse_args()
    todo = cases(0 if args.skip_million else args.million)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        todo = {k: v for k, v in todo.items() if any(k == w or k.startswith(w) for w in wanted)}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda kv: run_case(*kv, Path(tmp)), todo.items()))
    recorded = json.loads(RECORD.read_text())["cases"] if RECORD.exists() else {}
    differ = 0
    for name, hashes, wall in results:
        old = recorded.get(name)
        if "error" in hashes:
            print(f"{name}: FAILED ({wall:.1f} s): {hashes['error']}")
            differ += 1
            continue
        changed = [f for f in FILES if old is not None and old.get(f) != hashes[f]]
        note = "" if not changed or name not in PREFIX_AFFINITY else " (prefix-affinity routing)"
        state = "new" if old is None else (f"DIFFERS: {', '.join(changed)}{note}" if changed else "identical")
        print(f"{name}: {state} ({wall:.1f} s)")
        differ += bool(changed)
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvsim"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        merged = {**recorded, **{name: hashes for name, hashes, _ in results if "error" not in hashes}}
        doc = {"commit": commit + ("+changes" if dirty else ""), "files": list(FILES),
               "cases": dict(sorted(merged.items()))}
        RECORD.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"recorded {len(results)} cases in {RECORD.relative_to(ROOT)}")
        return 0
    print(f"{differ} of {len(results)} cases differ" if differ else f"all {len(results)} cases identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
