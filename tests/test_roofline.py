"""Roofline step time: each term by hand, closed forms against brute force, monotonicity, calibration files."""

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.batch import Batch, DecodeShape
from kvsim.errors import KvsimError
from kvsim.perf.calibration import Calibration, load_calibration, resolve_calibration, shipped_path
from kvsim.perf.roofline import (StepModel, _envelope, _run_time, _sum_max_lines, activation_bytes_per_token,
                                 allreduce_seconds, decode_splits)
from kvsim.scenario.catalog import GPUS, MODELS

LLAMA8, QWEN8, LLAMA70, QWEN06 = MODELS["Llama-3.1-8B"], MODELS["Qwen3-8B"], MODELS["Llama-3.1-70B"], MODELS["Qwen3-0.6B"]
H100, A100 = GPUS["H100-SXM"], GPUS["A100-80GB"]
# Round numbers, every term switched on, so each can be computed by hand.
CAL = Calibration(compute_efficiency=0.5, gemm_pad_tokens=0.0, attention_efficiency=0.5, memory_efficiency=0.8,
                  graph_step_overhead_s=1e-3, step_overhead_s=2e-3, eager_layer_s=1e-4, eager_attention_s=2e-5,
                  eager_quantized_s=1e-5, layer_overhead_s=5e-6, attention_floor_s=3e-6, prefill_key_s=1e-8,
                  per_seq_overhead_s=1e-5, allreduce_latency_s=5e-5, allreduce_efficiency=0.5,
                  dequant_flops_per_element=2.0, quantized_prefill_factor=2.5)
BW = 3350e9 * 0.8  # H100 HBM at memory_efficiency
PEAK = 989.4e12
LAYER_PARAMS, LM_HEAD_PARAMS = 218_103_808, 525_336_576  # Llama-3.1-8B: per layer; vocab x hidden


def decode(n: int, ctx: int) -> Batch:
    return Batch(num_decode_seqs=n, decode_context_tokens=ctx)


