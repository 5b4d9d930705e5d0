"""Rebuild the kernel tables shipped in kvsim/perf/kernel_data/ from AIConfigurator's Parquet tables.

    python benchmarks/ship_kernel_tables.py [--root ../shared/profiles/aiconfigurator]

One `<gpu>-vllm-<version>.npz` per GPU preset and vLLM release that has every table a step needs
(GEMM, prefill and decode attention, vLLM's all-reduce), converted by kvsim.calibrate.aiconfigurator
(needs pyarrow). The source is NVIDIA's Apache-2.0 performance database (ai-dynamo/aiconfigurator,
the commit in kvsim.calibrate.aiconfigurator.SOURCE_COMMIT); its LICENSE is copied beside the files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.calibrate.aiconfigurator import AIC_GPUS, convert, versions, write_tables  # noqa: E402
from kvsim.perf.kernels import DATA_DIR  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "profiles" / "aiconfigurator")
    args = ap.parse_args()
    DATA_DIR.mkdir(exist_ok=True)
    shutil.copyfile(args.root / "LICENSE", DATA_DIR / "LICENSE")
    for gpu, stem in AIC_GPUS.items():
        for version in versions(args.root, stem):
            arrays, meta = convert(args.root, gpu, version)
            out = DATA_DIR / f"{stem}-vllm-{version}.npz"
            write_tables(out, arrays, meta)
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
