"""Prediction check: a scenario's results from the real `triton` backend beside the analytic backend's.

    python benchmarks/compare_backends.py scenarios/validate_h100.toml benchmarks/results/validate_h100

The second argument is the results folder of a GPU run of the scenario (its summary.json). The
scenario is simulated again here with `backend = "analytic"` (no GPU) and, for each policy, the
headline figures are printed side by side with the analytic / measured ratio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIGURES = [("TTFT p50 ms", ("ttft_s", "p50"), 1e3), ("TTFT p99 ms", ("ttft_s", "p99"), 1e3),
           ("ITL p50 ms", ("itl_s", "p50"), 1e3), ("ITL p99 ms", ("itl_s", "p99"), 1e3),
           ("TPOT mean ms", ("tpot_s", "mean"), 1e3), ("E2E p50 s", ("e2e_s", "p50"), 1.0),
           ("output tok/s", ("throughput", "output_tokens_per_s"), 1.0), ("peak running", ("peak_running",), 1.0),
           ("KV blocks", ("kv", "num_blocks"), 1.0)]


def pick(summary: dict, path: tuple):
    for key in path:
        summary = summary[key]
    return summary


def main() -> None:
    from kvsim.run import run_scenario
    from kvsim.scenario.config import load_scenario

    scenario_path, measured_dir = Path(sys.argv[1]), Path(sys.argv[2])
    measured = json.loads((measured_dir / "summary.json").read_text())["policies"]
    sc = load_scenario(scenario_path)
    sc = sc.model_copy(update={"backend": sc.backend.model_copy(update={"name": "analytic"})})
    predicted = run_scenario(sc, write=False).summaries
    print(f"# {sc.name}: analytic prediction vs measured ({measured_dir})\n")
    for policy, real in measured.items():
        print(f"## {policy}\n\n| figure | measured | analytic | analytic / measured |\n| --- | ---: | ---: | ---: |")
        for name, path, scale in FIGURES:
            m, p = pick(real, path) * scale, pick(predicted[policy], path) * scale
            print(f"| {name} | {m:,.2f} | {p:,.2f} | {p / m if m else float('nan'):.2f} |")
        print()


if __name__ == "__main__":
    main()
