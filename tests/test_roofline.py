"""Roofline step time: a hand-computed step, closed forms against brute force, monotonicity, calibration."""

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.batch import Batch
from kvsim.errors import KvsimError
from kvsim.perf.roofline import Calibration, StepModel, _sum_max_lines, load_calibration
from kvsim.scenario.catalog import GPUS, MODELS

LLAMA8, QWEN8, LLAMA70 = MODELS["Llama-3.1-8B"], MODELS["Qwen3-8B"], MODELS["Llama-3.1-70B"]
H100, A100 = GPUS["H100-SXM"], GPUS["A100-80GB"]
CAL = Calibration()


def decode(n: int, ctx: int) -> Batch:
    return Batch(num_decode_seqs=n, decode_context_tokens=ctx)


def brute_run(sm: StepModel, n: int, ctx: int, k: int) -> float:
    return sum(sm.step_time(decode(n, ctx + i * n)) for i in range(k))


def brute_steps_within(sm: StepModel, n: int, ctx: int, budget: float) -> int:
    t, k = 0.0, 0
    while True:
        t += sm.step_time(decode(n, ctx + k * n))
        k += 1
        if t >= budget:
            return k


def test_hand_computed_decode_step_llama8b_h100():
    # 32 sequences, each with 1023 cached tokens plus the new one: decode_context_tokens = 32 x 1024.
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    # GEMMs: 2 x (32 layers x 218,103,808 projection params + 525,336,576 lm_head) = 15,009,316,864 FLOPs/token,
    # 32 tokens, all sampled, at 989.4 TF x 0.6.
    gemm = 15_009_316_864 * 32 / (989.4e12 * 0.6)
    # Attention: 4 x 32 layers x 32 heads x 128 dims = 524,288 FLOPs per query-key pair, 32,768 pairs, at x 0.4.
    attn = 524_288 * 32_768 / (989.4e12 * 0.4)
    # HBM: 16,060,522,496 B of weights + KV read (32,768 tokens) and written (32) at 131,072 B/token,
    # at 3350 GB/s x 0.85.
    memory = (16_060_522_496 + (32_768 + 32) * 131_072) / (3350e9 * 0.85)
    overhead = 0.004 + 32 * 1e-5
    assert memory > gemm + attn  # memory-bound: ~7.15 ms against ~0.85 ms
    expected = overhead + memory
    assert expected == pytest.approx(0.011470, abs=1e-6)
    assert sm.step_time(decode(32, 32 * 1024)) == pytest.approx(expected, rel=1e-12)


def test_prefill_step_is_compute_bound():
    # one 4096-token prompt: 4096 x (15,009,316,864 - 2 x 525,336,576) + one lm_head row of GEMM FLOPs,
    # 4096 x 4097 / 2 attention pairs
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    b = Batch(num_prefill_seqs=1, num_prefill_tokens=4096, prefill_attn_pairs=4096 * 4097 // 2)
    gemm = (4096 * (15_009_316_864 - 1_050_673_152) + 1_050_673_152) / (989.4e12 * 0.6)
    attn = 524_288 * (4096 * 4097 // 2) / (989.4e12 * 0.4)
    assert sm.step_time(b) == pytest.approx(0.004 + 1e-5 + gemm + attn, rel=1e-12)


def test_run_crossing_compute_memory_crossover():
    # 256 sequences starting at 1 token each: compute-bound GEMMs at first, KV reads dominate later.
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    n, ctx, k = 256, 256, 300
    first, last = ctx, ctx + (k - 1) * n
    assert sm.compute_time(n, n, first, first) > sm.memory_time(n, first)
    assert sm.compute_time(n, n, last, last) < sm.memory_time(n, last)
    assert sm.decode_run_time(n, ctx, k) == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    assert sm.decode_steps_within(n, ctx, 1.0) == brute_steps_within(sm, n, ctx, 1.0)


def step_models():
    slow_fp32 = replace(A100, fp32_tflops=0.5)  # dequantization so slow that compute grows faster than memory
    return st.sampled_from([
        StepModel(LLAMA8, H100, 1, "auto", CAL),
        StepModel(LLAMA8, H100, 1, "int8", CAL),
        StepModel(QWEN8, A100, 2, "int4", CAL),
        StepModel(LLAMA70, H100, 4, "fp8", CAL),
        StepModel(LLAMA8, slow_fp32, 1, "int4", CAL),
    ])


@settings(max_examples=150, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), k=st.integers(1, 250))
def test_decode_run_time_matches_brute_force(sm, n, per_seq, k):
    ctx = n * per_seq
    assert sm.decode_run_time(n, ctx, k) == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    total, first = sm.decode_run(n, ctx, k)
    assert total == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    assert first == pytest.approx(sm.step_time(decode(n, ctx)), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), budget=st.floats(1e-4, 2.0))
