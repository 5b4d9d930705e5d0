"""Simulated KV capacity and concurrency against benchmarks/results/kv_capacity.md: the hybrid
allocator's blocks and the sequences it holds at once, for every model of that table whose KV cache
groups differ from one group of every layer (sliding windows), beside a dense one.

    python benchmarks/kv_capacity_sim.py       # a minute or two; writes benchmarks/results/kv_capacity_sim.md

Each deployment is the table's (`vllm serve` defaults, max_model_len as there), serving requests of
8,192 tokens (6,144 prompt, 2,048 output: long enough for the running batch to fill the cache) that all
arrive at once, with max_num_seqs 1024 so that only the KV cache limits them. Reported: the KV tokens the
simulated cache holds (blocks per group x block size, vLLM's logged "GPU KV cache size") against the
table's, and the most sequences the simulation ran at once against the table's sequences at 8k (vLLM's
maximum concurrency, each request reserving its peak, and those past their prefill: what a cache that
frees its windows holds while decoding) and the decoding figure at 6k. The running sequences decode
at lengths between 6k and 8k, and those mid-prefill hold a whole chunk of a sliding window's blocks
until their next step frees it, so the peak must lie between vLLM's concurrency at 8k (each request at
its peak) and the decoding figure at 6k (plus one, a sequence admitted mid-prefill).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kv_capacity import DEPLOYMENTS, row  # noqa: E402

from kvsim.pipeline import run_scenario  # noqa: E402
from kvsim.scenario.catalog import MODELS  # noqa: E402
from kvsim.scenario.config import scenario_from_dict  # noqa: E402

LENGTH, OUTPUT, SHORT = 8192, 2048, 6144
CHOSEN = ("Llama-3.1-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "gpt-oss-120b", "gemma-2-9b", "gemma-2-27b", "gemma-3-27b")


def simulate(name: str, gpu: str, tp: int, requests: int) -> dict:
    model = MODELS[name]
    max_len = min(model.max_position_embeddings, 131072)
    sc = scenario_from_dict({
        "model": {"name": name}, "hardware": {"gpu": gpu, "tensor_parallel_size": tp},
        "engine": {"max_model_len": max_len, "max_num_seqs": 1024}, "policies": [{"name": "paged"}],
        "workload": {"num_requests": requests, "arrival": {"process": "deterministic", "rate": 10000.0},
                     "prompt_len": {"dist": "fixed", "value": LENGTH - OUTPUT},
                     "output_len": {"dist": "fixed", "value": OUTPUT}},
        "output": {"report_html": False}}, source="benchmarks/kv_capacity_sim.py")
    s = run_scenario(sc, write=False).summaries["paged"]
    from kvsim.perf.memory import compute_capacity, policy_layout
    from kvsim.scenario.catalog import GPUS

    pol = sc.policies[0]
    cap, layout = compute_capacity(sc, pol, model, GPUS[gpu]), policy_layout(sc, pol, model, GPUS[gpu])
    return {"blocks": s["kv"]["num_blocks_per_replica"], "peak_running": s["peak_running"],
            "finished": s["requests"]["finished"], "decoding_short": cap.num_blocks // layout.blocks_held(SHORT)}


def main() -> None:
    lines = ["| model | GPUs | KV tokens: table / simulated | seqs @ 8k: vLLM concurrency / decoding (table) | "
             "decoding @ 6k | simulated peak running | within |", "|" + " --- |" * 7]
    for name, gpu, tp in DEPLOYMENTS:
        if name not in CHOSEN:
            continue
        ref = row(name, gpu, tp)
        vllm, decoding, _ = ref["seqs"][LENGTH]
        sim = simulate(name, gpu, tp, requests=min(2 * decoding + 16, 1000))
        groups = int(ref["groups"].split("x")[0])
        tokens = sim["blocks"] // groups * ref["block"]
        ok = tokens == ref["tokens"] and vllm <= sim["peak_running"] <= sim["decoding_short"] + 1
        lines.append(f"| {name} | {tp}x {gpu} | {ref['tokens']:,} / {tokens:,} | {vllm:,} / {decoding:,} | "
                     f"{sim['decoding_short']:,} | {sim['peak_running']:,} | {'yes' if ok else 'NO'} |")
        print(lines[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / "kv_capacity_sim.md"
    out.write_text("# Simulated KV capacity and concurrency against kv_capacity.md\n\n`python benchmarks/"
                   "kv_capacity_sim.py` (see its docstring for the workload).\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