def prefill(n: int, ctx: int = 0) -> Batch:
    return Batch(num_prefill_seqs=1, num_prefill_tokens=n, prefill_context_tokens=ctx,
                 prefill_attn_pairs=n * ctx + n * (n + 1) // 2)


def test_gemm_term_streams_layers_and_lm_head_but_not_the_embedding():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    weights = (32 * LAYER_PARAMS + LM_HEAD_PARAMS) * 2  # 15,009,316,864 B: the input embedding is a gather
    assert LLAMA8.weight_bytes - weights == (LM_HEAD_PARAMS + 65 * 4096) * 2  # the table and 65 norms
    # One token: memory-bound, the streamed weights over the bandwidth.
    assert sm.gemm_time(1, 1) == pytest.approx(weights / BW, rel=1e-12)
    # 8192 tokens, one sampled row: compute-bound layers, memory-bound lm_head.
    layers = 8192 * 2 * 32 * LAYER_PARAMS / (PEAK * 0.5)
    assert sm.gemm_time(8192, 1) == pytest.approx(layers + LM_HEAD_PARAMS * 2 / BW, rel=1e-12)
    # gemm_pad_tokens: compute is charged for 100 more rows (the memory roof is unchanged)
    padded = StepModel(LLAMA8, H100, 1, "auto", replace(CAL, gemm_pad_tokens=100.0))
    assert padded.layer_gemm_time(8192) == pytest.approx(8292 * 2 * LAYER_PARAMS / (PEAK * 0.5), rel=1e-12)
    assert padded.layer_gemm_time(1) == pytest.approx(LAYER_PARAMS * 2 / BW, rel=1e-12)


def test_decode_attention_roofline_and_floor():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    per_pair = 4 * 32 * 32 * 128 / (PEAK * 0.5)  # QK and PV over 32 layers x 32 heads x 128 dims
    kv = 2 * 32 * 8 * 128 * 2 / BW  # 131,072 B of K and V per token
    assert kv > per_pair  # decode attention is memory-bound
    assert sm.decode_attention_time(32, 32 * 1024) == pytest.approx(32 * 1024 * kv, rel=1e-12)
    assert sm.decode_attention_time(1, 1) == pytest.approx(32 * 3e-6, rel=1e-12)  # 32 layers x the floor
    assert sm.decode_attention_time(0, 0) == 0.0
    # a quantized cache reads half the bytes and pays dequantization: 65,536 elements x 2 FLOPs at fp32
    fp8 = StepModel(LLAMA8, H100, 1, "fp8", CAL)
    dequant = 65_536 * 2 / 66.9e12
    kv8 = 2 * 32 * 8 * 128 / BW  # 1-byte elements; vLLM's per-tensor scales take no bytes in the blocks
    assert fp8.decode_attention_time(8, 8000) == pytest.approx(8000 * max(per_pair + dequant, kv8), rel=1e-12)


def test_decode_attention_reads_shared_blocks_once():
    # 4 sequences of 1,000 tokens, 600 of them one shared prefix: 3 x 600 tokens are found in L2
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    shared = Batch(num_decode_seqs=4, decode_context_tokens=4000, decode_max_context=1000,
                   decode_shared_tokens=1800)
    assert shared.decode_read_tokens == 2200
    assert sm.step_time(shared) == pytest.approx(sm.step_time(decode(4, 2200)), rel=1e-12)
    assert sm.step_time(shared) < sm.step_time(decode(4, 4000))
    # never below the longest sequence's own tokens (a holder left out of the step shares them too)
    assert replace(shared, decode_shared_tokens=3900).decode_read_tokens == 1000


KEY = replace(CAL, decode_key_s=3e-8)  # every term on, and the decode kernel's serial time a key
KV = 2 * 32 * 8 * 128 * 2 / BW  # Llama-3.1-8B, bf16: 131,072 B of K and V per token


def test_decode_splits_follow_the_triton_engine():
    # two programs per SM (four when quantized) over batch x 8 KV heads, rounded down to a power of two
    assert [decode_splits(b, 8, 17408, 132, False) for b in (1, 2, 4, 8, 9, 16, 24, 32, 40, 64)] == \
        [32, 16, 8, 4, 4, 2, 2, 2, 1, 1]
    assert decode_splits(12, 8, 17408, 132, False, power_of_two=False) == 3  # ceil(264 / 96)
    assert [decode_splits(b, 8, 17408, 132, True) for b in (16, 64, 128)] == [4, 2, 1]
    assert decode_splits(1, 8, 4096, 132, False) == 8  # no split shorter than 512 tokens of max_model_len
    assert StepModel(LLAMA8, H100, 1, "auto", KEY).decode_splits(1) == 32  # max_model_len 0: no cap
    assert StepModel(LLAMA8, H100, 1, "auto", KEY, max_model_len=4096).decode_splits(1) == 8
    assert StepModel(LLAMA8, A100, 1, "auto", KEY).decode_splits(4) == 4  # ceil(216 / 32) = 7 -> 4


def test_decode_serial_time_of_the_longest_sequence():
    sm = StepModel(LLAMA8, H100, 1, "auto", KEY)
    # one sequence of 8192 among 15 of 128, a graph of 16 (two splits): its programs walk 4096 keys a
    # layer while the rest stream 16 x 128 tokens; then they walk their last 8192 - 128 keys alone
    total, s = 8192 + 15 * 128, 32 * 3e-8 / 2
    tail = s * (8192 - 128) + total * KV * 16 * 128 / total
    assert tail > s * 8192 > total * KV
    assert sm.decode_attention_time(16, total, 8192, 16) == pytest.approx(tail, rel=1e-12)
    assert sm.decode_attention_time(16, total, 8192) == pytest.approx(tail, rel=1e-12)  # rows default to the batch
    # one sequence alone: its serial walk, split 32 ways (batch of 1)
    assert sm.decode_attention_time(1, 65536, 65536, 1) == pytest.approx(
        max(32 * 3e-8 * 65536 / 32, 65536 * KV), rel=1e-12)
    # a uniform batch is the roofline's (longest 0: the mean), the same as without the term
    off = StepModel(LLAMA8, H100, 1, "auto", CAL)
    for args in ((16, 16 * 1024, 1024, 16), (16, 16 * 1024, 0, 16), (64, 64 * 300, 0, 64)):
        assert sm.decode_attention_time(*args) == pytest.approx(off.decode_attention_time(*args), rel=1e-12)
    # nine sequences replay the graph of 16, whose kernel has 2 splits (9 alone would have 4)
    b = Batch(num_decode_seqs=9, decode_context_tokens=4000 + 8 * 100, decode_max_context=4000)
    want = sm.overhead(9, True) + sm.gemm_time(16, 16) + sm.activation_time(16, 16) + \
        sm.decode_attention_time(9, 4800, 4000, 16)
    s = 32 * 3e-8 / 2
    assert sm.decode_attention_time(9, 4800, 4000, 16) == pytest.approx(
        max(s * 4000, s * (4000 - 100) + 4800 * KV * 9 * 100 / 4800), rel=1e-12)
    assert sm.step_time(b) == pytest.approx(want, rel=1e-12)
    # a mixed step is eager: the decode kernel splits for its 9 decodes
    mixed = Batch(num_decode_seqs=9, decode_context_tokens=4800, decode_max_context=4000, num_prefill_seqs=1,
                  num_prefill_tokens=4096, prefill_attn_pairs=4096 * 4097 // 2)
    body = (sm.gemm_time(4105, 10) + sm.activation_time(4105, 10) + sm.decode_attention_time(9, 4800, 4000, 9)
            + sm.prefill_attention_time(1, 4096 * 4097 // 2, 4096, 4096))
    assert sm.decode_splits(9) == 4 and body > sm.host_time(1, 9)
    assert sm.step_time(mixed) == pytest.approx(sm.overhead(10) + body, rel=1e-12)


def test_prefill_attention_compute_serial_floor_and_quantized_factor():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    per_pair = 4 * 32 * 32 * 128 / (PEAK * 0.5)
    pairs = 4096 * 4097 // 2
    assert sm.prefill_attention_time(1, pairs, 4096) == pytest.approx(pairs * per_pair, rel=1e-12)
    # 16 new tokens after 12,288 cached: one program walks 12,304 keys in each of 32 layers
    pairs = 16 * 12288 + 16 * 17 // 2
    serial = 32 * 12304 * 1e-8
    assert serial > pairs * per_pair
    assert sm.prefill_attention_time(1, pairs, 12304) == pytest.approx(serial, rel=1e-12)
    # two sequences side by side: each program walks its own sequence's keys
    assert sm.prefill_attention_time(2, 2 * pairs, 2 * 12304) == pytest.approx(serial, rel=1e-12)
    # a quantized cache: 2.5 x the compute (and the serial walk), plus dequantization of what is read
    fp8 = StepModel(LLAMA8, H100, 1, "fp8", CAL)
    pairs = 4096 * 4097 // 2
    want = pairs * per_pair * 2.5 + 4096 * 65_536 * 2 / 66.9e12
    assert fp8.prefill_attention_time(1, pairs, 4096) == pytest.approx(want, rel=1e-12)
    # and a cost per new token (32 layers x 4e-8 s), which a 16-bit cache does not pay
    tok = replace(CAL, quantized_prefill_token_s=4e-8)
    fp8 = StepModel(LLAMA8, H100, 1, "fp8", tok)
    assert fp8.prefill_attention_time(1, pairs, 4096, 4096) == pytest.approx(want + 4096 * 32 * 4e-8, rel=1e-12)
    bf16 = StepModel(LLAMA8, H100, 1, "auto", tok)
    assert bf16.prefill_attention_time(1, pairs, 4096, 4096) == sm.prefill_attention_time(1, pairs, 4096)


def test_activation_term_by_hand():
    # per layer: two add+RMSNorms 8 x 4096 x 2 B, q/k norm + RoPE 2 x (4096 + 1024) x 2 B,
    # SwiGLU 3 x 14336 x 2 B, KV store read 2 x 1024 x 2 B = 176,128 B; 32 layers + the K/V written
    assert activation_bytes_per_token(LLAMA8, "auto") == 32 * 176_128 + 131_072
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    logits = 12 * 128_256 / BW  # a sampled row's logits: 16-bit written and read, fp32 written and read
    assert sm.activation_time(4096, 1) == pytest.approx(4096 * 5_767_168 / BW + logits, rel=1e-12)
    assert sm.activation_time(1, 1) == pytest.approx(32 * 5e-6 + logits, rel=1e-12)  # the small kernels' floor


def test_allreduce_latency_does_not_shrink_with_tp():
    assert allreduce_seconds(1 << 20, 1, H100, CAL) == 0.0
    assert allreduce_seconds(1 << 20, 4, H100, CAL) == pytest.approx(5e-5 + 1.5 * (1 << 20) / (450e9 * 0.5))
    tp2, tp4 = (StepModel(LLAMA70, H100, tp, "auto", CAL) for tp in (2, 4))
    # 2 x 80 layers + 1 (the embedding) calls, each 50 us + the ring's share of 16 tokens x 8192 x 2 B
    ring2 = 2 * 0.5 * 16 * 8192 * 2 / (450e9 * 0.5)
    assert tp2.allreduce_time(16) == pytest.approx(161 * (5e-5 + ring2), rel=1e-12)
    assert tp4.allreduce_time(0) == tp2.allreduce_time(0) == pytest.approx(161 * 5e-5)
    assert StepModel(LLAMA70, H100, 1, "auto", CAL).allreduce_time(16) == 0.0
    assert tp2.step_time(decode(16, 16 * 2048)) - tp2.allreduce_time(16) == pytest.approx(
        tp2.overhead(16, True) + tp2.gemm_time(16, 16) + tp2.activation_time(16, 16)
        + tp2.decode_attention_time(16, 16 * 2048), rel=1e-12)


def test_graph_decode_and_eager_steps_have_their_own_fixed_costs():
    sm = StepModel(QWEN06, H100, 1, "auto", CAL)  # 28 layers
    # 20 decodes replay the graph of 24 (vLLM's capture sizes): padded rows cost GEMM and activation time
    assert sm.graph_batch(0, 20) == 24 and sm.graph_batch(1, 20) == 0 and sm.graph_batch(0, 600) == 0
    body = sm.gemm_time(24, 24) + sm.activation_time(24, 24) + sm.decode_attention_time(20, 20 * 300)
    assert sm.step_time(decode(20, 20 * 300)) == pytest.approx(1e-3 + 20 * 1e-5 + body, rel=1e-12)
    # a mixed step: the host launches 28 layers with two attention kernel kinds: a floor under the GPU work
    mixed = Batch(num_prefill_seqs=1, num_prefill_tokens=64, prefill_attn_pairs=64 * 65 // 2, num_decode_seqs=4,
                  decode_context_tokens=4 * 500)
    host = 28 * (1e-4 + 2 * 2e-5)
    gpu = (sm.gemm_time(68, 5) + sm.activation_time(68, 5) + sm.decode_attention_time(4, 2000)
           + sm.prefill_attention_time(1, 64 * 65 // 2, 64))
    assert gpu < host
    assert sm.step_time(mixed) == pytest.approx(2e-3 + 5 * 1e-5 + host, rel=1e-12)
    big = prefill(8192)  # GPU-bound: the host's launches hide under it
    gpu = sm.gemm_time(8192, 1) + sm.activation_time(8192, 1) + sm.prefill_attention_time(1, 8192 * 8193 // 2, 8192)
    assert gpu > host
    assert sm.step_time(big) == pytest.approx(2e-3 + 1e-5 + gpu, rel=1e-12)
    # without CUDA graphs a decode step is eager too; a quantized cache adds its decode launches
    eager = StepModel(QWEN06, H100, 1, "int8", CAL, graph_sizes=())
    assert eager.host_time(0, 8) == pytest.approx(28 * (1e-4 + 2e-5 + 1e-5))
    assert eager.host_time(1, 0) == pytest.approx(28 * (1e-4 + 2e-5))
    assert eager.step_time(decode(8, 800)) == pytest.approx(2e-3 + 8e-5 + 28 * 1.3e-4, rel=1e-12)


def test_per_sequence_host_cost():
    sm = StepModel(LLAMA8, H100, 1, "auto", replace(CAL, per_seq_overhead_s=1e-3))
    base = StepModel(LLAMA8, H100, 1, "auto", replace(CAL, per_seq_overhead_s=0.0))
    b = decode(32, 32 * 100)
    assert sm.step_time(b) - base.step_time(b) == pytest.approx(32e-3, rel=1e-9)


def test_swap_time():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    assert sm.swap_time(10) == pytest.approx(10 * 16 * 131072 / 64e9)
    base = sm.step_time(decode(8, 8 * 100))
    swapped = Batch(num_decode_seqs=8, decode_context_tokens=800, swap_in_blocks=3, swap_out_blocks=7)
    assert sm.step_time(swapped) == pytest.approx(base + sm.swap_time(10), rel=1e-12)


# ---- closed forms for runs of decode steps ---------------------------------------------------------
def brute_run(sm: StepModel, n: int, ctx: int, k: int) -> float:
    return sum(sm.step_time(decode(n, ctx + i * n)) for i in range(k))


def brute_steps_within(sm: StepModel, n: int, ctx: int, budget: float) -> int:
    t, k = 0.0, 0
    while True:
        t += sm.step_time(decode(n, ctx + k * n))
        k += 1
        if t >= budget:
            return k


def step_models():
    slow_fp32 = replace(A100, fp32_tflops=0.5)  # dequantization so slow that compute grows faster than memory
    big_floor = replace(CAL, attention_floor_s=2e-4)  # the floor holds for a while, then a roof takes over
    return st.sampled_from([
        StepModel(LLAMA8, H100, 1, "auto", CAL),
        StepModel(LLAMA8, H100, 1, "int8", CAL),
        StepModel(QWEN8, A100, 2, "int4", CAL),
        StepModel(LLAMA70, H100, 4, "fp8", Calibration()),
        StepModel(LLAMA8, slow_fp32, 1, "int4", big_floor),
        StepModel(LLAMA8, slow_fp32, 1, "int4", big_floor, graph_sizes=()),  # eager: a host floor as well
        StepModel(QWEN06, H100, 1, "auto", replace(CAL, eager_layer_s=5e-4), graph_sizes=()),
    ])


def ragged(n: int, ctx: int, longest: int) -> Batch:
    return Batch(num_decode_seqs=n, decode_context_tokens=ctx, decode_max_context=longest)


def brute_ragged(sm: StepModel, n: int, ctx: int, longest: int, k: int) -> float:
    return sum(sm.step_time(ragged(n, ctx + i * n, longest + i)) for i in range(k))


def serial_models():
    slow_fp32 = replace(A100, fp32_tflops=0.5)
    return st.sampled_from([
        StepModel(LLAMA8, H100, 1, "auto", KEY),
        StepModel(LLAMA8, H100, 1, "fp8", KEY, max_model_len=4096),
        StepModel(QWEN06, H100, 1, "auto", replace(KEY, decode_key_s=4e-7)),  # the serial line rules
        StepModel(LLAMA8, slow_fp32, 1, "int4", replace(KEY, attention_floor_s=2e-4)),  # the compute line
        StepModel(QWEN06, H100, 1, "auto", replace(KEY, eager_layer_s=5e-4), graph_sizes=()),  # eager: a host floor
        StepModel(LLAMA70, H100, 4, "fp8", replace(Calibration(), decode_key_s=3e-8)),
    ])


@st.composite
def ragged_runs(draw):
    n = draw(st.integers(1, 300))
    others = draw(st.integers(1, 6000))
    longest = others + draw(st.integers(0, 60_000)) if n > 1 else others
    return n, longest + (n - 1) * others + draw(st.integers(0, n - 1)) * (n > 1), longest


@settings(max_examples=150, deadline=None)
@given(sm=serial_models(), shape=ragged_runs(), k=st.integers(1, 250))
def test_ragged_decode_run_time_matches_brute_force(sm, shape, k):
    n, ctx, longest = shape
    assert sm.decode_run_time(DecodeShape(n, ctx, longest), k) == pytest.approx(brute_ragged(sm, n, ctx, longest, k), rel=1e-10)
    _, total, first = sm.decode_run_within(DecodeShape(n, ctx, longest), k)
    assert total == pytest.approx(brute_ragged(sm, n, ctx, longest, k), rel=1e-10)
    assert first == pytest.approx(sm.step_time(ragged(n, ctx, longest)), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(sm=serial_models(), shape=ragged_runs(), max_steps=st.integers(1, 300),
       budget=st.floats(1e-4, 2.0) | st.just(float("inf")))
def test_ragged_decode_run_within_matches_brute_force(sm, shape, max_steps, budget):
    n, ctx, longest = shape
    k, total, first = sm.decode_run_within(DecodeShape(n, ctx, longest), max_steps, budget)
    t, brute = 0.0, 0
    while brute < max_steps and t < budget:
        t += sm.step_time(ragged(n, ctx + brute * n, longest + brute))
        brute += 1
    assert k == brute or sm.decode_run_time(DecodeShape(n, ctx, longest), min(k, brute)) == pytest.approx(budget, rel=1e-12)
    assert total == pytest.approx(brute_ragged(sm, n, ctx, longest, k), rel=1e-10)
    if math.isfinite(budget):
        within = sm.decode_steps_within(DecodeShape(n, ctx, longest), budget)
        assert sm.decode_run_time(DecodeShape(n, ctx, longest), within) >= budget * (1 - 1e-12)
        assert within == 1 or sm.decode_run_time(DecodeShape(n, ctx, longest), within - 1) < budget * (1 + 1e-12)


def test_run_crossing_from_the_host_floor_to_a_roof():
    # an eager int4 step on a slow fp32 unit: the attention floor (under the weights' time) sets the step
    # time until the growing context's dequantization takes over (at step 1516 here)
    sm = StepModel(LLAMA8, replace(A100, fp32_tflops=0.5), 1, "int4", replace(CAL, attention_floor_s=2e-4,
                                                                                  eager_layer_s=3e-4), graph_sizes=())
    fixed, a, b, s, later = sm._decode_lines(DecodeShape(8, 8))
    assert b == 0 and len(later) == 1 and s == later[0][0] == 1516
    flat = sm.step_time(decode(8, 8))
    assert flat == fixed + a and sm.step_time(decode(8, 8 + 1515 * 8)) == pytest.approx(flat, rel=1e-12)
    assert sm.step_time(decode(8, 8 + 1516 * 8)) > flat
    for k in (1, 5, 50, 400, 3000):
        assert sm.decode_run_time(DecodeShape(8, 8), k) == pytest.approx(brute_run(sm, 8, 8, k), rel=1e-10)
    assert sm.decode_steps_within(DecodeShape(8, 8), 2.0) == brute_steps_within(sm, 8, 8, 2.0)


@settings(max_examples=120, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), k=st.integers(1, 250))
def test_decode_run_time_matches_brute_force(sm, n, per_seq, k):
    ctx = n * per_seq
    assert sm.decode_run_time(DecodeShape(n, ctx), k) == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    _, total, first = sm.decode_run_within(DecodeShape(n, ctx), k)
    assert total == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    assert first == pytest.approx(sm.step_time(decode(n, ctx)), rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), budget=st.floats(1e-4, 2.0))
def test_decode_steps_within_matches_brute_force(sm, n, per_seq, budget):
    ctx = n * per_seq
    k = sm.decode_steps_within(DecodeShape(n, ctx), budget)
    brute = brute_steps_within(sm, n, ctx, budget)
    # the two sums may round differently exactly at the boundary; never by more than that
    assert k == brute or sm.decode_run_time(DecodeShape(n, ctx), min(k, brute)) == pytest.approx(budget, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), max_steps=st.integers(1, 300),
       budget=st.floats(1e-4, 2.0) | st.just(float("inf")))
def test_decode_run_within_stops_at_the_budget_or_max_steps(sm, n, per_seq, max_steps, budget):
    ctx = n * per_seq
    k, total, first = sm.decode_run_within(DecodeShape(n, ctx), max_steps, budget)
    expect = max_steps if budget == float("inf") else min(max_steps, brute_steps_within(sm, n, ctx, budget))
    assert k == expect or sm.decode_run_time(DecodeShape(n, ctx), min(k, expect)) == pytest.approx(budget, rel=1e-12)
    assert total == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    assert first == pytest.approx(sm.step_time(decode(n, ctx)), rel=1e-12)
    assert k == max_steps or total >= budget  # stopped early only at the step that reaches the budget


@settings(max_examples=200, deadline=None)
@given(a1=st.floats(-10, 10), b1=st.floats(-1, 1), a2=st.floats(-10, 10), b2=st.floats(-1, 1),
       k=st.integers(0, 60))
def test_sum_max_lines(a1, b1, a2, b2, k):
    brute = sum(max(a1 + b1 * i, a2 + b2 * i) for i in range(k))
    assert _sum_max_lines(a1, b1, a2, b2, k) == pytest.approx(brute, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(st.floats(0, 10), st.floats(0, 1)), min_size=1, max_size=4),
       fixed=st.floats(0, 1), k=st.integers(0, 80))
def test_envelope_of_lines(lines, fixed, k):
    env = _envelope(fixed, lines)
    brute = sum(fixed + max(a + b * i for a, b in lines) for i in range(k))
    assert _run_time(env, k) == pytest.approx(brute, rel=1e-9, abs=1e-9)


def test_decode_steps_within_long_budget():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    k = sm.decode_steps_within(DecodeShape(64, 64 * 1000), 600.0)  # tens of thousands of steps, found in O(log k)
    assert sm.decode_run_time(DecodeShape(64, 64 * 1000), k) >= 600.0 > sm.decode_run_time(DecodeShape(64, 64 * 1000), k - 1)
    assert sm.decode_steps_within(DecodeShape(64, 64 * 1000), 0.0) == 1


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 400), ctx=st.integers(1, 2_000_000), extra=st.integers(1, 100_000),
       more=st.integers(1, 64))
def test_step_time_monotone(n, ctx, extra, more):
    sm = StepModel(LLAMA8, H100, 1, "int8", CAL)
    ctx = max(ctx, n)
    t = sm.step_time(decode(n, ctx))
    assert sm.step_time(decode(n, ctx + extra)) >= t  # more context (the attention floor may hold)
    assert sm.step_time(decode(n, ctx + 10_000)) > t  # past the floor, strictly
    assert sm.step_time(decode(n + more, ctx + more)) > t  # more sequences


def test_quantized_kv_speeds_up_long_context_decode():
    bf16 = StepModel(LLAMA8, H100, 1, "auto", Calibration())
    int8 = StepModel(LLAMA8, H100, 1, "int8", Calibration())
    n, ctx = 64, 64 * 32_768
    assert int8.step_time(decode(n, ctx)) < 0.75 * bf16.step_time(decode(n, ctx))
    assert int8.dequant_s_per_kv_token > 0 == bf16.dequant_s_per_kv_token


# ---- calibration files ---------------------------------------------------------------------------------
def test_load_calibration(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"compute_efficiency": 0.5, "step_overhead_s": 0}))
    assert load_calibration(path) == Calibration(compute_efficiency=0.5, step_overhead_s=0.0)
    path.write_text(json.dumps({"coefficients": {"memory_efficiency": 0.9}, "provenance": {"memory_efficiency": "x"},
                                "written_by": "kvsim calibrate", "fit": {}}))
    assert load_calibration(path) == Calibration(memory_efficiency=0.9)


