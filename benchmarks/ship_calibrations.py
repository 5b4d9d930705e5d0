"""Rebuild the calibrations shipped in kvsim/perf/calibrations/ from their sources.

    python benchmarks/ship_calibrations.py

- H100-SXM-triton.json: kvsim's own triton engine, `kvsim calibrate` on the H100 profiles
  (benchmarks/results/h100_profile.csv, the regular grid; h100_profile_serving.csv, the shapes serving
  produces, timed on another machine; random held-out shapes kept out of the fit). Two stages: the
  regular grid alone from the built-in defaults, then both tables from that fit, with the host-side
  coefficients fitted per table (the two machines' hosts differ, their GPUs agree; the shipped values
  are the regular grid's machine's, which matched the serving runs' machine on small decode steps).
- H100-SXM.json, A100-80GB.json: vLLM V1 (v0.11.0). `kvsim calibrate` on Vidur's public operator
  profiles (/work/shared/profiles/vidur: GEMMs and all-reduce within a node) from
  benchmarks/calibrations/vllm_public.json, whose public figures cover what the profiles cannot
  measure; the CUDA-graph step overhead is then solved from a public vLLM ITL (below). A100 has no
  public ITL here: its host-side overheads are H100's.
- H200.json: H100's coefficients (the same compute die and host software; the datasheet bandwidth
  differs, which the GpuSpec carries).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "kvsim" / "perf" / "calibrations"
VIDUR = Path("/work/shared/profiles/vidur")
PUBLIC = ROOT / "benchmarks" / "calibrations" / "vllm_public.json"
# vLLM blog "The State of FP8 KV-Cache and Attention Quantization in vLLM" (2026-04-22, vLLM v0.19.1):
# Llama-3.1-8B on one H100, concurrency 1, 128 output tokens: ITL = 6.44 ms + 4.37e-5 ms x input_len (bf16).
BLOG_ITL_INTERCEPT_S = 6.44e-3
BLOG_SOURCE = ("solved so that a Llama-3.1-8B decode step of one sequence at zero context costs 6.44 ms, the "
               "conc-1 ITL intercept in the vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in "
               "vLLM' (2026-04-22, v0.19.1, one H100)")


def calibrate(*argv: str) -> None:
    cmd = [sys.executable, "-m", "kvsim", "calibrate", *argv]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr}")
    print(proc.stdout.splitlines()[-2])


def vllm(gpu: str, vidur_gpu: str, tmp: Path) -> dict:
    mlp = sorted(str(p) for p in (VIDUR / "compute" / vidur_gpu).glob("*/*/mlp.csv"))
    allreduce = str(VIDUR / "network" / f"{vidur_gpu}_dgx" / "all_reduce.csv")
    gemm = tmp / f"{gpu}-gemm.json"
    # Vidur's small all-reduce messages scatter (7-40 us for the same size): slices of them miss by
    # 20-30%, so this build allows 15% where the default is 10%.
    calibrate(*mlp, allreduce, "--only", "gemm,allreduce", "--start", str(PUBLIC), "--max-error", "0.15",
              "--gpu", gpu, "--engine", "vLLM V1 (v0.11.0)", "-o", str(gemm))
    return json.loads(gemm.read_text())


def solve_graph_overhead(doc: dict) -> float:
    """The graph_step_overhead_s that prices the blog's zero-context decode step at its ITL intercept."""
    from kvsim.batch import Batch
    from kvsim.perf.calibration import Calibration
    from kvsim.perf.roofline import StepModel
    from kvsim.scenario.catalog import GPUS, MODELS

    cal = Calibration(**{**doc["coefficients"], "graph_step_overhead_s": 0.0})
    sm = StepModel(MODELS["Llama-3.1-8B"], GPUS["H100-SXM"], 1, "auto", cal)
    rest = sm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=1))
    if rest >= BLOG_ITL_INTERCEPT_S:
        raise SystemExit(f"the fitted model already prices the step at {rest * 1e3:.2f} ms")
    return BLOG_ITL_INTERCEPT_S - rest


def finish(doc: dict, gpu: str, overhead: float, overhead_source: str) -> dict:
    doc = dict(doc, gpu=gpu, engine="vLLM V1 (v0.11.0)", written_by="kvsim calibrate")
    doc["coefficients"] = dict(doc["coefficients"], graph_step_overhead_s=overhead, step_overhead_s=overhead)
    vidur = "Vidur's public profiles (microsoft/vidur 7d47513, data/profiling/"
    prov = {k: v.replace(str(VIDUR) + "/", vidur).replace("mlp.csv,", "mlp.csv),").replace("all_reduce.csv", "all_reduce.csv)")
            for k, v in doc["provenance"].items()}
    prov["graph_step_overhead_s"] = overhead_source
    prov["step_overhead_s"] = ("no public figure for a prefill or mixed (piecewise-graph) step: the decode step's "
                               "fixed cost, " + overhead_source)
    doc["provenance"] = prov
    doc["description"] = ("vLLM V1 on this GPU: GEMM and all-reduce coefficients fitted to Vidur's public operator "
                          "profiles, the rest from public vLLM figures (see provenance)")
    return doc


TRITON_ENGINE = "kvsim triton engine (backends/triton_engine), random weights, torch 2.11 / triton 3.6"
# Host-side coefficients: what the CPU does around the GPU's work (launches, Python, CUDA-graph replay).
HOST_SIDE = ("graph_step_overhead_s,step_overhead_s,eager_layer_s,eager_attention_s,eager_quantized_s,"
             "per_seq_overhead_s")


def triton(tmp: Path) -> None:
    grid, serving = "benchmarks/results/h100_profile.csv", "benchmarks/results/h100_profile_serving.csv"
    first = tmp / "triton-grid.json"
    calibrate(grid, "--gpu", "H100-SXM", "--engine", TRITON_ENGINE, "-o", str(first))
    calibrate(grid, serving, "--start", str(first), "--per-table", HOST_SIDE, "--gpu", "H100-SXM", "--engine",
              TRITON_ENGINE, "-o", str(OUT / "H100-SXM-triton.json"))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        triton(Path(tmp))
        h100 = vllm("H100-SXM", "h100", Path(tmp))
        a100 = vllm("A100-80GB", "a100", Path(tmp))
    overhead = solve_graph_overhead(h100)
    h100 = finish(h100, "H100-SXM", overhead, BLOG_SOURCE)
    a100 = finish(a100, "A100-80GB", overhead, "H100-SXM's (host-side cost, no public A100 ITL found): " + BLOG_SOURCE)
    h200 = dict(h100, gpu="H200", description="vLLM V1 on an H200: H100-SXM's coefficients (same compute die; "
                "the GpuSpec carries the H200's bandwidth)",
                provenance={k: f"H100-SXM's: {v}" for k, v in h100["provenance"].items()})
    for name, doc in (("H100-SXM", h100), ("A100-80GB", a100), ("H200", h200)):
        (OUT / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{name}: graph_step_overhead_s = {doc['coefficients']['graph_step_overhead_s'] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
