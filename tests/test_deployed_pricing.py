"""Models as deployed, priced from measured rows (kvsim.perf.kernel_plan): windowed layers from the rows
timed with their window (else full-attention rows at what they read), quantised weights from their
format's GEMM and fused-MoE rows (else the 16-bit rows scaled by the roofline, as vLLM's weight-only
Marlin kernels run on GPUs without the format's tensor cores), and labels that say which part rests on what."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.batch import Batch, DecodeShape
from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path
from kvsim.perf.kernel_curves import AttentionGrid, ModelKernels, Roofline, gemm_curve
from kvsim.perf.kernel_moe import MoeMlaKernels, moe_curve, moe_roof, routing_code
from kvsim.perf.kernel_plan import gemm_plan, moe_plan, pricing_parts, window_plans
from kvsim.perf.kernels import load_tables, shipped_path
from kvsim.perf.measured import MeasuredStepModel
from kvsim.perf.server import ServerTerms, vllm_capture_sizes
from kvsim.scenario.catalog import GPUS, MODELS

CAL = load_calibration(calibration_path("H100-SXM"))
OSS, GEMMA3, SCOUT = MODELS["gpt-oss-120b"], MODELS["gemma-3-27b"], MODELS["Llama-4-Scout"]
LLAMA70 = MODELS["Llama-3.1-70B"]
NVFP4_70B = replace(LLAMA70, quantization="nvfp4")


def tables(gpu, version):
    return load_tables(str(shipped_path(gpu, version)))


def kernels(model, gpu="H200", version="0.24.0", tp=1):
    k = MoeMlaKernels if model.moe or model.mla else ModelKernels
    return k(tables(gpu, version), model, GPUS[gpu], tp, "auto", CAL)


def pricer(model, gpu="H200", version="0.24.0", tp=1):
    return MeasuredStepModel(model, GPUS[gpu], tp, "auto", shipped_path(gpu, version), ServerTerms(), CAL,
                             vllm_capture_sizes(1024, 8192))


# ---- windowed layers -------------------------------------------------------------------------------------
def test_gpt_oss_decode_is_the_mean_of_its_full_and_its_window_rows():
    """18 full and 18 sliding (128) layers: at a batch and context the tables timed, a layer's decode is the mean
    of the full row's time and the window row's, both as measured (ms -> s)."""
    t = tables("H200", "0.24.0")
    k = kernels(OSS)
    (plan, grids), = k.windows
    assert (plan.count, plan.window, plan.rows) == (18, 128, True)
    full = AttentionGrid.build(t.generation["bfloat16"], "generation", 64, 8, 64, 2.0, k.roof)
    window = AttentionGrid.build(t.windowed[("generation", "bfloat16", 128)], "generation", 64, 8, 64, 2.0, k.roof)
    b = int(full.batch[3])
    knots, values, _ = k.decode_knots(b)
    for s in (1023.0, 8191.0):
        i, fi, wi = list(knots).index(s), list(full.length).index(s), list(window.length).index(s)
        assert values[i] == pytest.approx((full.s[3, fi] + window.s[3, wi]) / 2, rel=1e-12)
    assert window.s[3, list(window.length).index(8191.0)] < 0.5 * full.s[3, list(full.length).index(8191.0)]


def test_without_window_rows_a_sliding_layer_is_full_attention_at_the_window():
    """vLLM 0.14's tables time no window: gpt-oss's sliding layers read min(context, 128) keys, priced by the
    full-attention rows there; gemma-3's 1024-token window is not timed at head_dim 128 either."""
    old = kernels(OSS, "H100-SXM", "0.14.0")
    (plan, grids), = old.windows
    assert grids is None and not plan.rows and "full-attention rows at min(context, 128)" in plan.part.why
    full_knots, full_values, _ = old.generation.knots(64)
    knots, values, _ = old.decode_knots(64)
    for s in (2047.0, 65535.0):
        expected = (np.interp(s, full_knots, full_values) + np.interp(128, full_knots, full_values)) / 2
        assert values[list(knots).index(s)] == pytest.approx(expected, rel=1e-12)
    assert window_plans(tables("H100-SXM", "0.24.0"), GEMMA3, "bfloat16")[0].rows is False


