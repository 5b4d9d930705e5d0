"""GPU benchmark of the Triton KV-cache kernels at Llama-3.1-8B shapes, with correctness checks first.

On one NVIDIA GPU: (1) correctness at real sizes against float64 torch references (decode and
prefill over every KV dtype, split-K on and off, CUDA-graph replay, poisoned outputs); (2) optional
tuning sweeps of the decode tile shape and split count; (3) median times of CUDA-graph replays
(L2 flushed before each) for paged decode against the device's copy bandwidth and against torch
SDPA over a dense cache, quantized speed-ups, store_kvcache bandwidth and prefill TFLOP/s. Block
tables are random permutations (a real paged layout). Run from the repository root:
`python benchmarks/gpu_kernels.py --section all --out benchmarks/results/h100.md`.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kvsim.backends.triton_engine import decode_attention, prefill_attention  # noqa: E402
from kvsim.backends.triton_engine.dense_attention import dense_decode_sdpa  # noqa: E402
from kvsim.backends.triton_engine.kv_quant import (KV_DTYPES, allocate_kv_cache, dequantize_reference,  # noqa: E402
                                             kv_bytes_per_token)
from kvsim.backends.triton_engine.store_kvcache import store_kvcache  # noqa: E402

HQ, HKV, D, BS = 32, 8, 128, 16  # Llama-3.1-8B attention, block_size 16
SCALE = D ** -0.5
BATCHES, CONTEXTS = (1, 8, 32, 64, 128), (1024, 4096, 8192, 16384, 32768)
TUNE_SHAPE = (64, 8192)  # (batch, context) of the decode tile sweep
SPLIT_SHAPES = ((1, 32768), (8, 8192), (8, 32768), (32, 4096), (32, 16384), (128, 4096))
SPLITS = (1, 2, 4, 8, 16, 32)
PREFILL_CASES = ((0, 4096), (8192, 4096))  # (cached prefix, new tokens)
STORE_TOKENS = 65536
QUANT = ("fp8", "int8", "int4")
DEVICE = "cuda"  # "cpu" with TRITON_INTERPRET=1 for a dry run of check_all
TOL = 1e-2  # against attention over the dequantized cache: bf16/fp16 output and operand rounding


def median_ms(fn, budget_ms: float = 60.0) -> float:
    """Median GPU time of fn replayed from a CUDA graph (no launch overhead), L2 flushed before each
    replay; do_bench on eager calls if fn cannot be captured."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return do_bench(fn, warmup=10, rep=budget_ms, return_mode="median")
    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEVICE)
    times = []
    for i in range(1000):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if i >= 10 and sum(times) > budget_ms:
            break
    return statistics.median(times[2:])


def copy_bandwidth(nbytes: int = 1 << 32) -> float:
    """Bytes read + written per second by a large device-to-device copy, launched eagerly: replayed
    from a CUDA graph (probably as a memcpy node) it ran 20% slower, 2438 against 3028 GB/s."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=60, return_mode="median")
    return 2 * nbytes / (ms / 1e3)


# ---- problems ----

def scrambled_tables(num_seqs: int, blocks_per_seq: int) -> torch.Tensor:
    return torch.randperm(num_seqs * blocks_per_seq, device=DEVICE).view(num_seqs, blocks_per_seq).int()


def slots_of(table_row: torch.Tensor, num_tokens: int) -> torch.Tensor:
    pos = torch.arange(num_tokens, device=table_row.device)
    return table_row.long()[pos // BS] * BS + pos % BS


def fill_paged(dense_k, dense_v, tables, context_lens, kv_dtype, num_blocks):
    """A paged cache holding each sequence's first context_lens tokens of dense (seqs, HKV, S, D) K/V."""
    cache = allocate_kv_cache(1, num_blocks, BS, HKV, D, kv_dtype, DEVICE)[0]
    for s, n in enumerate(context_lens):
        store_kvcache(dense_k[s, :, :n].transpose(0, 1), dense_v[s, :, :n].transpose(0, 1), cache,
                      slots_of(tables[s], n))
    return cache


