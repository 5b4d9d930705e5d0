"""The triton engine's decode step time at Llama-3.1-8B shapes, against the memory roofline floor.

On a GPU: build the engine (random weights, KV cache sized by profiling the device, CUDA graphs for
decode batches up to 64), prefill 64 sequences of 1k-2k tokens in chunks of max_num_batched_tokens,
then time decode steps at batch 1, 16 and 64, with and without CUDA graphs, the way the backend
times a step (host preparation + device work, synchronized). The floor of a decode step is the bytes
it must read, every weight matrix once plus the KV of every context token, over the device-to-device
copy bandwidth measured here. Run `python benchmarks/gpu_engine.py --out benchmarks/results/h100_engine.md`;
`run_engine_section(out)` writes the same markdown to any text stream (for benchmarks/gpu_kernels.py).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

MODEL, BATCH, CTX = "Llama-3.1-8B", 64, (1024, 2048)
BATCH_SIZES, STEPS, WARMUP = (1, 16, 64), 30, 5
GiB = float(1 << 30)


def copy_bandwidth(torch, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) / 1e3)


def make_runner(spec):
    from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig

    cfg = RunnerConfig(block_size=16, max_num_seqs=BATCH, max_num_batched_tokens=8192, max_model_len=4096,
                       kv_cache_dtype="auto", gpu_memory_utilization=0.9, device="cuda:0")
    return ModelRunner(spec, cfg)


def make_sequences(runner, rng) -> list:
    from kvsim.sequence import Request, Sequence

    lens = rng.integers(CTX[0], CTX[1] + 1, BATCH)
    per_seq = -(-(CTX[1] + len(BATCH_SIZES) * 2 * (STEPS + WARMUP + 2)) // runner.block_size)
    pool = rng.permutation(runner.num_blocks)[:BATCH * per_seq]
    seqs = []
    for i, n in enumerate(lens):
        seq = Sequence(Request(i, 0.0, int(n), 1 << 20))
        seq.block_table = pool[i * per_seq:(i + 1) * per_seq].tolist()  # scrambled, room to decode
        seqs.append(seq)
    return seqs


def advance(seqs, counts, out) -> None:
    """What Scheduler.postprocess does after a step."""
    sampled = set(out.seq_ids)
    for s, n in zip(seqs, counts):
        s.num_computed_tokens += n
        if s.seq_id in sampled:
            s.num_output_tokens += 1
            s.num_tokens += 1


def prefill(torch, runner, seqs, budget: int) -> tuple[float, int]:
    """Chunked prefill of every prompt, `budget` tokens a step; returns (seconds, tokens) after the first step."""
    total_s, total_tok, first = 0.0, 0, True
    while any(s.num_computed_tokens < s.prompt_len for s in seqs):
        work, left = [], budget
        for s in seqs:
            n = min(s.prompt_len - s.num_computed_tokens, left)
            if n > 0:
                work.append((s, n))
                left -= n
        t0 = time.perf_counter()
        out = runner.execute_model([s for s, _ in work], [n for _, n in work])
        torch.cuda.synchronize()
        if not first:  # the first step compiles the prefill kernels
            total_s += time.perf_counter() - t0
            total_tok += sum(n for _, n in work)
        first = False
        advance([s for s, _ in work], [n for _, n in work], out)
    return total_s, total_tok


def decode_times(torch, runner, seqs, eager: bool) -> list[float]:
    times = []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        out = runner.execute_model(seqs, [1] * len(seqs), with_logits=eager)  # logits: the eager path
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
        advance(seqs, [1] * len(seqs), out)
    return times


def graph_agreement(runner, seqs) -> float:
    """Share of equal greedy tokens when the same decode step runs eager and then as a graph (its KV
    writes are the same values at the same slots, so repeating the step is harmless)."""
    eager = runner.execute_model(seqs, [1] * len(seqs), with_logits=True).token_ids
    graph = runner.execute_model(seqs, [1] * len(seqs)).token_ids
    return float(np.mean(np.equal(eager, graph)))


def floor_seconds(runner, spec, seqs, bandwidth: float) -> float:
    """Weights read by a decode step (all but the embedding gather) plus the KV of every context token."""
    from kvsim.backends.triton_engine.runner import bytes_of

    embed = runner.model.embed_tokens
    weights = runner.model.weight_bytes - (0 if spec.tie_word_embeddings else embed.numel() * embed.element_size())
    per_token = bytes_of(runner.kv_caches) / (runner.num_blocks * runner.block_size)
    kv = sum(s.num_computed_tokens + 1 for s in seqs) * per_token
    return (weights + kv) / bandwidth


def analytic_blocks(spec) -> int:
    from kvsim.perf.memory import compute_capacity
    from kvsim.scenario.catalog import GPUS
    from kvsim.scenario.config import scenario_from_dict

    sc = scenario_from_dict({"model": {"name": MODEL}, "policies": [{"name": "paged"}],
                             "engine": {"max_num_seqs": BATCH, "max_model_len": 4096},
                             "workload": {"num_requests": 1}}, "<bench>")
    return compute_capacity(sc, sc.policies[0], spec, GPUS["H100-SXM"]).num_blocks


def run_engine_section(out) -> dict:
    """Run the benchmark and write its markdown section to the text stream `out`; returns the numbers."""
    import torch

    from kvsim.scenario.catalog import MODELS

    spec = MODELS[MODEL]
    bw = copy_bandwidth(torch)
    t0 = time.perf_counter()
    runner = make_runner(spec)
    build_s = time.perf_counter() - t0
    prof = runner.profile
    seqs = make_sequences(runner, np.random.default_rng(0))
    pre_s, pre_tok = prefill(torch, runner, seqs, runner.cfg.max_num_batched_tokens)
    agree = graph_agreement(runner, seqs)
    rows = []
    for b in BATCH_SIZES:
        for eager in (False, True):
            sub = seqs[:b]
            floor = floor_seconds(runner, spec, sub, bw)
            times = decode_times(torch, runner, sub, eager)
            med = statistics.median(times)
            q = np.percentile(times, [10, 90])
            ctx = statistics.mean(s.num_computed_tokens for s in sub)
            rows.append((b, ctx, "eager" if eager else "CUDA graph", med, q, b / med, floor, floor / med))
    prep = []
    for _ in range(20):
        t0 = time.perf_counter()
        runner.prepare(seqs, [1] * BATCH)
        prep.append(time.perf_counter() - t0)

    w = out.write
    w(f"## Engine decode step: {MODEL} shapes, random weights, {torch.cuda.get_device_name()}\n\n")
    w(f"Paged bf16 KV, block 16, scrambled block ids; contexts {CTX[0]}-{CTX[1]} tokens; median of {STEPS} steps "
      f"after {WARMUP} warm-up; a step = host preparation + device work, synchronized (as the backend times it). "
      f"Floor = (weight bytes + KV bytes read) / copy bandwidth {bw / 1e12:.2f} TB/s (read + write, measured).\n\n")
    w("| batch | mean context | mode | step ms | p10-p90 ms | tokens/s | floor ms | floor / step |\n")
    w("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
    for b, ctx, mode, med, q, tps, floor, frac in rows:
        w(f"| {b} | {ctx:.0f} | {mode} | {med * 1e3:.2f} | {q[0] * 1e3:.2f}-{q[1] * 1e3:.2f} | {tps:.0f} | "
          f"{floor * 1e3:.2f} | {frac:.0%} |\n")
    w(f"\n- host preparation of a batch-{BATCH} decode step: {statistics.median(prep) * 1e3:.3f} ms (median)\n")
    w(f"- greedy tokens equal between eager and CUDA-graph decode of the same step: {agree:.0%}\n")
    w(f"- chunked prefill, 8192-token steps: {pre_tok / pre_s:,.0f} tokens/s over {pre_tok} tokens\n")
    w(f"- engine build (weights, profiling, {len(runner.graph_sizes)} CUDA graphs): {build_s:.1f} s\n")
    w(f"- KV sizing: {prof.total / GiB:.1f} GiB x {prof.gpu_memory_utilization} - weights {prof.weights / GiB:.2f} - "
      f"activation peak {prof.activation_peak / GiB:.2f} - non-torch {prof.non_torch / GiB:.2f} - other "
      f"{prof.other_torch / GiB:.2f} GiB = {prof.num_blocks} blocks of {prof.bytes_per_block / 2**20:.1f} MiB "
      f"(analytic kvsim.perf.memory for H100-SXM: {analytic_blocks(spec)} blocks)\n")
    return {"rows": rows, "copy_bandwidth": bw, "agreement": agree, "profile": prof}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    buf = io.StringIO()
    run_engine_section(buf)
    print(buf.getvalue())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(buf.getvalue())


if __name__ == "__main__":
    main()
