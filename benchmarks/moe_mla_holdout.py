"""Fused-MoE and MLA kernel times held out of the shipped tables by shape, predicted by the measured
pricer's curves (kvsim/perf/kernel_moe.py on kvsim/perf/kernel_curves.py's interpolation).

    python benchmarks/moe_mla_holdout.py       # ~a minute; writes benchmarks/results/moe_mla_holdout.md

Held out:
- fused MoE (every routing, every dtype timed): every configuration at expert-parallel sizes 4, 16 and
  64, predicted log-log between the sizes either side (2 and 8, 8 and 32, 32 and 128) at every token count;
  points whose neighbours were not timed (the pricer scales the nearest configuration by the roofline)
  are reported apart;
- MLA module (DeepSeek-V3's, prefill and decode, bf16 and fp8 KV, bf16 and fp8-block GEMMs): every row
  of 2, 8 and 32 query heads a GPU, predicted from 1, 4, 16, 64 and 128 at every batch and length.
Target (issue 18): median |error| <= 10% on the interpolated points.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.calibrate.kernel_holdout import stats  # noqa: E402
from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path  # noqa: E402
from kvsim.perf.kernel_curves import Roofline  # noqa: E402
from kvsim.perf.kernel_moe import MLA_HELD_HEADS, MOE_HELD_EP, MlaRoof, mla_errors, moe_errors  # noqa: E402
from kvsim.perf.kernels import load_tables, shipped_path, shipped_versions  # noqa: E402
from kvsim.scenario.catalog import GPUS, MODELS  # noqa: E402

WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "mxfp4": 0.53}
TARGET = 0.10


def rows_for(gpu_name: str, version: str) -> list[tuple]:
    tables = load_tables(str(shipped_path(gpu_name, version)))
    gpu, cal = GPUS[gpu_name], load_calibration(calibration_path(gpu_name))
    out = []
    for dtype, table in tables.moe.items():
        wb = WEIGHT_BYTES[dtype]
        roof = Roofline(gpu, cal, 1.0 if wb < 2 else 2.0)
        out.append((f"fused MoE ({dtype})", f"EP {', '.join(map(str, MOE_HELD_EP))}", *moe_errors(table, roof, wb)))
    ds = MODELS["DeepSeek-V3"]
    for (family, kvd, gemm), grid in sorted(tables.mla.items()):
        wb = 2.0 if gemm == "bfloat16" else 1.0
        mroof = MlaRoof(Roofline(gpu, cal, wb), ds.mla, ds.hidden_size, 1.0 if kvd == "fp8" else 2.0, wb)
        name = "MLA prefill" if family == "mla_context" else "MLA decode"
        out.append((f"{name} ({kvd} KV, {gemm} GEMMs)", f"{', '.join(map(str, MLA_HELD_HEADS))} heads",
                    *mla_errors(grid, family, mroof)))
    return out


def pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def main() -> None:
    head = ("| GPU | vLLM | kernel | held out | points | median abs error | p90 abs error | median error | "
            "extrapolated points (median abs error) | target |")
    lines = [head, "|" + " --- |" * 10]
    for gpu in ("H100-SXM", "H200"):
        for version in shipped_versions(gpu):
            for name, held, inside, outside in rows_for(gpu, version):
                n, med, p90, signed = stats(inside)
                m, omed, _, _ = stats(outside)
                if not n and not m:
                    continue
                ok = "met" if med is not None and med <= TARGET else "missed"
                lines.append(f"| {gpu} | {version} | {name} | {held} | {n:,} | {pct(med)} | {pct(p90)} | "
                             f"{'-' if signed is None else f'{signed:+.1%}'} | {m:,} ({pct(omed)}) | {ok} |")
                print(lines[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / "moe_mla_holdout.md"
    out.write_text("# Fused-MoE and MLA kernels held out by shape\n\n`python benchmarks/moe_mla_holdout.py` (see its "
                   "docstring for what is held out). The predictions are the measured pricer's own curves fed "
                   "the tables without those rows.\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