def reference_attention(q, k64, v64, tables, context_lens, q_lens):
    """float64 attention: query i of sequence s at position ctx - q_len + i sees positions [0, it]."""
    out, start = torch.empty(q.shape, dtype=torch.float64, device=q.device), 0
    for s, (ctx, n) in enumerate(zip(context_lens, q_lens)):
        slots = slots_of(tables[s], ctx)
        k = k64.view(-1, HKV, D)[slots].repeat_interleave(HQ // HKV, 1)  # (ctx, HQ, D)
        v = v64.view(-1, HKV, D)[slots].repeat_interleave(HQ // HKV, 1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + n].double(), k) * SCALE
        pos = torch.arange(ctx - n, ctx, device=q.device)
        scores.masked_fill_(torch.arange(ctx, device=q.device)[None, :] > pos[:, None], float("-inf"))
        out[start:start + n] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        start += n
    return out


def rel_err(out, ref) -> float:
    return float("inf") if not torch.isfinite(out).all() else ((out.double() - ref).norm() / ref.norm()).item()


# ---- correctness ----

END_TO_END = {"bfloat16": TOL, "float16": TOL, "fp8": 6e-2, "int8": 1.5e-2, "int4": 0.21}  # as tests/test_kernels.py


def check_all(w, lens=(1, 17, 700, 2049, 4096, 3001), chunks=((0, 1000), (3000, 500), (100, 1), (2048, 2048))) -> bool:
    """Decode (split-K off/on, CUDA-graph replay) and prefill (prefix + chunk) against float64 attention
    over the dequantized cache, and over the unquantized K/V with per-dtype bounds; True when all pass."""
    ok, lens = True, list(lens)
    max_ctx = max(max(lens), max(p + n for p, n in chunks))
    dense_k = torch.randn(len(lens), HKV, max_ctx, D, device=DEVICE, dtype=torch.bfloat16)
    dense_v = torch.randn_like(dense_k)
    tables = scrambled_tables(len(lens), max_ctx // BS + 1)
    ctx_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(len(lens), HQ, D, device=DEVICE, dtype=torch.bfloat16)
    p_lens, q_lens = [p + n for p, n in chunks], [n for _, n in chunks]
    qp = torch.randn(sum(q_lens), HQ, D, device=DEVICE, dtype=torch.bfloat16)
    cu = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).int()
    p_ctx = torch.tensor(p_lens, dtype=torch.int32, device=DEVICE)
    exact = dequantize_reference(fill_paged(dense_k, dense_v, tables, [max_ctx] * len(lens), "bfloat16",
                                            tables.numel()))
    w("| check | kv dtype | rel. error | bound | ok |\n| --- | --- | ---: | ---: | --- |\n")
    for kv_dtype in KV_DTYPES:
        half = kv_dtype == "float16"
        dk, dv, qq, qqp = (t.half() if half else t for t in (dense_k, dense_v, q, qp))
        cache = fill_paged(dk, dv, tables, lens, kv_dtype, tables.numel())
        k64, v64 = dequantize_reference(cache)
        ref = reference_attention(qq, k64, v64, tables, lens, [1] * len(lens))
        results = []
        for splits in (1, 7, None):
            out = torch.full_like(qq, float("nan"))
            decode_attention.paged_decode_attention(qq, cache, tables, ctx_t, SCALE, splits, out=out)
            results.append((f"decode, splits={splits}", rel_err(out, ref), TOL))
        results.append(("decode vs unquantized K/V", rel_err(out, reference_attention(qq, *exact, tables, lens,
                                                                                        [1] * len(lens))),
                        END_TO_END[kv_dtype]))
        if DEVICE == "cuda":
            out, static_q, graph = torch.full_like(qq, float("nan")), qq.clone(), torch.cuda.CUDAGraph()
            decode_attention.paged_decode_attention(static_q, cache, tables, ctx_t, SCALE, 4, out=out)  # compile
            with torch.cuda.graph(graph):
                decode_attention.paged_decode_attention(static_q, cache, tables, ctx_t, SCALE, 4, out=out)
            static_q.copy_(torch.randn_like(qq))
            out.fill_(float("nan"))
            graph.replay()
            results.append(("decode, CUDA graph replay, new q", rel_err(out, reference_attention(
                static_q, k64, v64, tables, lens, [1] * len(lens))), TOL))
        del cache, k64, v64
        cache = fill_paged(dk, dv, tables, p_lens, kv_dtype, tables.numel())
        k64, v64 = dequantize_reference(cache)
        out = torch.full_like(qqp, float("nan"))
        prefill_attention.paged_prefill_attention(qqp, cache, tables, cu, p_ctx, SCALE, max(q_lens), out=out)
        results.append(("prefill, prefix + chunk", rel_err(out, reference_attention(qqp, k64, v64, tables, p_lens,
                                                                                    q_lens)), TOL))
        for name, err, bound in results:
            ok &= err <= bound
            w(f"| {name} | {kv_dtype} | {err:.2e} | {bound:g} | {'yes' if err <= bound else '**NO**'} |\n")
        del cache, k64, v64
    return ok


# ---- timing ----

def dense_sdpa_ms(q4, k, v) -> tuple[float, str]:
    """The fastest torch SDPA backend that takes the problem: (median ms, backend name)."""
    best = (math.inf, "none")
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                dense_decode_sdpa(q4, k, v, SCALE)
                best = min(best, (median_ms(lambda: dense_decode_sdpa(q4, k, v, SCALE)), backend.name.lower()))
        except RuntimeError:  # this backend does not support the shapes or GQA
            continue
    return best


def decode_case(batch, ctx, kv_dtypes, dense: bool, splits=(None,)) -> dict:
    """Median ms of paged decode per (kv dtype, num_splits), and of dense SDPA, on one set of K/V."""
    dense_k = torch.randn(batch, HKV, ctx, D, device=DEVICE, dtype=torch.bfloat16)
    dense_v = torch.randn_like(dense_k)
    q = torch.randn(batch, HQ, D, device=DEVICE, dtype=torch.bfloat16)
    tables = scrambled_tables(batch, ctx // BS)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    times = {}
    if dense:
        q4 = q.unsqueeze(2)
        times["dense"], times["dense_backend"] = dense_sdpa_ms(q4, dense_k, dense_v)
        dense_out = dense_decode_sdpa(q4, dense_k, dense_v, SCALE).squeeze(2)
    for kv_dtype in kv_dtypes:
        cache = fill_paged(dense_k, dense_v, tables, [ctx] * batch, kv_dtype, tables.numel())
        out = torch.empty_like(q)
        for n in splits:
            times[kv_dtype, n] = median_ms(
                lambda c=cache, n=n: decode_attention.paged_decode_attention(q, c, tables, lens, SCALE, n, out=out))
        if dense and kv_dtype == "bfloat16":
            times["paged_vs_dense_err"] = rel_err(out, dense_out.double())
        del cache
    return times


def decode_bytes(batch, ctx, kv_dtype) -> int:
    return batch * ctx * kv_bytes_per_token(HKV, D, kv_dtype) + 2 * batch * HQ * D * 2 + batch * (ctx // BS) * 4


def fits(batch, ctx) -> bool:
    need = 2 * decode_bytes(batch, ctx, "bfloat16") + (1 << 30)
    return need < 0.8 * torch.cuda.mem_get_info()[0]


def tune_decode(w) -> dict:
    """Tile sweep at batch 64 x 8k (no split) per dtype, then a split sweep; returns the best config per dtype."""
    configs = [(32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 4, 3), (128, 4, 4), (128, 8, 3), (256, 8, 3)]
    default = decode_attention._launch_config
    best = {}
    w(f"\n### Decode tile sweep (batch, context {TUNE_SHAPE}, no split): GB/s\n\n| BLOCK_N, warps, stages | "
      + " | ".join(("bfloat16",) + QUANT) + " |\n|---|" + "---:|" * (1 + len(QUANT)) + "\n")
    rows = {c: {} for c in configs}
    for c in configs:
        decode_attention._launch_config = lambda cache, c=c: dict(BLOCK_N=c[0], num_warps=c[1], num_stages=c[2])
        try:
            t = decode_case(*TUNE_SHAPE, ("bfloat16",) + QUANT, dense=False, splits=(1,))
        except Exception as exc:  # a config that does not compile or fit: skip it
            print(f"config {c}: {exc!r}", flush=True)
            t = {}
        for (kv_dtype, _), ms in t.items():
            rows[c][kv_dtype] = decode_bytes(*TUNE_SHAPE, kv_dtype) / ms / 1e6
        w(f"| {c} | " + " | ".join(f"{rows[c].get(k, 0):.0f}" for k in ("bfloat16",) + QUANT) + " |\n")
    for kv_dtype in ("bfloat16",) + QUANT:
        c = max(configs, key=lambda c: rows[c].get(kv_dtype, 0))
        best[kv_dtype] = dict(BLOCK_N=c[0], num_warps=c[1], num_stages=c[2])
    decode_attention._launch_config = lambda cache: best.get(cache.kv_dtype, default(cache))
    w("\n### Split sweep (bf16 and fp8, best tiles): GB/s by num_splits; h = the heuristic's choice\n\n"
      "| batch | context | dtype | h | " + " | ".join(map(str, SPLITS)) + " |\n"
      "|---:|---:|---|---:|" + "---:|" * len(SPLITS) + "\n")
    for batch, ctx in SPLIT_SHAPES:
        h = decode_attention.choose_num_splits(batch, HKV, ctx, torch.device(DEVICE))
        t = decode_case(batch, ctx, ("bfloat16", "fp8"), False, SPLITS)
        for kv_dtype in ("bfloat16", "fp8"):
            gbs = [decode_bytes(batch, ctx, kv_dtype) / t[kv_dtype, n] / 1e6 for n in SPLITS]
            w(f"| {batch} | {ctx} | {kv_dtype} | {h} | " + " | ".join(f"{g:.0f}" for g in gbs) + " |\n")
    return best


def decode_tables(w, bw: float) -> None:
    w(f"\n### Paged decode (Llama-3.1-8B: {HQ} q heads, {HKV} KV heads, head_dim {D}, block {BS}; one layer)\n\n"
      "GB/s counts K/V (+ scales) of every context token, q, out and block tables once; % of copy bandwidth "
      f"{bw / 1e9:.0f} GB/s. dense = torch SDPA (enable_gqa) over a contiguous bf16 cache of the same K/V.\n\n"
      "| batch | context | bf16 ms | GB/s | % copy | dense ms (SDPA backend) | paged / dense "
      "| fp8 x | int8 x | int4 x |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for ctx in CONTEXTS:
        for batch in BATCHES:
            if not fits(batch, ctx):
                w(f"| {batch} | {ctx} | skipped: exceeds memory | | | | | | | |\n")
                continue
            t = decode_case(batch, ctx, ("bfloat16",) + (QUANT if ctx >= 8192 else ()), dense=True)
            bf16 = t["bfloat16", None]
            gbs = decode_bytes(batch, ctx, "bfloat16") / bf16 / 1e6
            sp = [f"{bf16 / t[k, None]:.2f}" if (k, None) in t else "" for k in QUANT]
            w(f"| {batch} | {ctx} | {bf16:.3f} | {gbs:.0f} | {gbs * 1e9 / bw:.0%} | {t['dense']:.3f} "
              f"({t['dense_backend']}) | {bf16 / t['dense']:.2f} | " + " | ".join(sp) + " |\n")
            if t.get("paged_vs_dense_err", 0) > TOL:
                w(f"| | | **paged vs dense output error {t['paged_vs_dense_err']:.2e}** | | | | | | | |\n")


def store_table(w) -> None:
    num_tokens = STORE_TOKENS
    w(f"\n### store_kvcache ({num_tokens} tokens x {HKV} heads x {D}, block-scrambled slots): GB/s read + written\n\n"
      "| kv dtype | ms | GB/s |\n|---|---:|---:|\n")
    key = torch.randn(num_tokens, HKV, D, device=DEVICE, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    tables = scrambled_tables(1, num_tokens // BS)
    slots = slots_of(tables[0], num_tokens)
    for kv_dtype in KV_DTYPES:
        k, v = (key.half(), value.half()) if kv_dtype == "float16" else (key, value)
        cache = allocate_kv_cache(1, tables.numel(), BS, HKV, D, kv_dtype, DEVICE)[0]
        ms = median_ms(lambda: store_kvcache(k, v, cache, slots))
        nbytes = 2 * key.numel() * 2 + num_tokens * kv_bytes_per_token(HKV, D, kv_dtype) + slots.numel() * 8
        w(f"| {kv_dtype} | {ms:.3f} | {nbytes / ms / 1e6:.0f} |\n")


def prefill_table(w, tune: bool) -> None:
    w("\n### Prefill attention, one sequence (TFLOP/s = 4 * heads * head_dim * causal pairs / time)\n\n"
      "| case | kv dtype | config | ms | TFLOP/s |\n|---|---|---|---:|---:|\n")
    configs = [None]
    if tune:  # rows = BLOCK_Q tokens x 4 query heads of a KV head
        configs += [dict(BLOCK_Q=rows // (HQ // HKV), BLOCK_N=n, num_warps=wp, num_stages=st)
                    for rows, n, wp, st in ((64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
                                            (128, 32, 4, 3), (128, 64, 4, 3))]
    default = prefill_attention._launch_config
    for prefix, n in PREFILL_CASES:
        ctx = prefix + n
        dense_k = torch.randn(1, HKV, ctx, D, device=DEVICE, dtype=torch.bfloat16)
        dense_v = torch.randn_like(dense_k)
        tables = scrambled_tables(1, ctx // BS)
        q = torch.randn(n, HQ, D, device=DEVICE, dtype=torch.bfloat16)
        cu = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([ctx], dtype=torch.int32, device=DEVICE)
        flops = 4 * HQ * D * (n * prefix + n * (n + 1) / 2)
        for kv_dtype in ("bfloat16", "fp8", "int4"):
            cache = fill_paged(dense_k, dense_v, tables, [ctx], kv_dtype, tables.numel())
            for c in configs if kv_dtype == "bfloat16" else [None]:
                prefill_attention._launch_config = default if c is None else (lambda cache, g, c=c: c)
                ms = median_ms(lambda: prefill_attention.paged_prefill_attention(q, cache, tables, cu, lens, SCALE, n))
                w(f"| prefix {prefix} + {n} new | {kv_dtype} | {c or 'default'} | {ms:.3f} "
                  f"| {flops / ms / 1e9:.0f} |\n")
            prefill_attention._launch_config = default
        if prefix == 0:  # torch's causal SDPA on the dense cache, for scale
            qd = q.transpose(0, 1).unsqueeze(0)
            ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                qd, dense_k, dense_v, is_causal=True, scale=SCALE, enable_gqa=True))
            w(f"| prefix 0 + {n} new | torch SDPA causal (dense) | | {ms:.3f} | {flops / ms / 1e9:.0f} |\n")


def run_kernels_section(out, parts=("check", "decode", "store", "prefill"), tune: bool = False) -> bool:
    """Write the kernel tables as markdown to `out`; returns False if a correctness check failed."""
    def w(text):
        out.write(text)
        print(text, end="", flush=True)
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    w(f"## Kernels on {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
      f"triton {__import__('triton').__version__}\n\nDevice-to-device copy: {bw / 1e9:.0f} GB/s (read + written)\n\n")
    ok = True
    for part in parts:
        t0 = time.time()
        try:
            if part == "check":
                ok &= check_all(w)
            elif part == "tune":
                w(f"\nbest decode configs: {tune_decode(w)}\n")
            elif part == "decode":
                decode_tables(w, bw)
            elif part == "store":
                store_table(w)
            elif part == "prefill":
                prefill_table(w, tune)
        except Exception:
            ok = False
            w(f"\n**{part} failed**\n\n```\n{traceback.format_exc()}```\n")
        print(f"[{part}: {time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
    return ok


def main() -> None:
    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA backends that decline a problem say so
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--section", choices=("kernels", "engine", "all"), default="kernels")
    ap.add_argument("--parts", default="check,decode,store,prefill", help="kernel parts, comma separated "
                    "(check, tune, decode, store, prefill)")
    ap.add_argument("--tune", action="store_true", help="also sweep prefill tile configs")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args()
    buf = io.StringIO()
    ok = True
    if args.section in ("kernels", "all"):
        ok = run_kernels_section(buf, tuple(args.parts.split(",")), args.tune)
    if args.section in ("engine", "all"):
        from benchmarks.gpu_engine import run_engine_section
        engine = io.StringIO()
        run_engine_section(engine)
        print(engine.getvalue(), flush=True)
        buf.write("\n" + engine.getvalue())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(buf.getvalue())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
