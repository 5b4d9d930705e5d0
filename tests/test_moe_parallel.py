"""Mixture-of-experts and MLA models: scenario keys for data and expert parallelism (vLLM's names),
their one-line checks, weights and KV capacity under each layout, the step price's expert routing,
all-gather/reduce-scatter and absorbed MLA decode, the measured fused-MoE and MLA kernels, and the
triton engine's refusal of what it cannot run."""

import math

import numpy as np
import pytest

from kvsim.batch import Batch
from kvsim.errors import KvsimError
from kvsim.perf.calibration import Calibration
from kvsim.perf.kernel_curves import Roofline
from kvsim.perf.basis import unmeasured_layers
from kvsim.perf.kernel_moe import MoeMlaKernels, moe_curve, moe_roof, routing_code, untimed_layers
from kvsim.perf.kernels import MoeTable, load_tables, shipped_path
from kvsim.perf.memory import compute_capacity
from kvsim.perf.moe import busiest_touched, moe_load
from kvsim.perf.roofline import StepModel
from kvsim.perf.weights import weights_per_gpu
from kvsim.pipeline import run_scenario
from kvsim.scenario.catalog import GPUS, MODELS, model_spec

from conftest import make_scenario

DS, QWEN_MOE, LLAMA = MODELS["DeepSeek-V3"], MODELS["Qwen3-30B-A3B"], MODELS["Llama-3.1-8B"]
H100, H200 = GPUS["H100-SXM"], GPUS["H200"]
CAL = Calibration(compute_efficiency=0.5, memory_efficiency=0.8, allreduce_latency_s=1e-5, allreduce_efficiency=0.5)


# ---- scenario keys and their checks ----------------------------------------------------------------
@pytest.mark.parametrize("model,hardware,extra,match", [
    ("Llama-3.1-8B", {"enable_expert_parallel": True}, {}, r"hardware\.enable_expert_parallel: Llama-3\.1-8B has no routed experts"),
    ("Llama-3.1-8B", {}, {"expert_skew": 1.2}, r"model\.expert_skew: Llama-3\.1-8B has no routed experts"),
    ("Qwen3-30B-A3B", {}, {"expert_skew": 0.5}, r"model\.expert_skew: a power law's exponent of at least 1"),
    ("Mixtral-8x7B", {"tensor_parallel_size": 4, "data_parallel_size": 4, "enable_expert_parallel": True}, {},
     r"16 GPUs .* for Mixtral-8x7B's 8 experts"),
])
def test_parallel_keys_are_checked_in_one_line(model, hardware, extra, match):
    sc = make_scenario(model={"name": model, **extra}, hardware=hardware)
    with pytest.raises(KvsimError, match=match) as err:
        model_spec(sc)
    assert "\n" not in str(err.value) and str(err.value).startswith("<scenario>: ")


def test_data_parallel_ranks_are_engines_and_shrink_expert_weights():
    """DeepSeek-V3 on 8 H200s, DP 8 + EP: attention whole on every GPU, 256 experts 32 a GPU; with TP 8
    every expert sliced. The same expert bytes a GPU either way, attention 8x."""
    dp = make_scenario(model={"name": "DeepSeek-V3"}, hardware={"gpu": "H200", "data_parallel_size": 8,
                                                               "enable_expert_parallel": True},
                       engine={"block_size": 64, "max_model_len": 8192})
    tp = make_scenario(model={"name": "DeepSeek-V3"}, hardware={"gpu": "H200", "tensor_parallel_size": 8},
                       engine={"block_size": 64, "max_model_len": 8192})
    w_dp, w_tp = weights_per_gpu(DS, 1, 8, True), weights_per_gpu(DS, 8)
    assert w_dp.experts == pytest.approx(w_tp.experts) and w_dp.attn == pytest.approx(8 * w_tp.attn)
    cap_dp, cap_tp = (compute_capacity(s, s.policies[0], DS, H200) for s in (dp, tp))
    assert cap_dp.weights == pytest.approx(w_dp.total) and cap_dp.num_blocks < cap_tp.num_blocks
    s = run_scenario(make_scenario(**{**dict(model={"name": "DeepSeek-V3"}), "hardware": {
        "gpu": "H200", "data_parallel_size": 8, "enable_expert_parallel": True},
        "engine": {"block_size": 64, "max_model_len": 8192}, "workload": {"num_requests": 40}}), write=False)
    assert s.summaries["paged"]["num_replicas"] == 8 and s.meta["data_parallel_size"] == 8
    assert s.summaries["paged"]["requests"]["finished"] == 40


# ---- routing ---------------------------------------------------------------------------------------
def test_balanced_routing_touches_the_expected_experts():
    touched, factor = moe_load(128, 8, 16, 0.0, 8)
    assert touched == pytest.approx(1 - (1 - 8 / 128) ** 16) and factor == 1.0


