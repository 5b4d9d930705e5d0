"""Step-level accuracy of the step-time model against the H100 profile of kvsim's triton engine.

    python benchmarks/step_model_accuracy.py [PROFILE.csv ...]   # default: benchmarks/results/h100_profile.csv

The coefficients are fitted (as `kvsim calibrate` fits them) to the regular grid only; the random
shapes of grid `heldout` are then predicted by that fit, and the grid's own shapes by 5-fold hold-out.
Prints, per phase and per (model, KV dtype, phase), the median |error|, the 90th percentile and the
median signed error. Target (issue 10): median |error| <= 5% for decode, prefill and mixed steps on
held-out shapes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 0.05


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


def main() -> None:
    from kvsim.calibrate import fit as fitting
    from kvsim.calibrate.tables import read_tables
    from kvsim.perf.calibration import Calibration

    paths = sys.argv[1:] or [str(ROOT / "benchmarks/results/h100_profile.csv")]
    obs = read_tables(paths)
    train = [o for o in obs if o.grid != "heldout"]
    t0 = time.perf_counter()
    free = fitting.identifiable(train, Calibration())
    errors = fitting.holdout_errors(obs, Calibration(), free, k=5)
    wall = time.perf_counter() - t0
    held = [(o, e) for o, e in zip(obs, errors) if o.grid == "heldout"]
    kfold = [(o, e) for o, e in zip(obs, errors) if o.grid != "heldout"]
    print(f"# Step-time model accuracy: {', '.join(Path(p).name for p in paths)}\n")
    print(f"{len(train)} grid shapes fitted ({len(free)} coefficients), {len(held)} random held-out shapes; "
          f"fits and hold-out took {wall:.0f} s.\n")
    phase = lambda o: (o.phase,)  # noqa: E731
    detail = lambda o: (o.model.name, o.kv_cache_dtype, o.phase + (" (graph)" if o.graph_batch else ""))  # noqa: E731
    print(table("Held-out shapes (random, never fitted), per phase", ("phase",),
                rows(*zip(*held), phase), target=True) + "\n")
    print(table("Grid shapes, 5-fold hold-out, per phase", ("phase",), rows(*zip(*kfold), phase)) + "\n")
    print(table("Held-out shapes by model, KV dtype and phase", ("model", "kv", "phase"), rows(*zip(*held), detail)))


if __name__ == "__main__":
    main()