def test_windowed_prefill_prices_the_pairs_the_window_leaves():
    """A 4096-token prompt: gpt-oss's sliding layers compute 128 x 4096 - 128 x 127 / 2 query-key pairs, a 16th
    of the full layers'; their rows at the whole prompt price them, the full layers at the full rows."""
    sm = pricer(OSS)
    full = pricer(replace(OSS, layer_types=(), sliding_window=0))
    n = 4096
    pairs = n * (n + 1) // 2
    whole = sm.prefill_attention_time(1, n, 0, pairs)  # no batch: every layer at the full pairs
    t_full, _ = sm.kernels.context_s(1, n)
    assert full.prefill_attention_time(1, n, 0, pairs) == pytest.approx(36 * t_full, rel=1e-12)
    (plan, grids), = sm.kernels.windows
    from kvsim.perf.kernel_windows import context_at

    t_win, _ = context_at(grids[1], grids[0], 1, n)
    assert whole == pytest.approx(18 * t_full + 18 * t_win, rel=1e-12)
    assert t_win < t_full / 3


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 700), st.integers(1, 60_000), st.integers(1, 400),
       st.sampled_from([("H200", "0.24.0"), ("H100-SXM", "0.14.0")]))
def test_a_windowed_models_decode_run_costs_the_sum_of_its_steps(n, context, k, release):
    sm = pricer(OSS, *release)
    x0 = n * context
    brute = math.fsum(sm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=x0 + i * n)) for i in range(k))
    assert sm.decode_run_time(DecodeShape(n, x0), k) == pytest.approx(brute, rel=1e-9)


def test_chunked_local_layers_read_at_most_their_chunk():
    k = kernels(SCOUT, "H100-SXM", "0.24.0", tp=2)
    (plan, grids), = k.windows
    assert (plan.kind, plan.count, plan.window, grids) == ("chunked_attention", 36, 8192, None)
    knots, values, _ = k.decode_knots(32)
    fk, fv, _ = k.generation.knots(32)
    at = list(knots).index(65535.0)
    assert values[at] == pytest.approx((12 * np.interp(65535, fk, fv) + 36 * np.interp(8192, fk, fv)) / 48)


# ---- weights as deployed ------------------------------------------------------------------------------
def test_nvfp4_gemms_are_measured_on_b200_and_marlin_estimates_on_hopper():
    b200 = kernels(NVFP4_70B, "B200", "0.24.0", tp=2)
    t = tables("B200", "0.24.0")
    n, kk = b200.gemm_shapes[1]
    roof = Roofline(GPUS["B200"], CAL, 0.5, 2 * GPUS["B200"].fp8_tflops)
    assert np.allclose(b200.layer_gemms_curves[1].ms, gemm_curve(t.gemm["nvfp4"], n, kk, roof).ms, rtol=1e-12)
    hopper = kernels(NVFP4_70B, "H100-SXM", "0.24.0", tp=2)
    bf16 = kernels(LLAMA70, "H100-SXM", "0.24.0", tp=2)
    c, c16 = hopper.layer_gemms_curves[1], bf16.layer_gemms_curves[1]
    r4, r16 = Roofline(GPUS["H100-SXM"], CAL, 0.5 + 1 / 16), Roofline(GPUS["H100-SXM"], CAL, 2.0)
    assert np.allclose(c.ms, c16.ms * r4.gemm(c.x, n, kk) / r16.gemm(c.x, n, kk), rtol=1e-12)
    assert c.ms[0] < 0.4 * c16.ms[0] and c.ms[-1] == pytest.approx(c16.ms[-1], rel=0.02)  # reads vs 16-bit MMA
    assert any("Marlin weight-only kernels on H100-SXM (no FP4 tensor cores)" in note for note in hopper.notes)
    assert gemm_plan(tables("H100-SXM", "0.24.0"), NVFP4_70B, "attn", "H100-SXM").part.label == "estimated"


