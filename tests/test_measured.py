"""Measured-kernel pricing: the tables as shipped, interpolation through them, closed forms against brute
force, extrapolation flagged, the scenario keys that choose it, and one-line errors for bad tables."""

import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.batch import Batch, DecodeShape
from kvsim.errors import KvsimError
from kvsim.perf.calibration import load_calibration, shipped_path as calibration_path
from kvsim.perf.kernel_curves import ModelKernels
from kvsim.perf.kernels import KernelTables, load_tables, shipped_path, shipped_versions
from kvsim.perf.measured import MeasuredStepModel, _Line
from kvsim.perf.pricing import RunPricer, run_within, steps_within
from kvsim.perf.server import ServerTerms, vllm_capture_sizes
from kvsim.scenario.catalog import GPUS, MODELS

LLAMA8, LLAMA70, QWEN06 = MODELS["Llama-3.1-8B"], MODELS["Llama-3.1-70B"], MODELS["Qwen3-0.6B"]
H100 = GPUS["H100-SXM"]
CAL = load_calibration(calibration_path("H100-SXM"))
TABLES = shipped_path("H100-SXM", "0.24.0")


def pricer(model=LLAMA8, tp=1, kv="auto", graphs=vllm_capture_sizes(1024, 8192), terms=ServerTerms(), overlap=True):
    return MeasuredStepModel(model, H100, tp, kv, TABLES, terms, CAL, graphs, async_scheduling=overlap)


def raw(family: str, dtype: str = "bfloat16"):
    return load_tables(str(TABLES)).__getattribute__(family)[dtype]


# ---- the shipped tables ------------------------------------------------------------------------------
def test_every_shipped_release_loads_and_prices_every_preset():
    assert shipped_versions("H100-SXM") == ["0.14.0", "0.19.0", "0.24.0"]
    assert shipped_versions("L40S") == [] and shipped_versions("MI300X") == []
    for gpu in ("H100-SXM", "H200", "A100-80GB", "B200"):
        for version in shipped_versions(gpu):
            tables = KernelTables(shipped_path(gpu, version))
            assert tables.vllm_version == version and tables.meta["source"]["repository"] == "ai-dynamo/aiconfigurator"
            for model in (LLAMA8, LLAMA70, QWEN06):
                k = ModelKernels(tables, model, GPUS[gpu], 8 if model is LLAMA70 else 1, "fp8", CAL)
                t, _ = k.layer_gemms(300)
                knots, values, _ = k.decode_knots(37)
                assert t > 0 and np.isfinite(values).all() and (values > 0).all()


def test_vllm_capture_sizes_follow_vllms_rule():
    # [1, 2, 4] + 8..248 by 8 + 256.. by 16 up to min(2 x max_num_seqs, 512), none above the token budget
    assert vllm_capture_sizes(1024, 8192) == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert vllm_capture_sizes(16, 8192) == (1, 2, 4, 8, 16, 24, 32)
    assert vllm_capture_sizes(256, 100) == (1, 2, 4, *range(8, 97, 8))


# ---- interpolation through the measured points ---------------------------------------------------------
def test_on_the_grid_a_kernel_costs_what_was_measured():
    # Llama-3.1-70B on 8 GPUs: 8 heads, 1 KV head, head_dim 128, hidden 8192: every shape on the grid.
    k = ModelKernels(load_tables(str(TABLES)), LLAMA70, H100, 8, "auto", CAL)
    g = raw("gemm")
    m, n, kk = list(g.axes["m"]), list(g.axes["n"]), list(g.axes["k"])
    q = 8 * 128
    # qkv (n = 1024 + 2 x 128 = 1280) is not a grid column; o_proj (8192 x 1024) and down (8192 x 3584) are
    o_proj = g.ms[m.index(256), n.index(8192), kk.index(1024)] * 1e-3
    assert k.layer_gemms_curves[1].ms[m.index(256)] == pytest.approx(o_proj, rel=1e-12)
    assert k.gemm_shapes[1] == (8192, q)
    ctx = raw("context")
    row = ctx.ms[list(ctx.axes["kv"]).index(1), list(ctx.axes["head_dim"]).index(128), list(ctx.axes["heads"]).index(8)]
    isl, batch = list(ctx.axes["isl"]), list(ctx.axes["batch"])
    t, flag = k.context_s(4, 2048)
    assert t == pytest.approx(row[isl.index(2048), batch.index(4)] * 1e-3, rel=1e-9) and not flag
    gen = raw("generation")
    row = gen.ms[list(gen.axes["kv"]).index(1), list(gen.axes["head_dim"]).index(128), list(gen.axes["heads"]).index(8)]
    knots, values, flags = k.decode_knots(64)
    assert list(knots) == list(gen.axes["step"])
    timed = ~np.isnan(row[list(gen.axes["batch"]).index(64)])
    assert values[timed] == pytest.approx(row[list(gen.axes["batch"]).index(64)][timed] * 1e-3, rel=1e-9)
    assert not flags[timed].any() and flags[~timed].all()  # steps the collector skipped are scaled, and flagged
    ar = raw("allreduce", "graph")
    size = list(ar.axes["size"])
    t, flag = k.allreduce_s(65536, True)
    assert t == pytest.approx(ar.ms[list(ar.axes["gpus"]).index(8), size.index(65536)] * 1e-3, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8191), st.integers(1, 256), st.floats(1.0, 16384.0))