def test_skewed_routing_leaves_experts_idle_and_loads_the_busiest_gpu():
    """A power law of exponent 1.2 (AIConfigurator's strong skew): at 64 tokens x 8 of 128 experts, far
    fewer experts are touched than balanced, and the GPU holding the most popular expert carries more
    than its share; its expected tokens sum to the tokens' expert rows."""
    from kvsim.perf.moe import _loads

    loads = _loads(128, 8, 64, 1.2)
    assert loads.sum() == pytest.approx(64 * 8) and list(loads) == sorted(loads, reverse=True)
    skewed, factor = moe_load(128, 8, 64, 1.2, 8)
    balanced, _ = moe_load(128, 8, 64, 0.0, 8)
    rest = (loads.sum() - loads[0]) / 127
    assert skewed < balanced and factor == pytest.approx((loads[0] + 15 * rest) / (64 * 8 / 8)) and factor > 1.1
    assert skewed == pytest.approx(np.mean(1 - np.exp(-loads)))
    assert busiest_touched(128, 8, 64, 1.2, 8) >= skewed
    assert moe_load(128, 8, 64, 1.2, 1)[1] == 1.0  # experts sliced over the GPUs: every GPU the same work


def test_roofline_prices_skew_dp_gathers_and_absorbed_mla():
    tp8 = StepModel(DS, H200, 8, "auto", CAL)
    dp8 = StepModel(DS, H200, 1, "auto", CAL, dp=8, expert_parallel=True)
    skew = StepModel(QWEN_MOE, H100, 1, "auto", CAL, dp=1, expert_parallel=False, expert_skew=1.2)
    flat = StepModel(QWEN_MOE, H100, 1, "auto", CAL)
    # DP attention: the MoE layers stream the experts 8 ranks' tokens touch
    assert dp8.layers_weights_time(8) == pytest.approx(
        dp8.layers_weights_s + dp8.expert_weights_s * (1 - (1 - 8 / 256) ** 64))
    # all-gather and reduce-scatter per MoE layer: 2 x 58 latencies, dp x tokens x hidden over 7/8 of the link
    per_token = 2 * 58 * (7 / 8) * 8 * DS.hidden_size * 2 / (H200.nvlink_gbps * 1e9 * 0.5)
    assert dp8.allreduce_time(10) == pytest.approx(2 * 58 * 1e-5 + 10 * per_token)
    assert skew.layers_weights_time(64) < flat.layers_weights_time(64)
    # MLA decode absorbed: a query-key pair costs 2 x heads x (576 + 512) FLOPs a layer, not (192 + 128)
    assert tp8.decode_s_per_pair == pytest.approx(
        2 * 61 * 128 * (576 + 512) / (8 * H200.fp8_tflops * 1e12 * CAL.attention_efficiency))
    cached = tp8.prefill_attention_time(1, 1000 * 500, 1500, 500) - tp8.prefill_attention_time(1, 1000 * 500, 500, 500)
    assert cached > 0  # the cached context's latent is expanded for every head


# ---- measured kernels ------------------------------------------------------------------------------
def test_moe_curve_takes_the_timed_config_interpolates_ep_and_scales_the_nearest():
    tokens = np.array([1, 64, 4096])
    config = np.array([[2048, 768, 8, 128, 1, 2, 0], [2048, 768, 8, 128, 1, 8, 0], [4096, 1536, 8, 128, 1, 1, 0]])
    ms = np.array([[0.1, 0.2, 2.0], [0.05, 0.1, 0.5], [0.3, 0.6, 6.0]])
    table, roof = MoeTable(config, tokens, ms), Roofline(H100, CAL)
    exact = moe_curve(table, 2048, 768, 8, 128, 1, 8, 0, roof, 2.0)
    assert list(exact.ms) == pytest.approx([5e-5, 1e-4, 5e-4]) and not exact.extrapolated.any()
    mid = moe_curve(table, 2048, 768, 8, 128, 1, 4, 0, roof, 2.0)  # EP 4: log-log halfway between 2 and 8
    assert mid.ms[2] == pytest.approx(math.sqrt(2.0 * 0.5) * 1e-3) and not mid.extrapolated.any()
    far = moe_curve(table, 2560, 1024, 8, 160, 1, 1, 0, roof, 2.0)  # not timed: the nearest shape, scaled
    ratio = moe_roof(roof, 4096, 2560, 1024, 8, 160, 1, 1, 2.0) / moe_roof(roof, 4096, 2048, 768, 8, 128, 1, 2, 2.0)
    assert far.extrapolated.all() and far.ms[2] == pytest.approx(2e-3 * ratio)
    assert routing_code(0) == 0 and routing_code(1.2) == 120