@pytest.mark.parametrize("text, match", [
    ('{"compute_eff": 0.5}', r"cal\.json: compute_eff: unknown calibration key"),
    ('{"memory_efficiency": "high"}', r"cal\.json: memory_efficiency: must be a number"),
    ('{"step_overhead_s": true}', r"cal\.json: step_overhead_s: must be a number"),
    ('{"attention_efficiency": 1.5}', r"cal\.json: attention_efficiency: must be in \[0\.001, 1\], got 1\.5"),
    ('{"per_seq_overhead_s": -1}', r"cal\.json: per_seq_overhead_s: must be in \[0, 10\], got -1"),
    ('{\n"step_overhead_s": 0.1,\n}', r"cal\.json:3: invalid JSON"),
    ('[0.5]', r"cal\.json: expected a JSON object"),
    ('{"coefficients": {}, "notes": 1}', r"cal\.json: notes: unknown key"),
    ('{"coefficients": [1]}', r"cal\.json: coefficients: must be a JSON object"),
])
def test_load_calibration_errors(tmp_path, text, match):
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(KvsimError, match=match):
        load_calibration(path)
    with pytest.raises(KvsimError, match=r"calibration \(backend.calibration\) not found"):
        load_calibration(tmp_path / "missing.json")


def test_shipped_calibrations_are_picked_by_gpu_and_engine(tmp_path):
    from conftest import make_scenario

    sc = make_scenario()
    cal, source = resolve_calibration(sc, "H100-SXM")
    assert source == "shipped:H100-SXM.json" and cal == load_calibration(shipped_path("H100-SXM"))
    sc = make_scenario(backend={"calibration": "triton"})
    assert resolve_calibration(sc, "H100-SXM")[1] == "shipped:H100-SXM-triton.json"
    assert resolve_calibration(make_scenario(), "L40S") == (Calibration(), "built-in defaults")
    with pytest.raises(KvsimError, match=r"backend.calibration: no shipped 'triton' calibration for GPU L40S"):
        resolve_calibration(sc, "L40S")
    for path in shipped_path("H100-SXM").parent.glob("*.json"):  # every figure says where it comes from
        doc = json.loads(path.read_text())
        assert set(doc["provenance"]) == set(doc["coefficients"]), path.name
        assert all(isinstance(v, str) and v for v in doc["provenance"].values())
        assert math.isfinite(load_calibration(path).compute_efficiency)


