"""Memory per request of a streamed run (issue 21: "bounded input must mean bounded memory").

Two workloads of benchmarks/sim_speed.py's synthetic scenario: one the engine keeps up with (25 req/s)
and one 40x over what it sustains (1,000 req/s, so nearly every request waits in the queue). For each,
the peak RSS of a whole CLI run (`--quiet --out`, requests.csv streamed) at two sizes gives the cost of
one more request (the slope) and the 10,000,000-request peak it implies (MAX_REQUESTS, the documented
bound). Then tracemalloc, at the moment the overloaded run holds the most, names the lines that hold
it, per waiting request.

    python benchmarks/memory_per_request.py [--small 100000 --large 300000 --traced 50000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_speed import SYNTHETIC  # noqa: E402

MAX_REQUESTS = 10_000_000
PEAK_RSS = ("import resource, sys; from kvsim.cli import main; code = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(code)")


def scenario_text(n: int, rate: float) -> str:
    return SYNTHETIC.format(n=n).replace("rate = 25.0", f"rate = {rate}")


def peak_rss_mib(n: int, rate: float) -> float:
    """Peak RSS (MiB) of one `kvsim run --quiet --out` process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.toml"
        path.write_text(scenario_text(n, rate))
        proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path), "--quiet", "--out", str(Path(tmp) / "o")],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        return int(proc.stderr.strip().splitlines()[-1]) / 1024


def held_at_peak(n: int, rate: float, top: int = 8) -> tuple[float, list[tuple[str, float, int]]]:
    """(requests waiting at the snapshot, [(file:line, bytes per waiting request, blocks)]) when tracemalloc
    sees the run hold the most (sampled every 200 engine samples)."""
    import kvsim.results.metrics as metrics
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.toml"
        path.write_text(scenario_text(n, rate))
        sc = load_scenario(path)
        best = {"bytes": 0, "snap": None, "waiting": 0}
        real, calls = metrics.Metrics.sample, [0]

        def sample(self, t, r, running, waiting, *args, **kwargs):
            calls[0] += 1
            if calls[0] % 200 == 0:
                now = tracemalloc.get_traced_memory()[0]
                if now > best["bytes"] * 1.05:
                    best.update(bytes=now, snap=tracemalloc.take_snapshot(), waiting=self._waiting_now)
            return real(self, t, r, running, waiting, *args, **kwargs)
        metrics.Metrics.sample = sample
        tracemalloc.start(4)
        try:
            run_scenario(sc, Path(tmp) / "o")
        finally:
            tracemalloc.stop()
            metrics.Metrics.sample = real
    waiting = max(best["waiting"], 1)
    stats = best["snap"].statistics("lineno")[:top]
    rows = [(f"{Path(s.traceback[0].filename).relative_to(ROOT) if str(ROOT) in s.traceback[0].filename else Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
             s.size / waiting, s.count) for s in stats]
    return waiting, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=300_000)
    ap.add_argument("--traced", type=int, default=50_000)
    args = ap.parse_args()
    print("| workload | peak RSS MiB at {:,} | at {:,} | bytes a request | implied at 10,000,000 |".format(
        args.small, args.large))
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, rate in (("kept up (25 req/s)", 25.0), ("overloaded (1,000 req/s)", 1000.0)):
        small, large = peak_rss_mib(args.small, rate), peak_rss_mib(args.large, rate)
        slope = (large - small) * 2**20 / (args.large - args.small)
        implied = small + slope * (MAX_REQUESTS - args.small) / 2**20
        print(f"| {label} | {small:,.0f} | {large:,.0f} | {slope:,.0f} | {implied / 1024:,.1f} GiB |")
    waiting, rows = held_at_peak(args.traced, 1000.0)
    print(f"\nHeld at the overloaded run's peak ({args.traced:,} requests, {waiting:,} waiting), by line:\n")
    print("| line | bytes a waiting request | blocks |")
    print("| --- | ---: | ---: |")
    for where, per, count in rows:
        print(f"| `{where}` | {per:,.0f} | {count:,} |")


if __name__ == "__main__":
    main()
