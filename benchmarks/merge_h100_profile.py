"""Merge the two H100 `kvsim profile` runs into the table the shipped triton calibration is fitted to.

    python benchmarks/merge_h100_profile.py   # writes benchmarks/results/h100_profile.csv

Run 1 (h100_profile_run1.csv) timed the regular grid once; run 2 (h100_profile_run2.csv) timed the
regular grid and the random held-out shapes in two passes each, and recorded the lesser pass median
as step_s with spread = larger / lesser. Eager (host-bound) steps on that machine swing by up to 2x
over spells of seconds (the host, not the engine: the same shape runs at either speed), so each
shape's step_s here is the least of all its pass medians (three for the regular grid, two for
held-out shapes), as `kvsim profile` records it now; spread is the largest over the least. Both runs predate the runner's switch to vLLM's CUDA-graph
capture sizes: their decode steps were padded to 1, 2, 4, 8, 16, 24, 32 and then steps of 16, written
here as graph_batch.
"""

from __future__ import annotations

import csv
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
KEY = ("model", "kv_cache_dtype", "cuda_graph", "phase", "decode_seqs", "decode_context", "prefill_seqs",
       "prefill_chunk", "prefill_cached")
OLD_GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, *range(48, 256, 16), 256)


def main() -> None:
    run1 = {tuple(r[k] for k in KEY): r for r in csv.DictReader(open(RESULTS / "h100_profile_run1.csv"))}
    run2 = list(csv.DictReader(open(RESULTS / "h100_profile_run2.csv")))
    out = []
    for r in run2:
        low, spread = float(r["step_s"]), float(r["spread"])
        medians = [low, low * spread]
        first = run1.get(tuple(r[k] for k in KEY))
        if first is not None:
            medians.append(float(first["step_s"]))
        n = int(r["num_decode_seqs"])
        graph = next(b for b in OLD_GRAPH_SIZES if b >= n) if r["cuda_graph"] == "1" else 0
        out.append({**r, "step_s": f"{min(medians):.7g}", "spread": f"{max(medians) / min(medians):.4g}",
                    "graph_batch": graph, "passes": len(medians)})
    with open(RESULTS / "h100_profile.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    print(f"{len(out)} shapes -> {RESULTS / 'h100_profile.csv'}")


if __name__ == "__main__":
    main()