def test_moe_computes_active_experts_and_streams_those_the_batch_touches():
    """Qwen3-30B-A3B: a token goes through attention, the router and 8 of 128 experts in each of 48
    layers; a step streams the attention and the experts its tokens touch, 128 x (1 - (1 - 8/128)^T)."""
    m = MODELS["Qwen3-30B-A3B"]
    sm = StepModel(m, H100, 1, "auto", CAL)
    h = 2048
    attn, expert, router = 2 * h * 32 * 128 + 2 * h * 4 * 128, 3 * h * 768, h * 128
    active = 48 * (attn + router + 8 * expert)
    assert sm.layers_s_per_token == pytest.approx(2 * active / (PEAK * 0.5), rel=1e-12)
    dense_bytes, experts_bytes = 48 * attn * 2, 48 * 128 * expert * 2  # routers: tiny, left out as norms are
    for tokens in (1, 16, 4096):
        touched = 128 * (1 - (1 - 8 / 128) ** tokens)
        assert sm.layers_weights_time(tokens) == pytest.approx((dense_bytes + experts_bytes * touched / 128) / BW,
                                                               rel=1e-12)
    assert sm.layers_weights_time(1) == pytest.approx((dense_bytes + experts_bytes / 16) / BW, rel=1e-12)
    assert sm.layers_weights_time(4096) == pytest.approx((dense_bytes + experts_bytes) / BW, rel=1e-9)
    # a decode step of one sequence is memory-bound: far below streaming every expert
    assert sm.gemm_time(1, 1) < (dense_bytes + experts_bytes) / BW / 5
    assert StepModel(LLAMA8, H100, 1, "auto", CAL).layers_weights_time(7) == \
        StepModel(LLAMA8, H100, 1, "auto", CAL).layers_weights_s  # dense: every step streams every layer


def test_deepseek_runs_fp8_gemms_and_streams_shipped_bytes():
    m = MODELS["DeepSeek-V3"]
    sm = StepModel(m, GPUS["H200"], 8, "auto", CAL)
    assert m.gemm_dtype == "fp8"
    assert sm.layers_s_per_token == pytest.approx(2 * m.active_layer_params / (8 * 1978.9e12 * 0.5), rel=1e-12)