def test_measured_tables_price_moe_and_mla_models_where_they_have_them():
    tables = load_tables(str(shipped_path("H200", "0.24.0")))
    assert untimed_layers(tables, DS) == untimed_layers(tables, QWEN_MOE) == []
    assert unmeasured_layers(DS, 8192, tables) == "" and unmeasured_layers(DS, 8192) == "MoE experts and MLA attention"
    assert unmeasured_layers(MODELS["gpt-oss-20b"], 8192, tables) == ""  # windowed rows (kernel_plan)
    assert unmeasured_layers(MODELS["gpt-oss-20b"], 8192) == "MoE experts and sliding-window or chunked attention"
    old = load_tables(str(shipped_path("H200", "0.14.0")))
    assert untimed_layers(old, DS) == ["MLA attention"]
    k = MoeMlaKernels(tables, DS, H200, 8, "auto", CAL)
    assert k.moe_cfg == (7168, 2048, 8, 256, 8, 1) and k.heads == 16 and k.n_attn == 0  # MLA: the module
    one, _ = k.step_gemms(1.0)
    many, _ = k.step_gemms(512.0)
    assert 0 < one < many  # router, shared experts and dense MLPs by the GEMM tables, routed experts by the MoE's
    assert k.context_s(1, 2048)[0] > k.context_s(1, 512)[0] > 0


def test_sliding_window_models_are_priced_by_the_tables_under_auto_pricing():
    """gpt-oss fell back to the roofline (its sliding layers were not timed); the tables' window rows price them."""
    sc = make_scenario(model={"name": "gpt-oss-20b"}, workload={"num_requests": 20})
    s = run_scenario(sc, write=False).summaries["paged"]
    assert s["backend"]["pricing"]["source"] == "measured"
    assert any("sliding-window" in e for e in s["backend"]["pricing"]["windows"])


# ---- the triton engine stays dense -----------------------------------------------------------------
@pytest.mark.parametrize("model,what", [("Qwen3-30B-A3B", "routed experts"), ("DeepSeek-V3", "latent attention"),
                                       ("gemma-2-9b", "sliding-window layers"), ("gpt-oss-20b", "routed experts")])
def test_triton_backend_refuses_moe_mla_and_sliding_models_in_one_line(model, what):
    from kvsim.backends.triton_engine.backend import dense_engine_problem

    assert what in dense_engine_problem(MODELS[model]) and dense_engine_problem(LLAMA) == ""
    sc = make_scenario(model={"name": model}, backend={"name": "triton"},
                       policies=[{"name": "paged", "kv_cache_scales": "per_token"}],
                       engine={"max_model_len": 4096, "block_size": 64 if model == "DeepSeek-V3" else 16},
                       hardware={"gpu": "H200", "memory_gib": 1000.0} if model == "DeepSeek-V3" else {})
    with pytest.raises(KvsimError, match=rf"model\.name: backend 'triton' needs a dense model of full attention; "
                                         rf"{model} has .*{what}") as err:
        run_scenario(sc, write=False)
    assert "\n" not in str(err.value)


# ---- the layouts plan --target-rate searches ---------------------------------------------------------
def test_plan_searches_tp_dp_and_ep_for_moe_models_only():
    from kvsim.planning.deploy import Deployment, _hardware
    from kvsim.planning.parallel import Parallel, candidates

    assert candidates(LLAMA, (1, 2, 4)) == [1, 2, 4]
    got = candidates(MODELS["Mixtral-8x7B"], (1, 4))
    assert [str(p) for p in got] == ["1", "1 DP 2", "1 DP 2 EP", "1 DP 4", "1 DP 4 EP", "1 DP 8", "1 DP 8 EP",
                                     "4", "4 EP", "4 DP 2", "4 DP 2 EP"]
    assert [int(p) for p in got] == [1, 2, 2, 4, 4, 8, 8, 4, 4, 8, 8]  # GPUs a replica: what prices multiply
    dp_ep = Parallel(1, 8, True)
    assert dp_ep != Parallel(1, 8, False) and dp_ep != 8 and Parallel(4, 1, False) == 4
    assert len({dp_ep, Parallel(1, 8, False), Parallel(8, 1, False), 8}) == 3
    sc = make_scenario(model={"name": "DeepSeek-V3"}, hardware={"gpu": "H200"})
    assert _hardware(sc, "H200", dp_ep, 2) == {"gpu": "H200", "tensor_parallel_size": 1, "data_parallel_size": 8,
                                               "enable_expert_parallel": True, "num_replicas": 2}
    assert _hardware(sc, "H200", 4, 1) == {"gpu": "H200", "tensor_parallel_size": 4, "num_replicas": 1}
    d = Deployment("H200", dp_ep, 2, dp_ep * 2, "paged", True, 1.0, None, None, None, None, None, 1.0, 0.0, 0.0, "")
    assert (d.tensor_parallel_size, d.data_parallel_size, d.enable_expert_parallel, d.num_gpus) == (1, 8, True, 16)
    assert d.answer().startswith("16 × H200 as TP 1 × DP 8 + EP × 2 replicas") and d.layout == dp_ep
