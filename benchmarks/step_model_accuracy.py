"""Step-level accuracy of the step-time model against the H100 profiles of kvsim's triton engine.

    python benchmarks/step_model_accuracy.py [PROFILE.csv ...]
    # default: benchmarks/results/h100_profile.csv (regular grid) and h100_profile_serving.csv (serving shapes)

The coefficients are fitted as benchmarks/ship_calibrations.py fits the shipped calibration: the first
table alone from the built-in defaults, then every table from that fit with the host-side coefficients
fitted per table (profiles from different machines). Only the fitted grids' shapes are fitted; the
random shapes of grid `heldout` are predicted by that fit, and the grids' own shapes by 5-fold
hold-out. Prints, per phase (and for ragged decode batches, whose contexts differ per sequence, as a
slice of their own) and per (model, KV dtype, phase), the median |error|, the 90th percentile and
the median signed error. Target (issue 10): median |error| <= 5% for decode, prefill and mixed steps
on held-out shapes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 0.05
TABLES = ("benchmarks/results/h100_profile.csv", "benchmarks/results/h100_profile_serving.csv")
HOST_SIDE = ("graph_step_overhead_s", "step_overhead_s", "eager_layer_s", "eager_attention_s", "eager_quantized_s",
             "per_seq_overhead_s")


def rows(observations, errors, key) -> list[tuple]:
    groups: dict = {}
    for o, e in zip(observations, errors):
        groups.setdefault(key(o), []).append(e)
    out = []
    for k in sorted(groups):
        e = np.asarray(groups[k])
        out.append((*k, len(e), np.median(np.abs(e)), np.percentile(np.abs(e), 90), np.median(e)))
    return out


def table(title: str, header: tuple, data: list[tuple], target: bool = False) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " | n | median abs error | p90 abs error | median error |"
             + (" target |" if target else ""), "|" + " --- |" * (len(header) + 4 + target)]
    for r in data:
        k, (n, med, p90, bias) = r[:len(header)], r[len(header):]
        mark = (" met |" if med <= TARGET else " missed |") if target else ""
        lines.append("| " + " | ".join(map(str, k)) + f" | {n} | {med:.1%} | {p90:.1%} | {bias:+.1%} |" + mark)
    return "\n".join(lines)


def ragged(o) -> bool:
    """A decode step whose sequences hold different contexts (its longest above its mean)."""
    n, total, longest = o.counts[4], o.counts[5], o.counts[6]
    return o.phase == "decode" and longest * n > total


def phase(o) -> tuple:
    return (o.phase + (" (ragged)" if ragged(o) else ""),)


def main() -> None:
    from kvsim.calibrate import fit as fitting
    from kvsim.calibrate.tables import read_tables
    from kvsim.perf.calibration import Calibration

    paths = sys.argv[1:] or [str(ROOT / p) for p in TABLES]
    obs = read_tables(paths, across_tables=False)
    train = [o for o in obs if o.grid != "heldout"]
    t0 = time.perf_counter()
    first = [o for o in train if o.table == obs[0].table]
    start = fitting.fit(first, Calibration()).calibration
    free = fitting.identifiable(train, start)
    errors = fitting.holdout_errors(obs, start, free, k=5, per_table=HOST_SIDE)
    wall = time.perf_counter() - t0
    held = [(o, e) for o, e in zip(obs, errors) if o.grid == "heldout"]
    kfold = [(o, e) for o, e in zip(obs, errors) if o.grid != "heldout"]
    print(f"# Step-time model accuracy: {', '.join(Path(p).name for p in paths)}\n")
    print(f"{len(train)} grid shapes fitted ({len(free)} coefficients; {', '.join(HOST_SIDE)} one value per table), "
          f"{len(held)} random held-out shapes; fits and hold-out took {wall:.0f} s.\n")
    detail = lambda o: (o.model.name, o.kv_cache_dtype, phase(o)[0] + (" (graph)" if o.graph_batch else ""))  # noqa: E731
    print(table("Held-out shapes (random, never fitted), per phase", ("phase",), rows(*zip(*held), phase),
                target=True) + "\n")
    print(table("Grid shapes, 5-fold hold-out, per phase", ("phase",), rows(*zip(*kfold), phase)) + "\n")
    print(table("Held-out shapes by model, KV dtype and phase", ("model", "kv", "phase"), rows(*zip(*held), detail)))


if __name__ == "__main__":
    main()
