"""Speculative decoding against a published serving result: SpecDecode-Bench on Llama-3.1-8B, one H100.

    python benchmarks/spec_decode_bench.py            # writes benchmarks/results/spec_decode_bench.{md,json}

The published result: "Speculative Decoding: Performance or Illusion?" (Liu, Yu, Park, Stoica, Cheung;
arXiv 2601.11580; specdecode-bench.github.io, Figure 1): vLLM v0.10.1 with its production defaults
(continuous batching, chunked prefill, CUDA graphs) on one H100 80GB serving Llama-3.1-8B-Instruct, k = 3
draft tokens, token throughput with speculation over without at batch sizes 1, 16, 64 and 128. The
speedups below are read off Figure 1 (a) GSM8K and (c) ShareGPT (about +-0.02).

kvsim's setup: the same model, GPU and k, steps priced by vLLM 0.14.0's kernel tables (the shipped
release nearest v0.10.1); the batch is B clients each sending its next request as the last one ends
(every request ready at once, a closed loop: vLLM holds B running); acceptance from the same study's
per-position traces (kvsim.perf.acceptance: EAGLE's and n-gram's presets for the dataset, k = 3); prompt
and output lengths lognormal, fitted to the study's samples (ShareGPT 310 requests: prompts mean 355,
median 182; outputs mean 728, median 572; GSM8K 300: prompts mean 94, outputs mean 166, median 162).
Throughput is output tokens per second over the arrival window (the steady state, without the drain).
The EAGLE head is yuhuili/EAGLE-LLaMA3-Instruct-8B's shape (one Llama layer, the target's lm_head); the
study's EAGLE-3 has no per-position traces, so it is not simulated here.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCHES = (1, 16, 64, 128)
# Figure 1 of specdecode-bench.github.io (read off the plot): dataset -> method -> speedup per batch size
PUBLISHED = {
    "sharegpt": {"eagle": (1.67, 1.66, 1.53, 1.29), "ngram": (1.27, 1.25, 1.19, 1.11), "eagle3": (1.71, 1.68, 1.55, 1.29)},
    "gsm8k": {"eagle": (1.73, 1.68, 1.47, 1.22), "ngram": (1.17, 1.15, 1.10, 1.05), "eagle3": (1.74, 1.70, 1.48, 1.21)},
}


def lognormal(mean: float, median: float) -> tuple[float, float]:
    """(mean, sigma) of kvsim's lognormal from a sample's mean and median: sigma^2 = 2 ln(mean / median)."""
    return mean, math.sqrt(2 * math.log(mean / median))


LENGTHS = {"sharegpt": (lognormal(355, 182), lognormal(728, 572)), "gsm8k": ((94, 0.3), lognormal(166, 162))}

SCENARIO = """
name = "sdb"
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100-SXM"
[engine]
max_model_len = 16384
vllm_version = "0.14.0"
[[policies]]
name = "plain"
speculative = false
[[policies]]
name = "spec"
[speculative]
method = "{method}"
num_speculative_tokens = 3
dataset = "{dataset}"
[workload]
seed = 11
num_requests = {n}
max_concurrency = {batch}
arrival = {{ process = "immediate" }}
prompt_len = {{ dist = "lognormal", mean = {pm}, sigma = {ps:.4f}, max = 8000 }}
output_len = {{ dist = "lognormal", mean = {om}, sigma = {os:.4f}, min = 8, max = 8000 }}
[output]
report_html = false
"""


def point(dataset: str, method: str, batch: int) -> dict:
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import scenario_from_toml

    (pm, ps), (om, os_) = LENGTHS[dataset]
    n = max(48, 8 * batch)
    text = SCENARIO.format(method=method, dataset=dataset, batch=batch, n=n, pm=pm, ps=ps, om=om, os=os_)
    s = run_scenario(scenario_from_toml(text, "<sdb>", ROOT), write=False).summaries
    tput = {k: v["arrivals"]["output_tokens_per_s"] for k, v in s.items()}
    return {"dataset": dataset, "method": method, "batch": batch, "requests": n,
            "plain_tokens_per_s": tput["plain"], "spec_tokens_per_s": tput["spec"],
            "speedup": tput["spec"] / tput["plain"],
            "mean_acceptance_length": s["spec"]["speculative"]["mean_acceptance_length"],
            "tpot_ms_plain": s["plain"]["tpot_s"]["mean"] * 1e3, "tpot_ms_spec": s["spec"]["tpot_s"]["mean"] * 1e3,
            "itl_ms_spec": s["spec"]["itl_s"]["mean"] * 1e3}


def main() -> None:
    rows = []
    for dataset in PUBLISHED:
        for method in ("eagle", "ngram"):
            for i, batch in enumerate(BATCHES):
                r = point(dataset, method, batch)
                r["published_speedup"] = PUBLISHED[dataset][method][i]
                r["gap"] = r["speedup"] / r["published_speedup"] - 1
                rows.append(r)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    out = ROOT / "benchmarks" / "results"
    (out / "spec_decode_bench.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| dataset | method (k=3) | batch | kvsim tok/s without | with | kvsim speedup | published speedup | gap | "
             "tokens a step | TPOT ms without / with | ITL ms with |", "|" + " --- |" * 11]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['method']} | {r['batch']} | {r['plain_tokens_per_s']:,.0f} | "
                     f"{r['spec_tokens_per_s']:,.0f} | {r['speedup']:.2f} | {r['published_speedup']:.2f} | {r['gap']:+.0%} | "
                     f"{r['mean_acceptance_length']:.2f} | {r['tpot_ms_plain']:.1f} / {r['tpot_ms_spec']:.1f} | "
                     f"{r['itl_ms_spec']:.1f} |")
    (out / "spec_decode_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
