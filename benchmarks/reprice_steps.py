"""Re-price the GPU steps of serving runs with a calibration: predicted / measured per phase and batch band.

    python benchmarks/reprice_steps.py RUNS/*-steps.csv [--calibration FILE] [--out results.md]

The step logs are those `benchmarks/validate_gpu.py` writes (KVSIM_STEP_LOG: every GPU step's shape,
measured time and the price the run's model gave it, `predicted_s`). Each step is priced again with
the calibration (default: the shipped triton-engine one) and both prices are compared with the
measured time, per scenario, KV dtype, phase and batch band: the median of predicted / measured and
the ratio of the sums. A check of the model on serving shapes, never a fit: nothing here feeds back
into a calibration. Logs written before the step log recorded `max_model_len` take it from the
validation scenario of the same name (the decode kernel's splits depend on it).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODE_BANDS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 30))


def band(o) -> str:
    from kvsim.calibrate.tables import token_band

    if o.phase != "decode":
        return token_band(o.counts[1] + o.counts[4]) + " tokens"
    n = o.counts[4]
    lo, hi = next(b for b in DECODE_BANDS if b[0] <= n <= b[1])
    return f"{lo}-{hi} seqs" if hi < 1 << 30 else f">{lo - 1} seqs"


def scenario_max_model_len(stem: str) -> int:
    """max_model_len of the validation scenario named `stem` (0 when there is none)."""
    import kvsim
    from benchmarks.validate_gpu import SCENARIOS
    from kvsim.perf.memory import max_model_len
    from kvsim.scenario.catalog import model_spec

    for path in SCENARIOS:
        sc = kvsim.load_scenario(ROOT / path)
        if sc.name == stem:
            return max_model_len(sc, model_spec(sc))
    return 0


def read_log(path: Path) -> list[tuple]:
    """(observation, logged predicted seconds) per step of one log."""
    from kvsim.calibrate.tables import read_profile

    obs = read_profile(path)
    logged = [float(r["predicted_s"]) for r in csv.DictReader(open(path))]
    stem = path.name.removesuffix("-steps.csv")
    mml = scenario_max_model_len(stem) if any(not o.max_model_len for o in obs) else 0
    return [(replace(o, max_model_len=o.max_model_len or mml, band=band(o), group=stem), p)
            for o, p in zip(obs, logged)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--calibration", type=Path, help="default: the shipped H100-SXM-triton.json")
    args = ap.parse_args()
    from kvsim.calibrate.fit import Pricer
    from kvsim.perf.calibration import load_calibration, shipped_path

    cal_path = args.calibration or shipped_path("H100-SXM", "triton")
    pricer = Pricer(load_calibration(cal_path))
    groups: dict[tuple, list] = {}
    for path in args.logs:
        for o, before in read_log(path):
            after = pricer.price(o)
            for key in ((o.group, o.kv_cache_dtype, o.phase, o.band), (o.group, o.kv_cache_dtype, o.phase, "all")):
                groups.setdefault(key, []).append((o.measured, before, after))
    print(f"# Serving steps re-priced: {', '.join(p.name for p in args.logs)}\n")
    print(f"before: the price logged by the run (the model it ran with); after: {cal_path.name} as it is now. "
          "Ratios are predicted / measured (median per step; sum: total predicted over total measured).\n")
    print("| scenario | kv | phase | band | steps | measured s | before: median | before: sum | after: median | "
          "after: sum |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    order = lambda k: (k[0], k[1], k[2], k[3] == "all", _band_order(k[3]))  # noqa: E731
    for key in sorted(groups, key=order):
        rows = groups[key]
        meas = sum(m for m, _, _ in rows)
        med = [statistics.median(p / m for m, *ps in rows for p in ps[i:i + 1]) for i in (0, 1)]
        tot = [sum(r[i] for r in rows) / meas for i in (1, 2)]
        name = f"**{key[3]}**" if key[3] == "all" else key[3]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {name} | {len(rows)} | {meas:.2f} | {med[0]:.3f} | {tot[0]:.3f} | "
              f"{med[1]:.3f} | {tot[1]:.3f} |")


def _band_order(name: str) -> int:
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return int(digits[0]) if digits else 0


if __name__ == "__main__":
    main()
