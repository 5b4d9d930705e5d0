"""Rebuild the kernel tables and server terms shipped in kvsim/perf/kernel_data/.

    python benchmarks/ship_kernel_tables.py [--root ../shared/profiles/aiconfigurator]

- `<gpu>-vllm-<version>.npz`: one per GPU preset and vLLM release that has every table a step needs
  (GEMM, prefill and decode attention, vLLM's all-reduce), converted by kvsim.calibrate.aiconfigurator
  (needs pyarrow) from NVIDIA's Apache-2.0 performance database (ai-dynamo/aiconfigurator, the commit in
  kvsim.calibrate.aiconfigurator.SOURCE_COMMIT); its LICENSE is copied beside the files.
- `<gpu>-server.json`: the terms around the kernels (kvsim.perf.measured.ServerTerms), each with its
  public source; the CUDA-graph step's fixed cost is solved from a public vLLM ITL (H100; the other GPUs
  take H100's, there being no public ITL of theirs here).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.calibrate.aiconfigurator import AIC_GPUS, convert, versions, write_tables  # noqa: E402
from kvsim.perf.kernels import DATA_DIR, shipped_path  # noqa: E402

# vLLM blog "The State of FP8 KV-Cache and Attention Quantization in vLLM" (2026-04-22, vLLM v0.19.1):
# Llama-3.1-8B on one H100, concurrency 1, 128 output tokens: ITL = 6.44 ms + 4.37e-5 ms x input_len (bf16).
BLOG_ITL_INTERCEPT_S = 6.44e-3
API_SERVER_S = (8.4e-3 + 12.0e-3) / 2  # vLLM PR #54628, client minus server TTFT, completions endpoint
BLOG = ("the vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (2026-04-22, v0.19.1, one "
        "H100): Llama-3.1-8B's conc-1 ITL is 6.44 ms + 4.37e-5 ms per input token")
AIC_YAML = "AIConfigurator's system file (aic-core/src/aiconfigurator_core/systems/{gpu}.yaml, commit 095f58a)"
PROVENANCE = {
    "per_seq_overhead_s": "no public figure; the roofline calibration's (kvsim/perf/calibrations/H100-SXM.json: "
                          "assumed equal to kvsim's triton engine, whose numpy input preparation is modelled on vLLM "
                          "V1's persistent batch)",
    "elementwise_kernels_per_layer": "vLLM's LlamaDecoderLayer / Qwen3DecoderLayer: fused add+RMSNorm before "
                                     "attention and before the MLP, rotary embedding, the KV-cache write "
                                     "(reshape_and_cache_flash), SiLU-and-mul; Qwen3 adds the q/k RMSNorm",
    "elementwise_kernel_s": "mem_empirical_constant_latency = 3 us, " + AIC_YAML + ", as AIConfigurator's "
                            "query_mem_op prices every memory-bound op",
    "elementwise_bandwidth": "mem_bw_empirical_scaling_factor = 0.8, " + AIC_YAML,
    "sampler_bytes_per_vocab": "the roofline's estimate (kvsim/perf/roofline.py LOGITS_BYTES_PER_VOCAB): 16-bit "
                               "logits written and read, an fp32 copy written and read, per sampled row",
    "api_server_s": "10.2 ms: vLLM PR #54628 (vLLM 0.28.1rc1) measured vllm bench serve's client TTFT against "
                    "the server's own vllm:time_to_first_token_seconds, the gap being what the engine's clock "
                    "leaves out (the HTTP request and response, the API server's work around the engine, the "
                    "stream to the client): +8.4 and +12.0 ms with the "
                    "completions endpoint (vllm bench serve's default backend), 10.2 ms their mean (+10.5 to "
                    "+12.2 ms with chat and responses). Measured on an RTX 4070 laptop under WSL2, the one "
                    "public figure found: a server's host may be quicker",
    "async_scheduling": "on by default in the releases these tables cover (vllm-project/vllm#27614 made it the "
                        "default, tracked in #27679; #31998, 2026-01, extends the default to speculative decoding): "
                        "the scheduler prepares step n+1 while the GPU runs step n, so a request arriving during "
                        "step n is first scheduled in step n+2, one step later than with synchronous scheduling",
}


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
    overhead, note = solve_graph_overhead()
    for gpu, stem in AIC_GPUS.items():
        write_terms(gpu, stem, overhead, note)


def solve_graph_overhead() -> tuple[float, str]:
    """The CUDA-graph step's fixed cost that prices the blog's zero-context decode step at its ITL intercept
    with the kernels of the release it ran (0.19), clamped at 0."""
    from dataclasses import replace

    from kvsim.batch import Batch
    from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path
    from kvsim.perf.measured import MeasuredStepModel
    from kvsim.perf.server import ServerTerms, vllm_capture_sizes
    from kvsim.scenario.catalog import GPUS, MODELS

    terms = replace(ServerTerms(), graph_step_overhead_s=0.0, step_overhead_s=0.0)
    sm = MeasuredStepModel(MODELS["Llama-3.1-8B"], GPUS["H100-SXM"], 1, "auto", shipped_path("H100-SXM", "0.19.0"),
                           terms, load_calibration(calibration_path("H100-SXM")), vllm_capture_sizes(1024, 8192))
    kernels = sm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=1))
    solved = BLOG_ITL_INTERCEPT_S - kernels
    note = (f"solved from {BLOG}: its zero-context step is {BLOG_ITL_INTERCEPT_S * 1e3:.2f} ms, the measured kernels "
            f"(vLLM 0.19.0 tables), elementwise and sampler terms price it at {kernels * 1e3:.3f} ms")
    if solved < 0:
        return 0.0, note + f", {-solved * 1e3:.3f} ms above it already: no fixed cost is added (clamped at 0)"
    return solved, note + f": the {solved * 1e3:.3f} ms left is the step's fixed cost"


def write_terms(gpu: str, stem: str, overhead: float, note: str) -> None:
    import json

    from kvsim.perf.server import ServerTerms

    terms = ServerTerms(graph_step_overhead_s=overhead, step_overhead_s=overhead, api_server_s=API_SERVER_S)
    prov = {k: v.format(gpu=stem) for k, v in PROVENANCE.items()}
    own = "" if gpu == "H100-SXM" else "H100-SXM's (no public vLLM ITL of this GPU found; the host is the same " \
                                        "software): "
    prov["graph_step_overhead_s"] = own + note
    prov["step_overhead_s"] = own + "no public figure for a piecewise-graph or eager step: the decode step's, " + note
    doc = {"gpu": gpu, "description": "What a vLLM step costs beyond its measured kernels, and the server around "
           "the engine (kvsim.perf.measured.ServerTerms)", "terms": terms.to_dict(),
           "provenance": {k: prov[k] for k in terms.to_dict()}}
    path = DATA_DIR / f"{stem}-server.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{path.relative_to(ROOT)}: graph_step_overhead_s = {overhead * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
