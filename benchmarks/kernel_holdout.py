"""Kernel-level accuracy of the measured pricer's interpolation, on table rows held out by shape.

    python benchmarks/kernel_holdout.py [--all-versions] > benchmarks/results/kernel_holdout.md

For each GPU and vLLM release shipped in kvsim/perf/kernel_data/, whole shapes are removed from the
tables and the pricer's own builders predict them from what is left (kvsim/calibrate/kernel_holdout.py
says what is held out: GEMM rows whose n or k is 3584, 5120, 7168, 10240 or 51200, the model sizes that
are not powers of two; attention rows of 24 and of 40 query heads, whole head configurations;
all-reduce messages of odd powers of two elements). Points a prediction had to extrapolate (a neighbour
missing, scaled by the roofline) are reported apart. Target (issue 17): median |error| <= 5% per family
on interpolated points.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.calibrate.kernel_holdout import TARGET, holdout_rows, stats  # noqa: E402
from kvsim.perf.calibration import Calibration, load_calibration, shipped_path as calibration_path  # noqa: E402
from kvsim.perf.kernels import GPU_STEMS, KernelTables, shipped_path, shipped_versions, version_key  # noqa: E402
from kvsim.scenario.catalog import GPUS  # noqa: E402


def fmt(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all-versions", action="store_true", help="every shipped release, not only the newest")
    args = ap.parse_args()
    print("| GPU | vLLM | kernel family | held out | points | median abs error | p90 abs error | median error "
          "| extrapolated points (median abs error) | target |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary: dict = {}
    for gpu in GPU_STEMS:
        versions = shipped_versions(gpu)
        for version in versions if args.all_versions else [max(versions, key=version_key)]:
            path = calibration_path(gpu)
            cal = load_calibration(path) if path.exists() else Calibration()
            for family, held, inside, outside in holdout_rows(KernelTables(shipped_path(gpu, version)), GPUS[gpu], cal):
                n, med, p90, bias = stats(inside)
                no, medo, _, _ = stats(outside)
                ok = "met" if med is not None and med <= TARGET else "**not met**"
                print(f"| {gpu} | {version} | {family} | {held} | {n:,} | {fmt(med)} | {fmt(p90)} | "
                      f"{'-' if bias is None else f'{bias:+.1%}'} | {no:,} ({fmt(medo)}) | {ok} |")
                summary.setdefault(family.split(" (")[0], []).extend(inside)
    print()
    print("All GPUs and releases above pooled, per kernel family (interpolated points):")
    print()
    print("| kernel family | points | median abs error | p90 abs error | target |")
    print("| --- | --- | --- | --- | --- |")
    for family, errs in summary.items():
        n, med, p90, _ = stats(errs)
        print(f"| {family} | {n:,} | {fmt(med)} | {fmt(p90)} | {'met' if med <= TARGET else '**not met**'} |")


if __name__ == "__main__":
    main()
