"""Rebuild the kernel tables and server terms shipped in kvsim/perf/kernel_data/.

    python benchmarks/ship_kernel_tables.py [--root ../shared/profiles/aiconfigurator] [--terms-only]

- `<gpu>-vllm-<version>.npz`: one per GPU preset and vLLM release that has every table a step needs
  (GEMM, prefill and decode attention, vLLM's all-reduce), converted by kvsim.calibrate.aiconfigurator
  (needs pyarrow) from NVIDIA's Apache-2.0 performance database (ai-dynamo/aiconfigurator, the commit in
  kvsim.calibrate.aiconfigurator.SOURCE_COMMIT); its LICENSE is copied beside the files.
- `<gpu>-server.json`: the terms around the kernels (kvsim.perf.measured.ServerTerms), each with its
  public source; the CUDA-graph step's fixed cost is solved from a public vLLM ITL (H100; the other GPUs
  take H100's, there being no public ITL of theirs here). The terms fitted to real vLLM serving runs
  (`api_server_s`, `piecewise_layer_s`: benchmarks/serving_groundtruth.py fit, its results in
  benchmarks/results/serving_groundtruth.json) go in per release of the kernel tables they were fitted
  with ("releases"), with their hold-out errors; the newest release's fit is the file's own. GPUs
  without serving runs of their own take H100-SXM's fit, labelled estimated ("fitted_on").
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.calibrate.aiconfigurator import AIC_GPUS, convert, versions, write_tables  # noqa: E402
from kvsim.perf.kernels import DATA_DIR, shipped_path, shipped_versions  # noqa: E402

# vLLM blog "The State of FP8 KV-Cache and Attention Quantization in vLLM" (2026-04-22, vLLM v0.19.1):
# Llama-3.1-8B on one H100, concurrency 1, 128 output tokens: ITL = 6.44 ms + 4.37e-5 ms x input_len (bf16).
BLOG_ITL_INTERCEPT_S = 6.44e-3
API_SERVER_S = (8.4e-3 + 12.0e-3) / 2  # vLLM PR #54628, client minus server TTFT, completions endpoint
# vLLM's nightly latency test on H100 (8 prompts of 32 tokens, 128 output tokens, Llama-3.1-8B, builds of
# mid-2024: synchronous scheduling): mean end-to-end 997.542 ms (buildkite.com/vllm/performance-benchmark
# build 9555).
CI_LATENCY_S, CI_BATCH, CI_PROMPT, CI_STEPS = 0.997542, 8, 32, 128
CI_LATENCY_70B_TP4_S = 2.44447  # the same test, Llama-3.1-70B on 4 H100s
# vllm-project/vllm#46112 (2026-06): Scheduler.update_from_output takes 0.287 ms for a decode batch of 256
UPDATE_FROM_OUTPUT_S_PER_SEQ = 0.287e-3 / 256
BLOG = ("the vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (2026-04-22, v0.19.1, one "
        "H100): Llama-3.1-8B's conc-1 ITL is 6.44 ms + 4.37e-5 ms per input token")
AIC_YAML = "AIConfigurator's system file (aic-core/src/aiconfigurator_core/systems/{gpu}.yaml, commit 095f58a)"
PROVENANCE = {
    "host_step_s": "the engine's CPU work a step (schedule, prepare inputs, launch the graph, logits and sampler, "
                   "process outputs), {host}. An upper bound for the releases the tables cover, whose async "
                   "scheduling overlaps it with the GPU's work (vllm-project/vllm#23569, 'Fully overlap model "
                   "execution': input preparation and sampling off the critical path): a step takes the longer "
                   "of the two",
    "host_tp_step_s": "the engine's CPU work a step more under tensor parallelism (the step's inputs to the "
                      "workers, their outputs back), {host_tp}; overlapped with the GPU's work under async "
                      "scheduling like host_step_s",
    "host_per_seq_s": "3.3 us per scheduled sequence: Scheduler.update_from_output 1.12 us (vllm-project/vllm#46112, "
                      "2026-06: 0.287 ms for a decode batch of 256), schedule() and the model runner's input "
                      "preparation assumed as much each (no public per-sequence figure found)",
    "elementwise_kernels_per_layer": "vLLM's LlamaDecoderLayer / Qwen3DecoderLayer: fused add+RMSNorm before "
                                     "attention and before the MLP, rotary embedding, the KV-cache write "
                                     "(reshape_and_cache_flash), SiLU-and-mul; Qwen3 adds the q/k RMSNorm",
    "elementwise_kernel_s": "mem_empirical_constant_latency = 3 us, " + AIC_YAML + ", as AIConfigurator's "
                            "query_mem_op prices every memory-bound op",
    "elementwise_bandwidth": "mem_bw_empirical_scaling_factor = 0.8, " + AIC_YAML,
    "piecewise_layer_s": "0: a step outside a full CUDA graph is priced by its kernels and step_overhead_s alone "
                         "(no serving data fitted yet)",
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
    ap.add_argument("--terms-only", action="store_true", help="rewrite the <gpu>-server.json files only")
    args = ap.parse_args()
    DATA_DIR.mkdir(exist_ok=True)
    if not args.terms_only:
        shutil.copyfile(args.root / "LICENSE", DATA_DIR / "LICENSE")
    for gpu, stem in AIC_GPUS.items():
        for version in [] if args.terms_only else versions(args.root, stem):
            arrays, meta = convert(args.root, gpu, version)
            out = DATA_DIR / f"{stem}-vllm-{version}.npz"
            write_tables(out, arrays, meta)
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1024:.0f} KiB")
    overhead, note = solve_graph_overhead()
    host, host_note = solve_host_step()
    host_tp, host_tp_note = solve_host_step("Llama-3.1-70B", 4, CI_LATENCY_70B_TP4_S, host)
    for gpu, stem in AIC_GPUS.items():
        write_terms(gpu, stem, overhead, note, (host, host_tp), (host_note, host_tp_note))


def solve_graph_overhead() -> tuple[float, str]:
    """The CUDA-graph step's fixed cost that prices the blog's zero-context decode step at its ITL intercept
    with the kernels of the release it ran (0.19), clamped at 0."""
    from dataclasses import replace

    from kvsim.batch import Batch
    from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path
    from kvsim.perf.measured import MeasuredStepModel
    from kvsim.perf.server import ServerTerms, vllm_capture_sizes
    from kvsim.scenario.catalog import GPUS, MODELS

    terms = replace(ServerTerms(), graph_step_overhead_s=0.0, step_overhead_s=0.0, host_step_s=0.0)
    sm = MeasuredStepModel(MODELS["Llama-3.1-8B"], GPUS["H100-SXM"], 1, "auto", shipped_path("H100-SXM", "0.19.0"),
                           terms, load_calibration(calibration_path("H100-SXM")), vllm_capture_sizes(1024, 8192))
    kernels = sm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=1))
    solved = BLOG_ITL_INTERCEPT_S - kernels
    note = (f"solved from {BLOG}: its zero-context step is {BLOG_ITL_INTERCEPT_S * 1e3:.2f} ms, the measured kernels "
            f"(vLLM 0.19.0 tables), elementwise and sampler terms price it at {kernels * 1e3:.3f} ms")
    if solved < 0:
        return 0.0, note + f", {-solved * 1e3:.3f} ms above it already: no fixed cost is added (clamped at 0)"
    return solved, note + f": the {solved * 1e3:.3f} ms left is the step's fixed cost"


def solve_host_step(model: str = "Llama-3.1-8B", tp: int = 1, latency_s: float = CI_LATENCY_S,
                    host_step_s: float = 0.0) -> tuple[float, str]:
    """The host's seconds a step (beyond `host_step_s`) that price vLLM's CI latency test (synchronous
    scheduling: the host's work adds to the GPU's) at its published mean, with the newest H100 kernels."""
    from dataclasses import replace

    from kvsim.batch import Batch, DecodeShape
    from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path
    from kvsim.perf.measured import MeasuredStepModel
    from kvsim.perf.server import ServerTerms, vllm_capture_sizes
    from kvsim.scenario.catalog import GPUS, MODELS

    version = shipped_versions("H100-SXM")[-1]
    sm = MeasuredStepModel(MODELS[model], GPUS["H100-SXM"], tp, "auto", shipped_path("H100-SXM", version),
                           replace(ServerTerms(), host_step_s=host_step_s, host_tp_step_s=0.0),
                           load_calibration(calibration_path("H100-SXM")), vllm_capture_sizes(1024, 8192),
                           async_scheduling=False)
    n, p = CI_BATCH, CI_PROMPT
    prefill = sm.step_time(Batch(num_prefill_seqs=n, num_prefill_tokens=n * p, prefill_attn_pairs=n * p * (p + 1) // 2))
    total = prefill + sm.decode_run_time(DecodeShape(n, n * (p + 1)), CI_STEPS - 1)
    host = (latency_s - total) / CI_STEPS
    priced = "kernels" if not host_step_s else f"kernels and {host_step_s * 1e3:.2f} ms of host_step_s a step"
    return host, (f"{host * 1e3:.2f} ms, solved from vLLM's nightly latency test on H100 ({model}, TP {tp}, {n} x "
                  f"({p} in / {CI_STEPS} out), build 9555, mid-2024, synchronous scheduling): "
                  f"{latency_s * 1e3:.1f} ms measured against {total * 1e3:.1f} ms of vLLM {version} {priced} "
                  f"for its {CI_STEPS} steps")


SERVING_FIT = ROOT / "benchmarks" / "results" / "serving_groundtruth.json"
FIT_GPU = "H100-SXM"  # the GPU of the serving runs in ../shared/groundtruth
RUNS_NOTE = ("9 experiments, 15 load stages of llm-d inference-perf against vllm serve on H100-SXM, early 2026: "
             "Llama-2-7B TP1, CodeLlama-34B TP2, Llama-2-70B TP4, 5-20 req/s, 100 shared-prefix prompts re-sent, "
             "../shared/groundtruth/inference_perf_h100")
WHAT = {"api_server_s": "the API server on every request's TTFT and E2E (HTTP, tokenizing, the stream to the client)",
        "piecewise_layer_s": "a step outside a full CUDA graph, per layer, beyond its kernels (vLLM V1's "
                             "cudagraph_mode FULL_AND_PIECEWISE, the default since v0.11: a mixed prefill + decode "
                             "step replays piecewise graphs, attention run eagerly between them; "
                             "docs.vllm.ai/en/latest/design/cuda_graphs); chosen over a fixed cost per piecewise "
                             "step, a cost per scheduled sequence and a full-graph step's cost, each of which "
                             "predicted the held-out experiments worse (the term selection in "
                             "benchmarks/results/serving_groundtruth.md)"}


def fitted_releases(gpu: str) -> dict:
    """{release: {"terms", "provenance"}} of the serving fits (benchmarks/results/serving_groundtruth.json)."""
    import json

    if not SERVING_FIT.exists():
        return {}
    fits = json.loads(SERVING_FIT.read_text()).get("fits", {})
    out = {}
    for version, fit in sorted(fits.items()):
        loeo = fit["leave_one_experiment_out"]["summary"]
        terms, prov = {}, {}
        for n in fit["terms_fitted"]:
            held = [t[n] for t in fit["holdout_terms"].values()]
            terms[n] = round(fit["terms"][n], 7)
            moved = "TTFT" if n == "api_server_s" else "TPOT"
            prov[n] = (f"{WHAT[n]}: {terms[n] * 1e3:.3g} ms, fitted by kvsim.calibrate.server_fit (with "
                       f"{', '.join(fit['terms_fitted'])}) with vLLM {version}'s kernel tables to {RUNS_NOTE}; fitted "
                       f"without each experiment in turn {min(held) * 1e3:.3g} … {max(held) * 1e3:.3g} ms; each "
                       f"experiment predicted by the fit to the other eight: {moved} median |error| "
                       f"{loeo[moved.lower() + '_median_abs_error']:.1%} (signed, the median of the stages' means "
                       f"{loeo[moved.lower() + '_signed_median_of_stage_means']:+.1%}), "
                       f"{loeo['median_abs_error_all']:.1%} over TTFT/TPOT/E2E (benchmarks/serving_groundtruth.py)")
            if gpu != FIT_GPU:
                prov[n] = f"{FIT_GPU}'s fit, estimated for {gpu} (no serving runs of this GPU): " + prov[n]
        out[version] = {"terms": terms, "provenance": prov}
    return out


def write_terms(gpu: str, stem: str, overhead: float, note: str, hosts: tuple, notes: tuple) -> None:
    import json
    from dataclasses import replace

    from kvsim.perf.kernels import version_key
    from kvsim.perf.server import ServerTerms

    terms = ServerTerms(graph_step_overhead_s=overhead, step_overhead_s=overhead, api_server_s=API_SERVER_S,
                        host_step_s=round(hosts[0], 6), host_tp_step_s=round(max(hosts[1], 0.0), 6))
    prov = {k: v.format(gpu=stem, host=notes[0], host_tp=notes[1]) for k, v in PROVENANCE.items()}
    own = "" if gpu == "H100-SXM" else "H100-SXM's (no public vLLM ITL of this GPU found; the host is the same " \
                                        "software): "
    prov["graph_step_overhead_s"] = own + note
    prov["step_overhead_s"] = own + "no public figure for a piecewise-graph or eager step: the decode step's, " + note
    releases = fitted_releases(gpu)
    if releases:  # the newest release's fit is the file's own
        newest = releases[max(releases, key=version_key)]
        terms = replace(terms, **newest["terms"])
        prov.update(newest["provenance"])
    doc = {"gpu": gpu, "description": "What a vLLM step costs beyond its measured kernels, and the server around "
           "the engine (kvsim.perf.measured.ServerTerms)", "terms": terms.to_dict(),
           "provenance": {k: prov[k] for k in terms.to_dict()}}
    if releases:
        doc["fitted_on"] = FIT_GPU
        doc["releases"] = releases
    path = DATA_DIR / f"{stem}-server.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{path.relative_to(ROOT)}: graph_step_overhead_s = {overhead * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