def test_experts_take_their_formats_fused_moe_rows_or_the_nearest_scaled():
    kimi = MODELS["Kimi-K2.5"]  # int4 w4a16 experts: vLLM's Marlin int4 MoE rows, timed at its shape on H200
    plan = moe_plan(tables("H200", "0.24.0"), kimi, "H200")
    assert (plan.table, plan.part.label) == ("int4", "measured")
    k = kernels(kimi, "H200", "0.24.0", tp=8)
    assert k.moe_cfg == (7168, 2048, 8, 384, 8, 1) and k.heads == 8
    old = tables("H100-SXM", "0.14.0")  # no MXFP4 rows: Marlin int4's, scaled to MXFP4's bytes
    plan = moe_plan(old, OSS, "H100-SXM")
    assert (plan.table, plan.part.label) == ("int4", "estimated") and plan.weight_bytes == 0.5 + 1 / 32
    k = kernels(OSS, "H100-SXM", "0.14.0")
    roof = Roofline(GPUS["H100-SXM"], CAL, 2.0)  # Marlin multiplies in 16 bits
    base = moe_curve(old.moe["int4"], *k.moe_cfg, routing_code(0), roof, 0.5)
    ratio = moe_roof(roof, base.x, *k.moe_cfg, 0.5 + 1 / 32) / moe_roof(roof, base.x, *k.moe_cfg, 0.5)
    assert np.allclose(k.moe_curve.ms, base.ms * ratio, rtol=1e-9)


@pytest.mark.parametrize("model, gpu, version, label, part", [
    (NVFP4_70B, "B200", "0.24.0", "measured", "NVFP4 attention GEMMs"),
    (NVFP4_70B, "H100-SXM", "0.24.0", "estimated", "NVFP4 dense MLP GEMMs"),
    (MODELS["Kimi-K2.5"], "H200", "0.24.0", "measured", "int4 weight-only (w4a16) experts"),
    (MODELS["MiniMax-M2.5"], "H200", "0.19.0", "measured", "128x128-block fp8 experts"),
    (MODELS["MiniMax-M2.5"], "H200", "0.24.0", "estimated", "128x128-block fp8 attention GEMMs"),
    (OSS, "H200", "0.24.0", "measured", "sliding-window attention (18 layers, 128 tokens)"),
    (OSS, "H100-SXM", "0.19.0", "estimated", "MXFP4 experts"),
    (replace(MODELS["Qwen3-235B-A22B"], quantization="nvfp4"), "H200", "0.24.0", "estimated", "NVFP4 experts"),
])
def test_each_part_says_whether_it_is_measured_or_estimated(model, gpu, version, label, part):
    parts = {p.part: p for p in pricing_parts(tables(gpu, version), model, gpu)}
    assert part in parts and (label == "estimated") == any(p.label == "estimated" for p in parts.values())
    assert parts[part].label == label


def test_plain_models_list_no_parts_and_price_as_before():
    """A bfloat16 dense or MoE model has no part priced otherwise: its label and pricing are unchanged."""
    for name in ("Llama-3.1-8B", "Qwen3-30B-A3B", "Mixtral-8x7B"):
        assert pricing_parts(tables("H100-SXM", "0.24.0"), MODELS[name], "H100-SXM") == []
    k = kernels(MODELS["Llama-3.1-8B"], "H100-SXM", "0.24.0")
    assert k.windows == [] and all(r is k.roof for r in k.gemm_roofs) and k.notes == []


def test_block_fp8_rows_timed_with_the_hosts_time_give_way_to_per_tensor_fp8_rows():
    """vLLM 0.24's block-fp8 GEMM rows cost 55-155 us for the smallest call (per-tensor fp8: 4-5 us; 0.19's
    block-fp8: 6 us): host time outside a CUDA graph. Those releases price block-fp8 GEMMs with per-tensor fp8
    rows, labelled estimated; 0.19's own block-fp8 rows price them, measured."""
    qwen = MODELS["MiniMax-M2.5"]
    new = gemm_plan(tables("H200", "0.24.0"), qwen, "attn", "H200")
    assert new.table == "fp8" and new.part.label == "estimated" and "host time outside a CUDA graph" in new.part.why
    old = gemm_plan(tables("H200", "0.19.0"), qwen, "attn", "H200")
    assert (old.table, old.part.label) == ("fp8_block", "measured")
    t = tables("H200", "0.24.0")
    assert np.nanmin(t.gemm["fp8_block"].ms) > 10 * np.nanmin(t.gemm["fp8"].ms)
