"""Whole simulations of sliding-window models: the decode cohort over the hybrid allocator gives the
results of sequence-by-sequence scheduling (vLLM's order of releases and allocations), and the fast
allocator gives its specification's (kvsim.engine.hybrid_reference)."""

import pytest

from kvsim.backends.analytic import AnalyticBackend
from kvsim.engine import replica
from kvsim.engine.hybrid import HybridBlockManager
from kvsim.engine.hybrid_reference import HybridReference
from kvsim.perf.memory import kv_capacity
from kvsim.pipeline import run_scenario
from kvsim.scenario.catalog import gpu_spec, model_spec

from conftest import assert_same_requests, make_scenario, per_request

GPT_OSS = {"name": "gpt-oss-20b"}  # sliding window 128 on every other layer: two KV cache groups
BUSY = {"num_requests": 250, "arrival": {"rate": 80.0},
        "prompt_len": {"dist": "uniform", "min": 60, "max": 1500},
        "output_len": {"dist": "uniform", "min": 20, "max": 500}}
GROUPS = {"num_requests": 250, "arrival": {"rate": 25.0},
          "prompt_len": {"dist": "uniform", "min": 50, "max": 400},
          "output_len": {"dist": "uniform", "min": 20, "max": 300},
          "prefix": {"num_groups": 3, "prefix_len": 300, "fraction": 0.8}}
TIGHT = {"gpu_memory_utilization": 0.185}  # gpt-oss-20b's 12.8 GiB of weights leave about 1 GiB of KV
CASES = {
    "gpt-oss, preemptions": dict(model=GPT_OSS, hardware=TIGHT, workload=BUSY),
    "gpt-oss, shared prefixes": dict(model=GPT_OSS, hardware=TIGHT, workload=GROUPS,
                                     policies=[{"name": "paged", "enable_chunked_prefill": False}]),
    "gpt-oss, chunks and fp8": dict(model=GPT_OSS, hardware={"gpu_memory_utilization": 0.172}, workload=BUSY,
                                    engine={"max_num_batched_tokens": 256},
                                    policies=[{"name": "fp8", "kv_cache_dtype": "fp8"}]),
    "gemma-2, window past some contexts": dict(
        model={"name": "gemma-2-9b"}, hardware={"gpu_memory_utilization": 0.3}, engine={"max_model_len": 8192},
        workload={**BUSY, "prompt_len": {"dist": "uniform", "min": 3000, "max": 5000}}),
    "sliding layers only, no prefix caching": dict(
        model={"name": "Mistral-7B-v0.1"}, hardware={"gpu_memory_utilization": 0.22},
        engine={"max_model_len": 8192, "enable_prefix_caching": False},
        workload={**BUSY, "prompt_len": {"dist": "uniform", "min": 3000, "max": 5000}}),
}


def test_sliding_window_models_simulate_with_the_hybrid_allocator():
    sc = make_scenario(**CASES["gpt-oss, preemptions"])
    cap = kv_capacity(sc, sc.policies[0], model_spec(sc), gpu_spec(sc))
    assert cap.windows == (128, 0)  # gpt-oss-20b: layer 0 sliding, so the sliding group comes first
    built = []
    make = replica.ALLOCATORS["paged"]
    replica.ALLOCATORS["paged"] = lambda settings, n: built.append(make(settings, n)) or built[-1]
    try:
        s = run_scenario(sc, write=False).summaries["paged"]
    finally:
        replica.ALLOCATORS["paged"] = make
    assert isinstance(built[0], HybridBlockManager)
    assert s["requests"]["finished"] == 250 and s["preemptions"] > 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cohort_over_windows_matches_step_by_step(monkeypatch, case):
    sc = make_scenario(**CASES[case])
    fused, fused_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)  # no cohort: every sequence every step
    plain, plain_sum = per_request(monkeypatch, sc)
    assert_same_requests(fused, plain)
    assert len(fused) > 100
    for name, s in plain_sum.items():
        f = fused_sum[name]
        assert f["engine_steps"] == s["engine_steps"] and f["engine_events"] < s["engine_events"]
        assert f["preemptions"] == s["preemptions"]
        assert f["kv"] == pytest.approx(s["kv"], rel=1e-9)
        assert len(s["timeseries"]) == len(f["timeseries"])
        for a, b in zip(s["timeseries"], f["timeseries"]):  # the same samples (times to rounding)
            assert all(x == pytest.approx(y, rel=1e-9) if isinstance(x, float) else x == y for x, y in zip(a, b)), (a, b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulations_on_the_specification_match_the_hybrid_allocator(monkeypatch, case):
    sc = make_scenario(**CASES[case])
    fast, fast_sum = per_request(monkeypatch, sc)
    monkeypatch.setitem(replica.ALLOCATORS, "paged", lambda settings, num_blocks: HybridReference(
        num_blocks, settings.block_size, settings.kv_windows, settings.enable_prefix_caching, settings.step_budget))
    spec, spec_sum = per_request(monkeypatch, sc)
    assert fast == spec and len(fast) > 100
    for name, s in fast_sum.items():
        assert s.pop("backend") == spec_sum[name].pop("backend")
        assert s == spec_sum[name], name
    figures = next(iter(fast_sum.values()))
    assert figures["preemptions"] > 0 or figures["prefix_hit_rate"] > 0.1  # something to get wrong