def test_decode_steps_within_matches_brute_force(sm, n, per_seq, budget):
    ctx = n * per_seq
    k = sm.decode_steps_within(n, ctx, budget)
    brute = brute_steps_within(sm, n, ctx, budget)
    # the two sums may round differently exactly at the boundary; never by more than that
    assert k == brute or sm.decode_run_time(n, ctx, min(k, brute)) == pytest.approx(budget, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(sm=step_models(), n=st.integers(1, 512), per_seq=st.integers(1, 8000), max_steps=st.integers(1, 300),
       budget=st.floats(1e-4, 2.0) | st.just(float("inf")))
def test_decode_run_within_stops_at_the_budget_or_max_steps(sm, n, per_seq, max_steps, budget):
    ctx = n * per_seq
    k, total, first = sm.decode_run_within(n, ctx, max_steps, budget)
    expect = max_steps if budget == float("inf") else min(max_steps, brute_steps_within(sm, n, ctx, budget))
    # the two sums may round differently exactly at the boundary; never by more than that
    assert k == expect or sm.decode_run_time(n, ctx, min(k, expect)) == pytest.approx(budget, rel=1e-12)
    assert total == pytest.approx(brute_run(sm, n, ctx, k), rel=1e-10)
    assert first == pytest.approx(sm.step_time(decode(n, ctx)), rel=1e-12)
    assert k == max_steps or total >= budget  # stopped early only at the step that reaches the budget


@settings(max_examples=200, deadline=None)
@given(a1=st.floats(-10, 10), b1=st.floats(-1, 1), a2=st.floats(-10, 10), b2=st.floats(-1, 1),
       k=st.integers(0, 60))
def test_sum_max_lines(a1, b1, a2, b2, k):
    brute = sum(max(a1 + b1 * i, a2 + b2 * i) for i in range(k))
    assert _sum_max_lines(a1, b1, a2, b2, k) == pytest.approx(brute, rel=1e-9, abs=1e-9)


def test_decode_steps_within_long_budget():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    k = sm.decode_steps_within(64, 64 * 1000, 600.0)  # tens of thousands of steps, found in O(log k)
    assert sm.decode_run_time(64, 64 * 1000, k) >= 600.0 > sm.decode_run_time(64, 64 * 1000, k - 1)
    assert sm.decode_steps_within(64, 64 * 1000, 0.0) == 1


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 400), ctx=st.integers(1, 2_000_000), extra=st.integers(1, 100_000),
       more=st.integers(1, 64))
def test_step_time_monotone(n, ctx, extra, more):
    sm = StepModel(LLAMA8, H100, 1, "int8", CAL)
    ctx = max(ctx, n)
    t = sm.step_time(decode(n, ctx))
    assert sm.step_time(decode(n, ctx + extra)) > t  # more context
    assert sm.step_time(decode(n + more, ctx + more)) > t  # more sequences


def test_tensor_parallel_adds_allreduce():
    tp1 = StepModel(LLAMA70, H100, 1, "auto", CAL)
    tp2 = StepModel(LLAMA70, H100, 2, "auto", CAL)
    n, ctx = 16, 16 * 2048
    assert tp1.allreduce_time(n) == 0
    # 2 per layer x 80 layers, each 10 us + 2 x (1/2) x 16 tokens x 8192 x 2 B over 450 GB/s
    allreduce = 160 * (1e-5 + 16 * 8192 * 2 / 450e9)
    body = max(tp2.compute_time(n, n, ctx, ctx), tp2.memory_time(n, ctx))
    assert tp2.step_time(decode(n, ctx)) == pytest.approx(tp2.overhead(n) + body + allreduce, rel=1e-12)
    assert tp2.memory_time(n, ctx) == pytest.approx(tp1.memory_time(n, ctx) / 2, rel=1e-12)


def test_quantized_kv_speeds_up_long_context_decode():
    bf16 = StepModel(LLAMA8, H100, 1, "auto", CAL)
    int8 = StepModel(LLAMA8, H100, 1, "int8", CAL)
    n, ctx = 64, 64 * 32_768
    assert bf16.memory_time(n, ctx) > bf16.compute_time(n, n, ctx, ctx)  # memory-bound
    assert int8.step_time(decode(n, ctx)) < 0.7 * bf16.step_time(decode(n, ctx))
    assert int8.dequant_s_per_kv_token > 0 == bf16.dequant_s_per_kv_token


def test_swap_time():
    sm = StepModel(LLAMA8, H100, 1, "auto", CAL)
    assert sm.swap_time(10) == pytest.approx(10 * 16 * 131072 / 64e9)
    base = sm.step_time(decode(8, 8 * 100))
    swapped = Batch(num_decode_seqs=8, decode_context_tokens=800, swap_in_blocks=3, swap_out_blocks=7)
    assert sm.step_time(swapped) == pytest.approx(base + sm.swap_time(10), rel=1e-12)


def test_load_calibration(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"compute_efficiency": 0.5, "step_overhead_s": 0}))
    assert load_calibration(path) == Calibration(compute_efficiency=0.5, step_overhead_s=0.0)


@pytest.mark.parametrize("text, match", [
    ('{"compute_eff": 0.5}', r"cal\.json: compute_eff: unknown calibration key"),
    ('{"memory_efficiency": "high"}', r"cal\.json: memory_efficiency: must be a number"),
    ('{"step_overhead_s": true}', r"cal\.json: step_overhead_s: must be a number"),
    ('{"attention_efficiency": 1.5}', r"cal\.json: attention_efficiency: must be in \[0\.001, 1\], got 1\.5"),
    ('{"per_seq_overhead_s": -1}', r"cal\.json: per_seq_overhead_s: must be in \[0, 10\], got -1"),
    ('{\n"step_overhead_s": 0.1,\n}', r"cal\.json:3: invalid JSON"),
    ('[0.5]', r"cal\.json: expected a JSON object"),
])
def test_load_calibration_errors(tmp_path, text, match):
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(KvsimError, match=match):
        load_calibration(path)
    with pytest.raises(KvsimError, match=r"calibration \(backend.calibration\) not found"):
        load_calibration(tmp_path / "missing.json")