def test_interpolation_never_leaves_its_two_measured_points(m, b, s):
    k = ModelKernels(load_tables(str(TABLES)), LLAMA8, H100, 1, "auto", CAL)
    t, _ = k.layer_gemms(m)
    per = [c.ms for c in k.layer_gemms_curves]
    i = int(np.searchsorted(k.layer_gemms_curves[0].x, m))
    bounds = [sorted((p[max(i - 1, 0)], p[min(i, len(p) - 1)])) for p in per]
    assert sum(a for a, _ in bounds) * (1 - 1e-12) <= t <= sum(c for _, c in bounds) * (1 + 1e-12)
    # prefill attention: inside the four cells around (b, s)
    g = k.context
    ib, is_ = int(np.searchsorted(g.batch, b)), int(np.searchsorted(g.length, s))
    cells = g.s[max(ib - 1, 0):ib + 1, max(is_ - 1, 0):is_ + 1]
    t, _ = k.context_s(b, s)
    assert cells.min() * (1 - 1e-9) <= t <= cells.max() * (1 + 1e-9)


def test_past_the_tables_the_roofline_scales_the_nearest_point_and_says_so():
    k = ModelKernels(load_tables(str(TABLES)), LLAMA8, H100, 1, "auto", CAL)
    edge, flag = k.context_s(1, 16384)
    assert not flag
    longer, flag = k.context_s(1, 32768)
    assert flag and longer == pytest.approx(edge * float(k.roof.prefill(1, 32768, 32, 8, 128, 2.0)
                                                         / k.roof.prefill(1, 16384, 32, 8, 128, 2.0)), rel=1e-9)
    assert 3.9 < longer / edge < 4.01  # prefill attention is quadratic in the prompt
    # Llama-3's vocabulary (128,256 columns) is past the GEMM grid's 65,536: lm_head is scaled, and flagged
    _, flag = k.lm_head_gemm(8)
    assert flag
    sm = pricer()
    sm.step_time(Batch(num_decode_seqs=8, decode_context_tokens=8 * 1000))
    sm.step_time(Batch(num_prefill_seqs=1, num_prefill_tokens=30000, prefill_attn_pairs=30000 * 30001 // 2))
    d = sm.describe()
    assert d["source"] == "measured" and d["vllm_version"] == "0.24.0" and d["any_extrapolated"]
    assert d["extrapolated"]["lm_head"] == "2 of 2 shapes" and d["extrapolated"]["prefill_attention"] == "1 of 1 shapes"
    assert d["extrapolated"]["decode_attention"] == "0 of 1 shapes"


def test_a_head_count_past_the_tables_is_the_timed_kernel_over_more_sequences():
    """32-head MHA (Llama-2-7B: 32 KV heads a GPU, which no table times) is the timed 8-head kernel over 4x
    the sequences: each thread block serves one (sequence, KV head), so the work and the blocks are the same."""
    from kvsim.perf.kernel_curves import AttentionGrid, head_fold
    from kvsim.perf.kernels import Grid

    batch, step = np.array([1, 2, 4, 8, 16, 32]), np.array([15, 255, 1023])
    ms = np.full((2, 1, 3, len(batch), len(step)), np.nan)  # [kv (0: MHA, 2), head_dim, heads (2, 4, 8)]
    ms[0, 0, 2] = 0.01 + 1e-4 * batch[:, None] * (step[None, :] + 5) ** 0.9  # MHA 8 heads, not linear in batch
    ms[1, 0, 1] = 0.02 + 2e-5 * batch[:, None] * step[None, :]  # GQA: 4 heads over 2 KV heads
    grid = Grid({"kv": np.array([0, 2]), "head_dim": np.array([128]), "heads": np.array([2, 4, 8]),
                 "batch": batch, "step": step}, ms)
    roof = ModelKernels(load_tables(str(TABLES)), LLAMA8, H100, 1, "auto", CAL).roof
    assert head_fold(grid, 8, 8, 128) == 1 and head_fold(grid, 32, 32, 128) == 4 and head_fold(grid, 16, 8, 128) == 4
    assert head_fold(grid, 24, 24, 128) == 1  # 6 and 3 heads were never timed either: the roofline, as before
    mha32 = AttentionGrid.build(grid, "generation", 32, 32, 128, 2.0, roof)
    assert mha32.fold == 4 and list(mha32.batch) == [0.25, 0.5, 1, 2, 4, 8]
    knots, t, _ = mha32.knots(2)  # 2 sequences of 32 heads = 8 sequences of 8 heads, as timed
    assert list(knots) == [15, 255, 1023] and t == pytest.approx(ms[0, 0, 2][3] * 1e-3, rel=1e-12)
    _, t, _ = mha32.knots(3)  # between grid batches: linear in the batch, as for a timed head count
    assert t == pytest.approx(0.5 * (ms[0, 0, 2][3] + ms[0, 0, 2][4]) * 1e-3, rel=1e-12)
    gqa = AttentionGrid.build(grid, "generation", 16, 8, 128, 2.0, roof)  # 16 heads over 8 KV heads: 4 over 2, 4x
    _, t, _ = gqa.knots(8)
    assert t == pytest.approx(ms[1, 0, 1][5] * 1e-3, rel=1e-12)
    # the pricer says which kernel priced it
    k = ModelKernels(load_tables(str(TABLES)), replace(LLAMA8, num_key_value_heads=32), H100, 1, "auto", CAL)
    assert k.generation.fold == 4 and any("4x the sequences" in n for n in k.notes)


# ---- a step and runs of steps -------------------------------------------------------------------------
def test_a_step_is_the_sum_of_its_kernels():
    # synchronous scheduling: the host's work a step (5e-4 s + 1e-5 s a sequence) adds to the GPU's
    # a step outside a full graph costs 1e-5 s a layer more
    terms = ServerTerms(graph_step_overhead_s=1e-3, step_overhead_s=2e-3, host_step_s=5e-4, host_per_seq_s=1e-5,
                        piecewise_layer_s=1e-5)
    sm = pricer(model=LLAMA70, tp=4, terms=terms, overlap=False)
    k = sm.kernels
    vocab = -(-LLAMA70.vocab_size // 4)  # a rank's share of a sampled row's logits, all-gathered eagerly
    # 100 decode sequences replay the graph of 104: GEMMs, elementwise and all-reduces at 104 rows, in-graph
    gemm, _ = k.layer_gemms(104)
    ar, _ = k.allreduce_s(104 * 8192, True)
    head, _ = k.lm_head_gemm(100)
    gather, _ = k.allreduce_s(100 * vocab, False)
    line = sm.decode_line(100)
    want = (80 * (gemm + 2 * ar) + ar + sm.elementwise_fixed_s + 104 * sm.elementwise_s_per_token
            + head + gather + 100 * sm.sampler_s_per_seq + 80 * line(2000.0) + 1e-3 + 5e-4 + 100 * 1e-5)
    assert sm.step_time(Batch(num_decode_seqs=100, decode_context_tokens=200_000)) == pytest.approx(want, rel=1e-12)
    # a mixed step of 600 tokens (past the largest capture size, 512) runs eagerly: eager all-reduce, no padding
    gemm, _ = k.layer_gemms(600)
    ar, _ = k.allreduce_s(600 * 8192, False)
    head, _ = k.lm_head_gemm(11)
    gather, _ = k.allreduce_s(11 * vocab, False)
    ctx, _ = k.context_s(1, 1090)
    share = (590 * 500 + 590 * 591 // 2) / (1090 * 1091 / 2)
    b = Batch(num_prefill_seqs=1, num_prefill_tokens=590, prefill_context_tokens=500,
              prefill_attn_pairs=590 * 500 + 590 * 591 // 2, num_decode_seqs=10, decode_context_tokens=10 * 300)
    want = (80 * (gemm + 2 * ar) + ar + sm.elementwise_fixed_s + 600 * sm.elementwise_s_per_token + head + gather
            + 11 * sm.sampler_s_per_seq + 80 * sm.decode_line(10)(300.0) + 80 * ctx * share + 2e-3 + 80 * 1e-5)
    assert sm.step_time(b) == pytest.approx(want + 5e-4 + 11 * 1e-5, rel=1e-12)
    assert sm.step_time(Batch()) == 0.0
    # async scheduling overlaps the host's work with the GPU's: the longer of the two
    overlapped = pricer(model=LLAMA70, tp=4, terms=terms)
    assert overlapped.step_time(b) == pytest.approx(want, rel=1e-12)
    slow_host = pricer(model=LLAMA70, tp=4, terms=replace(terms, host_step_s=1.0))
    assert slow_host.step_time(b) == pytest.approx(1.0 + 11 * 1e-5, rel=1e-12)


def test_a_mixed_step_is_one_forward_not_a_prefill_plus_a_decode():
    """vLLM (V1, cudagraph_mode FULL_AND_PIECEWISE, the default since v0.11) runs a mixed batch as one forward:
    GEMMs and all-reduces at the step's total rows, replaying piecewise CUDA graphs, attention per part
    (eager, between the pieces). So it costs less than its prefill and its decode run as two steps (the
    weights are read once), and a piecewise step pays piecewise_layer_s a layer where a decode step replays
    its full graph."""
    terms = ServerTerms(piecewise_layer_s=4e-5, host_step_s=0.0)
    sm = pricer(model=LLAMA70, tp=4, terms=terms)
    prefill = dict(num_prefill_seqs=1, num_prefill_tokens=15, prefill_context_tokens=560,
                   prefill_attn_pairs=15 * 560 + 15 * 16 // 2)
    decode = dict(num_decode_seqs=64, decode_context_tokens=64 * 700)
    mixed, alone = sm.step_time(Batch(**prefill, **decode)), sm.step_time(Batch(**decode))
    assert mixed < sm.step_time(Batch(**prefill)) + alone
    k = sm.kernels
    rows = 80  # 79 rows padded to the capture size 80, in piecewise graphs
    gemm, _ = k.layer_gemms(rows)
    ar, _ = k.allreduce_s(rows * 8192, True)
    ctx, _ = k.context_s(1, 575)
    head, _ = k.lm_head_gemm(65)
    gather, _ = k.allreduce_s(65 * -(-LLAMA70.vocab_size // 4), False)
    want = (80 * (gemm + 2 * ar) + ar + sm.elementwise_fixed_s + rows * sm.elementwise_s_per_token + head + gather
            + 65 * sm.sampler_s_per_seq + 80 * sm.decode_line(64)(700.0)
            + 80 * ctx * prefill["prefill_attn_pairs"] / (575 * 576 / 2) + terms.step_overhead_s + 80 * 4e-5)
    assert mixed == pytest.approx(want, rel=1e-12)
    without = pricer(model=LLAMA70, tp=4, terms=replace(terms, piecewise_layer_s=0.0))
    assert alone == without.step_time(Batch(**decode))  # a decode step replays its full graph: no piecewise term


def test_more_work_never_costs_less():
    sm = pricer()
    steps = [sm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * 1500)) for n in range(1, 700, 7)]
    assert all(b >= a * (1 - 1e-3) for a, b in zip(steps, steps[1:]))
    longer = [sm.step_time(Batch(num_decode_seqs=64, decode_context_tokens=64 * s)) for s in range(1, 200_000, 997)]
    assert all(b >= a for a, b in zip(longer, longer[1:]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1100), st.integers(1, 140_000), st.integers(0, 10_000), st.integers(1, 2500),
       st.sampled_from([1, 2, 8]), st.sampled_from(["auto", "fp8", "int4"]),
       st.sampled_from([(True, 1e-3), (True, 0.05), (False, 1e-3)]))
def test_a_decode_run_costs_the_sum_of_its_steps(n, context, extra, k, tp, kv, host):
    # host: (async scheduling, the host's seconds a step); 50 ms makes runs start host-bound and cross over
    overlap, host_s = host
    sm = pricer(model=LLAMA70 if tp == 8 else LLAMA8, tp=tp, kv=kv, terms=ServerTerms(host_step_s=host_s),
                overlap=overlap)
    x0 = n * context + extra % n
    brute = math.fsum(sm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=x0 + i * n)) for i in range(k))
    assert sm.decode_run_time(DecodeShape(n, x0), k) == pytest.approx(brute, rel=1e-9)


@pytest.mark.parametrize("host_s", [1e-3, 0.02])
def test_a_decode_run_within_a_budget_stops_at_the_first_step_that_reaches_it(host_s):
    sm = pricer(terms=ServerTerms(host_step_s=host_s))
    rng = random.Random(3)
    for _ in range(200):
        n, x0 = rng.randint(1, 600), rng.randint(1, 3000) * 100
        budget = rng.uniform(1e-3, 3.0)
        shape = DecodeShape(n, x0)
        k = sm.decode_steps_within(shape, budget)
        assert sm.decode_run_time(shape, k) >= budget
        assert k == 1 or sm.decode_run_time(shape, k - 1) < budget
        assert k == steps_within(sm, shape, budget)  # the Protocol's bisection agrees with the closed form
        kk, total, first = sm.decode_run_within(shape, 50, budget)
        assert first == pytest.approx(sm.decode_run_time(shape, 1), rel=1e-12)
        assert (kk, total) == ((50, sm.decode_run_time(shape, 50)) if sm.decode_run_time(shape, 50) < budget
                               else (k, sm.decode_run_time(shape, k)))
        assert (kk, total, first) == run_within(sm, shape, 50, budget)


def test_a_line_sums_across_its_knots():
    line = _Line([1, 3, 7, 15], [1.0, 2.0, 4.0, 4.5], [False] * 4)
    for s0 in (1.0, 2.5, 6.0, 14.2, 30.0):
        for k in range(1, 40):
            assert line.run_sum(s0, k) == pytest.approx(math.fsum(line(s0 + i) for i in range(k)), rel=1e-12)
    assert line(30.0) == pytest.approx(4.5 * 30 / 15)  # past the last knot: proportional to the keys
    # reach(y): the least s with line(s) >= y, against a fine scan
    for y in (0.2, 1.0, 1.7, 3.1, 4.0, 4.4, 4.5, 9.0, 90.0):
        at = line.reach(y)
        assert line(at) == pytest.approx(y, rel=1e-12) or (at == 1.0 and line(at) >= y)
        assert all(line(x) < y for x in np.linspace(max(at, -50) - 20, at, 50)[:-1])


# ---- choosing the pricer from a scenario ---------------------------------------------------------------
def scenario(tmp_path, extra: str = "", gpu: str = "H100-SXM"):
    from kvsim.scenario.config import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\n[model]\nname = "Llama-3.1-8B"\n[hardware]\ngpu = "{gpu}"\n'
                    '[[policies]]\nname = "paged"\n[workload]\nnum_requests = 20\n'
                    f'arrival = {{ process = "poisson", rate = 5.0 }}\n{extra}')
    return load_scenario(path)


def backend(sc):
    from kvsim.backends.analytic import AnalyticBackend
    from kvsim.pipeline import resolve_policy
    from kvsim.scenario.catalog import gpu_spec, model_spec

    model, gpu = model_spec(sc), gpu_spec(sc)
    capacity, settings = resolve_policy(sc, sc.policies[0], model, gpu)
    return AnalyticBackend(sc, sc.policies[0], model, gpu, capacity, settings)


def test_measured_where_tables_ship_and_the_roofline_everywhere_else(tmp_path):
    from kvsim.perf.roofline import StepModel

    assert isinstance(backend(scenario(tmp_path)).pricer, MeasuredStepModel)
    b = backend(scenario(tmp_path, '[engine]\nvllm_version = "0.14.0"\n', gpu="H200"))
    assert isinstance(b.pricer, RunPricer) and b.pricer.describe()["vllm_version"] == "0.14.0" and b.describe()["pricing"]["source"] == "measured"
    overridden = scenario(tmp_path)  # a datasheet override (kvsim plan's 2x FLOP/s): the tables cannot follow it
    overridden = overridden.model_copy(update={"hardware": overridden.hardware.model_copy(update={"bf16_tflops": 2e3})})
    for sc in (scenario(tmp_path, "", "L40S"), scenario(tmp_path, "", "MI300X"), overridden,
               scenario(tmp_path, '[backend]\npricing = "roofline"\n'),
               scenario(tmp_path, '[backend]\ncalibration = "triton"\n')):
        b = backend(sc)
        assert isinstance(b.pricer, StepModel) and "pricing" not in b.describe()


@pytest.mark.parametrize("extra, gpu, message", [
    ('[engine]\nvllm_version = "0.24.0"\n', "L40S", "engine.vllm_version: needs measured kernel tables, but no "
     "measured kernel tables ship for L40S"),
    ('[backend]\npricing = "measured"\n', "MI300X", "backend.pricing: no measured kernel tables ship for MI300X"),
    ('[engine]\nvllm_version = "0.24.0"\n[backend]\npricing = "roofline"\n', "H100-SXM",
     "engine.vllm_version: needs measured pricing, but backend.pricing is roofline"),
])
def test_a_pricing_that_cannot_be_honoured_is_one_line(tmp_path, extra, gpu, message):
    with pytest.raises(KvsimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        backend(scenario(tmp_path, extra, gpu))


def test_bad_kernel_tables_are_one_line_naming_the_file_and_array(tmp_path):
    good = dict(np.load(TABLES))
    cases = {
        "missing.npz": None,
        "garbage.npz": b"not a zip",
        "no_gemm.npz": {k: v for k, v in good.items() if k != "gemm/bfloat16/ms"},
        "shape.npz": {**good, "generation/fp8/ms": good["generation/fp8/ms"][:, :, :, :2]},
        "negative.npz": {**good, "allreduce/graph_ms": -good["allreduce/graph_ms"]},
        "axis.npz": {**good, "context/bfloat16/isl": good["context/bfloat16/isl"][::-1]},
        "meta.npz": {**good, "meta": np.array("{}")},
    }
    expected = {"missing.npz": "kernel tables not found", "garbage.npz": "not a kernel-table file",
                "no_gemm.npz": "gemm/bfloat16/ms: missing", "shape.npz": "generation/fp8/ms: expected floats",
                "negative.npz": "allreduce/graph_ms: times must be positive",
                "axis.npz": "context/bfloat16/isl: must be increasing", "meta.npz": "meta: missing"}
    for name, content in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            np.savez_compressed(path, **content)
        with pytest.raises(KvsimError, match=f"{name}: {expected[name]}"):
            KernelTables(path)


def test_the_cli_refuses_a_bad_kernel_table_file_with_exit_2(tmp_path):
    import subprocess
    import sys

    sc = tmp_path / "s.toml"
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 broken")
    sc.write_text('name = "s"\n[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "p"\n[workload]\n'
                  'num_requests = 5\narrival = { process = "poisson", rate = 5.0 }\n[backend]\nkernel_tables = "bad.npz"\n')
    out = subprocess.run([sys.executable, "-m", "kvsim", str(sc), "--out", str(tmp_path / "r")], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("kvsim: error: ") and "bad.npz" in out.stderr
    assert not (tmp_path / "r").exists()


def test_provenance_names_the_source_of_every_server_term():
    from kvsim.perf.kernels import DATA_DIR
    from kvsim.perf.server import SERVER_TERMS, shipped_terms

    for gpu in ("H100-SXM", "H200", "A100-80GB", "B200"):
        terms, prov = shipped_terms(gpu)
        assert set(prov) == set(SERVER_TERMS) and all(len(v) > 20 for v in prov.values())
    doc = json.loads((DATA_DIR / "h100_sxm-server.json").read_text())
    assert "6.44 ms" in doc["provenance"]["graph_step_overhead_s"]


# ---- converting AIConfigurator's tables ---------------------------------------------------------------
def write_aic(root, version="0.30.0", drop_column=None):
    """A tiny AIConfigurator data folder for one GPU (the published column names)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    gpu = root / "h100_sxm"

    def table(folder, name, rows):
        path = gpu / folder / "vllm" / version
        path.mkdir(parents=True, exist_ok=True)
        cols = {k: [r[k] for r in rows] for k in rows[0] if k != drop_column}
        pq.write_table(pa.table(cols), path / name)

    gemm = [{"kernel_source": "torch", "gemm_dtype": "bfloat16", "m": m, "n": n, "k": k, "latency": 0.01 * m + n / 1e4}
            for m in (1, 8, 64) for n in (1024, 4096) for k in (1024, 4096)]
    gemm.append({**gemm[0], "latency": 0.03})  # a repeated shape: the median of its rows is kept
    gemm.append({**gemm[0], "kernel_source": "other", "latency": 9.0})  # fewer rows: not the default kernel
    table("gemm", "gemm_perf.parquet", gemm)
    attn = dict(kernel_source="fa3", kv_cache_dtype="bfloat16", head_dim=128, window_size=0)
    table("attention", "context_attention_perf.parquet",
          [{**attn, "num_heads": h, "num_key_value_heads": kv, "isl": s, "batch_size": b, "latency": 0.001 * b * s}
           for h, kv in ((8, 8), (8, 2), (16, 2)) for s in (16, 256) for b in (1, 4)])
    table("attention", "generation_attention_perf.parquet",
          [{**attn, "num_heads": h, "num_key_value_heads": 2, "batch_size": b, "step": s, "isl": 1,
            "latency": 0.01 + 1e-5 * b * s} for h in (8, 16) for s in (3, 1023) for b in (1, 8)])
    table("comm", "custom_allreduce_perf.parquet",
          [{"backend": f"vllm_{mode}", "allreduce_dtype": "bfloat16", "num_gpus": g, "message_size": z,
            "latency": 0.004 * g + z / 1e9} for mode in ("graph", "eager") for g in (2, 4) for z in (128, 65536)])
    later = gpu / "gemm" / "vllm" / "0.31.0"
    later.mkdir(parents=True)
    (later / "reuse.yaml").write_text(f"schema_version: 1\nreuse:\n- table: gemm_perf\n  from_version: {version}\n")
    return gpu


def test_aiconfigurator_tables_convert_as_published(tmp_path):
    from kvsim.calibrate.aiconfigurator import convert, versions

    gpu = write_aic(tmp_path)
    assert versions(tmp_path, "h100_sxm") == ["0.30.0"]  # 0.31.0 reuses gemm only: no attention or comm of its own
    arrays, meta = convert(tmp_path, "H100-SXM", "0.30.0")
    ms = arrays["gemm/bfloat16/ms"]
    assert ms[0, 0, 0] == pytest.approx(np.median([0.01 + 0.1024, 0.03]))  # median of the repeats, other kernel out
    assert meta["tables"]["gemm/bfloat16"]["kernel_source"] == "torch"
    assert list(arrays["context/bfloat16/kv"]) == [0, 2]  # MHA (kv == heads) is AIConfigurator's kv 0
    assert list(arrays["generation/bfloat16/step"]) == [3, 1023]  # keys attended, the new token's own included
    assert arrays["generation/bfloat16/ms"][0, 0, 0, 1, 1] == pytest.approx(0.01 + 1e-5 * 8 * 1023)
    assert list(arrays["allreduce/size"]) == [128, 65536] and arrays["allreduce/graph_ms"].shape == (2, 2)
    assert meta["tables"]["gemm/bfloat16"]["file"].endswith("h100_sxm/gemm/vllm/0.30.0/gemm_perf.parquet")
    assert gpu.is_dir()


def test_kvsim_calibrate_converts_a_folder_and_a_scenario_prices_with_it(tmp_path):
    import subprocess
    import sys

    gpu = write_aic(tmp_path)
    out = tmp_path / "mine.npz"
    run = subprocess.run([sys.executable, "-m", "kvsim", "calibrate", str(gpu), "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert KernelTables(out).vllm_version == "0.30.0" and "held out" in run.stdout
    b = backend(scenario(tmp_path, '[backend]\nkernel_tables = "mine.npz"\n'))
    d = b.describe()["pricing"]
    assert d["tables"]["file"] == "mine.npz" and d["vllm_version"] == "0.30.0"
    assert b.execute(Batch(num_decode_seqs=4, decode_context_tokens=400)) > 0
    again = subprocess.run([sys.executable, "-m", "kvsim", "calibrate", str(gpu), "-o", str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr  # never overwritten
    bad = tmp_path / "bad"
    write_aic(bad, drop_column="latency")
    run = subprocess.run([sys.executable, "-m", "kvsim", "calibrate", str(bad / "h100_sxm"), "-o",
                          str(tmp_path / "x.npz")], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().endswith("gemm_perf.parquet: missing column latency")
    assert not (tmp_path / "x.npz").exists()


def test_the_api_server_adds_to_ttft_and_e2e_of_measured_runs_only(tmp_path):
    import csv

    from kvsim.perf.basis import pricing_basis
    from kvsim.perf.measured import request_overhead_s
    from kvsim.perf.server import shipped_terms
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.catalog import gpu_spec, model_spec

    api = shipped_terms("H100-SXM")[0].api_server_s
    assert api > 0
    measured, roofline = scenario(tmp_path), scenario(tmp_path, '[backend]\npricing = "roofline"\n')
    for sc, want in ((measured, api), (roofline, 0.0)):
        gpu = gpu_spec(sc)
        assert request_overhead_s(sc, pricing_basis(sc, model_spec(sc), gpu), gpu) == want
    run_scenario(measured, tmp_path / "out")
    with open(tmp_path / "out" / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 20
    for r in rows:  # the engine's clock in the time columns, the client's in TTFT and E2E
        assert float(r["ttft_s"]) == pytest.approx(float(r["first_token_s"]) - float(r["arrival_s"]) + api, abs=1e-9)
        assert float(r["e2e_s"]) == pytest.approx(float(r["finish_s"]) - float(r["arrival_s"]) + api, abs=1e-9)


def test_the_measured_pricer_takes_the_pricing_protocols_arguments():
    import inspect

    for name in ("step_time", "decode_run_time", "decode_run_within", "decode_steps_within"):
        want = list(inspect.signature(getattr(RunPricer, name)).parameters)
        assert list(inspect.signature(getattr(MeasuredStepModel, name)).parameters) == want, name


# ---- measured or estimated ------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, gpu, model, pricing, label, why", [
    ("", "H100-SXM", "Llama-3.1-8B", "measured", "measured", "vLLM 0.24.0 kernels timed on H100-SXM"),
    ("", "B200", "Llama-3.1-8B", "measured", "measured", "vLLM 0.24.0 kernels timed on B200"),
    ('[backend]\npricing = "roofline"\n', "A100-80GB", "Llama-3.1-8B", "roofline", "measured",
     "roofline calibrated on A100-80GB (shipped calibration calibrations/A100-80GB.json)"),
    ("", "MI300X", "Llama-3.1-8B", "roofline", "estimated",
     "no measured kernels or calibration for MI300X: its datasheet priced with H100 efficiencies"),
    ("", "L40S", "Llama-3.1-8B", "roofline", "estimated", "no measured kernels or calibration for L40S"),
    ('[backend]\npricing = "roofline"\n', "B200", "Llama-3.1-8B", "roofline", "estimated",
     "no measured kernels or calibration for B200"),
    ('[hardware]\nbf16_tflops = 2000\n', "H100-SXM", "Llama-3.1-8B", "roofline", "estimated",
     "hardware.bf16_tflops overrides the H100-SXM datasheet"),
    ("", "H100-SXM", "Qwen3-30B-A3B", "measured", "measured", "vLLM 0.24.0 kernels timed on H100-SXM"),
    ('[backend]\npricing = "roofline"\n', "H100-SXM", "Qwen3-30B-A3B", "roofline", "estimated",
     "no measured kernels for Qwen3-30B-A3B's MoE experts"),
    ("", "H100-SXM", "gemma-2-9b", "measured", "measured", "sliding-window attention (21 layers, 4096 tokens): "
     "measured (full-attention rows at min(context, 4096) keys"),
    ("", "H200", "gpt-oss-120b", "measured", "measured", "sliding-window attention (18 layers, 128 tokens): measured "
     "(vLLM's attention rows timed with a 128-token window)"),
    ('[engine]\nvllm_version = "0.16.0"\n', "H100-SXM", "Llama-3.1-8B", "measured", "estimated",
     "kernels: estimated (no kernel tables of vLLM 0.16.0 on H100-SXM: vLLM 0.14.0's, the newest shipped release "
     "not newer)"),
    ('[engine]\nvllm_version = "0.12"\n', "H200", "Llama-3.1-8B", "measured", "estimated",
     "vLLM 0.14.0's, the oldest shipped, every table being newer"),
    ('[engine]\nvllm_version = "v0.19.0rc1"\n', "H200", "Llama-3.1-8B", "measured", "measured",
     "vLLM 0.19.0 kernels timed on H200"),
    ('[engine]\nmax_model_len = 4096\n', "H100-SXM", "Mistral-7B-v0.1", "measured", "measured", "kernels timed"),
    ('[backend]\nname = "triton"\n', "H100-SXM", "Llama-3.1-8B", "triton", "measured", "timed on the GPU"),
])
def test_every_run_says_whether_its_answers_are_measured_or_estimated(tmp_path, extra, gpu, model, pricing, label,
                                                                      why):
    from kvsim.perf.basis import pricing_basis
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.scenario.config import load_scenario

    path = tmp_path / "s.toml"
    sections = {}
    for block in ("[hardware]\n" + f'gpu = "{gpu}"\n', extra):
        if block:
            head, _, body = block.partition("\n")
            sections[head] = sections.get(head, "") + body
    sections.setdefault("[model]", "")
    sections["[model]"] += f'name = "{model}"\n'
    text = 'name = "s"\n' + "".join(f"{h}\n{b}" for h, b in sections.items())
    path.write_text(text + '[[policies]]\nname = "paged"\n[workload]\nnum_requests = 5\n')
    sc = load_scenario(path)
    basis = pricing_basis(sc, model_spec(sc), gpu_spec(sc))
    assert (basis.pricing, basis.label) == (pricing, label) and why in basis.why, basis
    assert basis.estimated == (label == "estimated") and basis.short().startswith(label)


def test_measured_pricing_of_layers_the_tables_do_not_time_is_one_line(tmp_path):
    """The tables time the MLA module from vLLM 0.19 on: 0.14's cannot price DeepSeek-V3."""
    old = scenario(tmp_path, '[engine]\nblock_size = 64\nvllm_version = "0.14.0"\n', gpu="H200")
    old = old.model_copy(update={"model": old.model.model_copy(update={"name": "DeepSeek-V3"}),
                                 "hardware": old.hardware.model_copy(update={"tensor_parallel_size": 8})})
    with pytest.raises(KvsimError, match=r"engine\.vllm_version: .*do not time DeepSeek-V3's MLA attention "
                                         r"in vLLM 0\.14\.0's"):
        backend(old)


@pytest.mark.parametrize("value, ok", [("0.16.0", True), ("0.16", True), ("v0.16.1rc2", True), ("0.16.1.post1", True),
                                       ("latest", False), ("0.16.0.0", False), ("16", False)])
def test_any_release_is_priced_by_the_nearest_shipped_and_a_non_version_is_one_line(tmp_path, value, ok):
    """engine.vllm_version names the release a user runs: one without tables (0.16 on H100) is priced by the
    newest shipped release not newer (0.14.0) and labelled estimated, saying so; a string that is no release
    is one line and exit code 2."""
    import subprocess
    import sys

    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nname = "Llama-3.1-8B"\n[engine]\nvllm_version = "' + value + '"\n'
                    '[[policies]]\nname = "p"\n[workload]\nnum_requests = 5\n')
    out = subprocess.run([sys.executable, "-m", "kvsim", "run", str(path), "--quiet", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True)
    if not ok:
        assert out.returncode == 2 and "Traceback" not in out.stderr and not (tmp_path / "r").exists()
        line = out.stderr.strip()
        assert "\n" not in line and f"engine.vllm_version: '{value}' is not a vLLM release" in line
        return
    assert out.returncode == 0, out.stderr
    basis = json.loads((tmp_path / "r" / "summary.json").read_text())["meta"]["pricing_basis"]
    assert (basis["label"], basis["vllm_version"], basis["parts"][0]["part"]) == ("estimated", "0.14.0", "kernels")
    assert f"no kernel tables of vLLM {value} on H100-SXM: vLLM 0.14.0's, the newest shipped release not newer" \
        in basis["why"]
