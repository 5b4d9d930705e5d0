"""Disaggregated prefill and decode (kvsim.engine.disaggregated, kvsim.engine.kv_transfer,
kvsim.perf.disaggregation): transfer times computed by hand, conservation of the KV that crosses the
link, every block and request accounted for in both pools, and layouts vLLM would refuse."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import make_scenario
from kvsim.errors import KvsimError
from kvsim.perf.disaggregation import disaggregation
from kvsim.pipeline import check_deployments, simulate_policy
from kvsim.results.metrics import Metrics
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.scenario.links import LINKS, NIXL_POST_US, RDMA_LATENCY_US

MIB = 1 << 20
# Llama-3.1-8B, bf16: 2 (K, V) x 8 KV heads x 128 x 2 B x 32 layers = 128 KiB a token on one GPU
LLAMA8B_TOKEN_BYTES = 2 * 8 * 128 * 2 * 32


def disagg_scenario(prompt=1000, output=10, n=1, rate=1.0, prefill=None, decode=None, link=None, **sections):
    dis = {"prefill": prefill or {}, "decode": decode or {}, "link": link or {}}
    dis.update(sections.pop("disaggregation", {}))
    workload = {"num_requests": n, "arrival": {"process": "poisson", "rate": rate},
                "prompt_len": {"dist": "fixed", "value": prompt}, "output_len": {"dist": "fixed", "value": output}}
    workload.update(sections.pop("workload", {}))
    return make_scenario(disaggregation=dis, workload=workload, **sections)


def simulate(sc, policy=0):
    metrics = Metrics(sc.policies[policy].name, sc.slo, 0.5)
    summary, sim = simulate_policy(sc, sc.policies[policy], model_spec(sc), gpu_spec(sc), metrics)
    return summary, sim


def test_bytes_per_block_follow_the_decode_pools_tensor_parallelism():
    """A decode rank reads its KV heads' share; a prefill rank serves decode TP / prefill TP of them."""
    for tp_p, tp_d, rank, busiest, total in ((1, 1, 2 * MIB, 2 * MIB, 2 * MIB), (1, 2, MIB, 2 * MIB, 2 * MIB),
                                             (2, 4, MIB // 2, MIB, 2 * MIB), (2, 2, MIB, MIB, 2 * MIB)):
        sc = disagg_scenario(prefill={"tensor_parallel_size": tp_p}, decode={"tensor_parallel_size": tp_d})
        d = disaggregation(sc, sc.policies[0])
        assert (d.rank_bytes_per_block, d.link_bytes_per_block, d.total_bytes_per_block) == (rank, busiest, total)
        assert d.rank_bytes_per_block == 16 * LLAMA8B_TOKEN_BYTES // tp_d


def test_a_sliding_window_models_pools_keep_every_layer_whole():
    """vLLM turns its hybrid KV cache manager off under a KV connector: gemma-2-9b's pools hold one
    group of all 42 layers (16 tokens x 2 x 8 KV heads x 256 x 2 B x 42 = 5,505,024 B a block), where
    its aggregated policy pages 21 layers a group (half that), and moves each layer whole."""
    sc = disagg_scenario(model={"name": "gemma-2-9b"}, engine={"max_model_len": 8192},
                         policies=[{"name": "disagg"}, {"name": "agg", "disaggregated": False}])
    d = disaggregation(sc, sc.policies[0])
    block = 16 * 2 * 8 * 256 * 2 * 42
    for pool in (d.prefill, d.decode):
        assert (pool.capacity.bytes_per_block, pool.capacity.windows) == (block, ())
        assert pool.capacity.num_blocks == int(pool.capacity.kv // block)
    assert d.total_bytes_per_block == block
    from kvsim.perf.memory import kv_capacity
    aggregated = kv_capacity(sc, sc.policies[1], model_spec(sc), gpu_spec(sc))
    assert aggregated.bytes_per_block == block // 2 and sorted(aggregated.windows) == [0, 4096]


def test_one_requests_transfer_time_by_hand():
    """1000 prompt tokens = 63 blocks of 2 MiB over InfiniBand NDR (50 GB/s a GPU), after NIXL's post
    time and the fabric's latency; nothing queues, so TTFT splits into prefill, transfer, first token."""
    summary, _ = simulate(disagg_scenario(prompt=1000))
    d = summary["disaggregation"]
    link_s = (NIXL_POST_US + RDMA_LATENCY_US) * 1e-6 + 63 * 2 * MIB / 50e9
    assert link_s == pytest.approx(0.0093474, abs=1e-7)
    tr = d["transfers"]
    assert (tr["count"], tr["blocks"], tr["tokens"]) == (1, 63, 1000)
    assert tr["bytes_all_links"] == tr["bytes_busiest_link"] == 63 * 2 * MIB
    assert tr["link_s"]["max"] == pytest.approx(link_s, rel=1e-12)
    split = {k: v["mean"] for k, v in d["ttft_split_s"].items()}
    assert split["queued"] == 0 and split["decode_wait"] == 0
    assert split["transfer"] == pytest.approx(link_s, rel=1e-9)
    assert sum(split.values()) == pytest.approx(summary["ttft_s"]["mean"], rel=1e-12)


def test_slower_link_and_heterogeneous_tp_by_hand():
    """25 GB/s, decode TP 2 over prefill TP 1: the prefill GPU's link carries both decode ranks' halves."""
    sc = disagg_scenario(prompt=4000, decode={"tensor_parallel_size": 2},
                         link={"preset": "infiniband-hdr", "overhead_us": 100, "latency_us": 0})
    summary, _ = simulate(sc)
    blocks = math.ceil(4000 / 16)
    tr = summary["disaggregation"]["transfers"]
    assert tr["blocks"] == blocks and tr["bytes_busiest_link"] == blocks * 2 * MIB
    assert tr["link_s"]["max"] == pytest.approx(100e-6 + blocks * 2 * MIB / 25e9, rel=1e-12)


def test_layerwise_streaming_leaves_the_last_layers_share():
    """Layer-wise: the read starts with the prefill, and ends the later of its own length and the
    prefill's end plus one layer's share (32 layers)."""
    whole, _ = simulate(disagg_scenario(prompt=3000))
    layer, _ = simulate(disagg_scenario(prompt=3000, disaggregation={"kv_transfer": "layerwise"}))
    link_s = whole["disaggregation"]["transfers"]["link_s"]["max"]
    prefill_s = whole["disaggregation"]["ttft_split_s"]["prefill"]["mean"]
    exposed = layer["disaggregation"]["ttft_split_s"]["transfer"]["mean"]
    assert exposed == pytest.approx(max(link_s - prefill_s, link_s / 32), rel=1e-9)
    assert layer["ttft_s"]["mean"] == pytest.approx(whole["ttft_s"]["mean"] - link_s + exposed, rel=1e-9)


def test_decode_prefix_hits_are_not_moved():
    """Requests sharing a 512-token system prompt: after the first, a decode instance's cache holds
    its 32 blocks, so only the rest of each prompt crosses the link (vLLM reads the unhashed blocks)."""
    sc = disagg_scenario(prompt=488, n=6, rate=0.5, workload={"prefix": {"num_groups": 1, "prefix_len": 512}})
    summary, _ = simulate(sc)
    tr = summary["disaggregation"]["transfers"]
    assert tr["count"] == 6
    assert tr["decode_prefix_hit_tokens"] == 5 * 512
    assert tr["tokens"] == 6 * 1000 - 5 * 512
    assert tr["blocks"] == 6 * math.ceil(1000 / 16) - 5 * 32
    assert summary["prefix_hit_rate"] == pytest.approx(5 * 512 / 6000)  # the prefill pool's hits


def _blocks_in_use(sim) -> list[int]:
    return [rep.allocator.num_used_blocks for rep in sim.replicas]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), prefill=st.integers(1, 3), decode=st.integers(1, 3),
       util=st.sampled_from([0.21, 0.9]), layerwise=st.booleans(), shared=st.booleans())
def test_every_request_and_block_accounted_for(seed, prefill, decode, util, layerwise, shared):
    """Busy pools with small KV caches (preemption, requests waiting for blocks on both sides): every
    request finishes or is rejected, its prompt KV crosses the link exactly once, the bytes are its
    blocks', and at the end no block is in use in either pool."""
    workload = {"seed": seed, "num_requests": 120, "arrival": {"process": "poisson", "rate": 40.0},
                "prompt_len": {"dist": "uniform", "min": 16, "max": 3000},
                "output_len": {"dist": "uniform", "min": 1, "max": 300}}
    if shared:
        workload["prefix"] = {"num_groups": 3, "prefix_len": 256, "fraction": 0.7}
    sc = disagg_scenario(prefill={"num_replicas": prefill}, decode={"num_replicas": decode, "gpu_memory_utilization": util},
                         disaggregation={"kv_transfer": "layerwise" if layerwise else "whole_request"},
                         workload=workload, engine={"max_model_len": 4096})
    summary, sim = simulate(sc)
    req = summary["requests"]
    assert req["finished"] + req["rejected"] == req["received"] == 120
    tr = summary["disaggregation"]["transfers"]
    assert tr["count"] == req["finished"]
    d = disaggregation(sc, sc.policies[0])
    assert tr["bytes_all_links"] == tr["blocks"] * d.total_bytes_per_block
    assert _blocks_in_use(sim) == [0] * (prefill + decode)
    assert all(not rep.scheduler.connector.held for rep in sim.prefill)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_requests_prompt_kv_crosses_the_link_once(seed, monkeypatch):
    """Per request, under preemption and shared prefixes on two decode instances: one transfer; the
    tokens it moves and those the decode cache held make its prompt; it moves its prompt's blocks less
    the decode hits'; its bytes are those blocks' (16 tokens x 128 KiB a token, every layer of the
    model's one KV group); the section's totals are the sums."""
    from kvsim.results.disaggregation import DisaggregationObserver

    seen = []
    forward = DisaggregationObserver.on_transfer
    monkeypatch.setattr(DisaggregationObserver, "on_transfer", lambda self, tr: (seen.append(tr), forward(self, tr)))
    workload = {"seed": seed, "num_requests": 150, "arrival": {"process": "poisson", "rate": 40.0},
                "prompt_len": {"dist": "uniform", "min": 1, "max": 3000}, "output_len": {"dist": "uniform", "min": 1, "max": 300},
                "prefix": {"num_groups": 2, "prefix_len": 400, "fraction": 0.8}}
    sc = disagg_scenario(decode={"num_replicas": 2, "gpu_memory_utilization": 0.21}, workload=workload,
                         engine={"max_model_len": 4096})
    summary, sim = simulate(sc)
    assert summary["preemptions"] > 0 and summary["requests"]["finished"] == 150
    ids = [tr.seq.request.request_id for tr in seen]
    assert sorted(ids) == list(range(150))
    block = 16
    for tr in seen:
        prompt = tr.seq.request.prompt_len
        assert tr.tokens + tr.decode_hit_tokens == prompt and tr.tokens >= 1
        assert tr.decode_hit_tokens % block == 0
        assert tr.blocks == math.ceil(prompt / block) - tr.decode_hit_tokens // block
        assert tr.link_s == pytest.approx((NIXL_POST_US + RDMA_LATENCY_US) * 1e-6 + tr.blocks * block * LLAMA8B_TOKEN_BYTES / 50e9,
                                          rel=1e-12)
    total = summary["disaggregation"]["transfers"]
    assert total["blocks"] == sum(tr.blocks for tr in seen) and total["tokens"] == sum(tr.tokens for tr in seen)
    assert total["bytes_all_links"] == sum(tr.blocks for tr in seen) * block * LLAMA8B_TOKEN_BYTES
    assert total["decode_prefix_hit_tokens"] == sum(tr.decode_hit_tokens for tr in seen) > 0


def test_a_request_no_pool_can_hold_is_rejected_with_a_reason():
    sc = disagg_scenario(prompt=4000, output=200, n=3, engine={"max_model_len": 4096})
    summary, _ = simulate(sc)
    assert summary["requests"]["rejected"] == 3
    (reason,) = summary["requests"]["rejected_by_reason"]
    assert reason.startswith("decode pool: prompt + output = 4200 tokens exceeds max_model_len 4096")


def test_the_aggregated_policy_of_a_disaggregated_scenario_is_unchanged():
    """A policy served aggregated gives the same summary whether or not the scenario has pools."""
    base = dict(hardware={"num_replicas": 2}, workload={"num_requests": 200, "arrival": {"process": "poisson", "rate": 12.0}})
    plain = make_scenario(**base)
    with_pools = make_scenario(policies=[{"name": "paged", "disaggregated": False}],
                               disaggregation={"decode": {"num_replicas": 2}}, **base)
    assert simulate(plain)[0] == simulate(with_pools)[0]


@pytest.mark.parametrize("sections,key", [
    (dict(decode={"gpu_memory_utilization": 0.2}, engine={"max_model_len": 131072}),
     "disaggregation.decode.gpu_memory_utilization"),
    (dict(model={"name": "Llama-3.1-70B"}, prefill={"tensor_parallel_size": 4}), "disaggregation.decode.tensor_parallel_size"),
    (dict(prefill={"tensor_parallel_size": 2}), "disaggregation.decode.tensor_parallel_size: 1 is not a multiple"),
    (dict(decode={"gpu": "L40S", "tensor_parallel_size": 2}, model={"name": "Llama-3.1-70B"},
          prefill={"tensor_parallel_size": 2}), "does not fit on L40S"),
    (dict(engine={"async_scheduling": True}), "engine.async_scheduling: a disaggregated policy is scheduled synchronously"),
])
def test_impossible_layouts_are_refused_in_one_line_naming_the_key(sections, key):
    sc = disagg_scenario(**sections)
    with pytest.raises(KvsimError) as err:
        check_deployments(sc, model_spec(sc), gpu_spec(sc), sc.policies)
    message = str(err.value)
    assert key in message and "\n" not in message, message


def test_a_link_of_zero_bandwidth_is_refused_naming_the_key():
    with pytest.raises(KvsimError, match=r"disaggregation\.link\.bandwidth_gbps: must be greater than 0"):
        disagg_scenario(link={"bandwidth_gbps": 0})


def test_link_presets_state_their_source_and_line_rate():
    for spec in LINKS.values():
        assert spec.source and spec.bandwidth_gbps > 0
    assert LINKS["infiniband-ndr"].bandwidth_gbps == 400 / 8
    assert np.isclose(LINKS["nvlink4"].transfer_s(450e9), 1 + (NIXL_POST_US + 2.0) * 1e-6)


def test_sweep_takes_the_pools_keys():
    """`kvsim sweep --set disaggregation.decode.num_replicas=1,2`: a row per point and policy, the
    second decode instance halving the decode batch (a lower TPOT)."""
    from kvsim.planning.sweep import sweep

    sc = disagg_scenario(prompt=600, output=200, n=300, rate=20.0)
    result = sweep(sc, {"disaggregation.decode.num_replicas": [1, 2]}, workers=1)
    rows = {r["disaggregation.decode.num_replicas"]: r for r in result.rows}
    assert set(rows) == {1, 2} and rows[2]["tpot_p99_ms"] < rows[1]["tpot_p99_ms"]


def test_the_answer_pages_cost_of_a_disaggregated_policy_is_its_pools():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))
    from kvdash.answers import hourly_cost

    sc = disagg_scenario(prefill={"num_replicas": 2}, decode={"gpu": "H200", "tensor_parallel_size": 2},
                         policies=[{"name": "agg", "disaggregated": False}, {"name": "pd"}])
    assert hourly_cost(sc)[0] == pytest.approx(2.99)  # [hardware]: one H100
    assert hourly_cost(sc, sc.policies[0])[0] == pytest.approx(2.99)
    assert hourly_cost(sc, sc.policies[1])[0] == pytest.approx(2 * 2.99 + 2 * 3.79)


@pytest.mark.parametrize("think", [0.0, 0.2])
def test_a_closed_loop_served_disaggregated_fuses_as_step_by_step(monkeypatch, think):
    """Clients (vllm bench --max-concurrency 16) on 1 prefill + 2 decode instances: every request
    ends, never more than 16 in flight, and fused decode runs (bounded by what a step elsewhere can
    release: Simulation.arrival_bound) give each request what one step per event gives; without
    think time, bounded by the source's next send alone, they do not (the bound has teeth)."""
    from kvsim.backends.analytic import AnalyticBackend
    from kvsim.engine.simulator import Simulation
    from test_simulation import assert_same_requests, per_request

    workload = {"num_requests": 160, "arrival": {"process": "immediate", "rate": None}, "max_concurrency": 16,
                "think_time_s": {"dist": "fixed", "value": think}, "prompt_len": {"dist": "uniform", "min": 50, "max": 1500},
                "output_len": {"dist": "uniform", "min": 5, "max": 200}}
    sc = disagg_scenario(decode={"num_replicas": 2}, workload=workload)
    fused, fused_sum = per_request(monkeypatch, sc)
    s = fused_sum["paged"]
    assert s["requests"]["finished"] == 160 and s["clients"]["peak_in_flight"] == 16
    assert s["disaggregation"]["transfers"]["count"] == 160
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain, plain_sum = per_request(monkeypatch, sc)
    assert_same_requests(fused, plain)
    assert s["engine_steps"] == plain_sum["paged"]["engine_steps"] and s["engine_events"] < s["engine_steps"]
    if think == 0:
        monkeypatch.undo()
        monkeypatch.setattr(Simulation, "arrival_bound", lambda self, rep, now: self.source.next_time)
        unbounded, _ = per_request(monkeypatch, sc)
        assert any(unbounded[k][:2] != pytest.approx(plain[k][:2], rel=1e-9) for k in plain)


def test_the_runs_pricing_basis_is_its_pools():
    """summary.json's meta labels a run by the pools that serve it: measured kernels on H100 for both,
    estimated (naming the decode pool) when the decode pool runs on a GPU without kernel tables, and
    [hardware]'s basis joins in when a policy is served aggregated."""
    from kvsim.pipeline import run_meta

    def meta(**kw):
        sc = disagg_scenario(**kw)
        return run_meta(sc, model_spec(sc), gpu_spec(sc))

    both = meta()
    assert both["pricing_basis"]["label"] == "measured" and both["pricing_basis"]["pricing"] == "measured"
    assert both["disaggregation"]["decode"]["pricing_basis"] == both["pricing_basis"]
    l40s = meta(decode={"gpu": "L40S"})
    assert l40s["pricing_basis"]["label"] == "estimated" and l40s["pricing_basis"]["why"].startswith("decode pool: ")
    assert l40s["disaggregation"]["prefill"]["pricing_basis"]["label"] == "measured"
    mixed = meta(hardware={"gpu": "L40S"}, policies=[{"name": "agg", "disaggregated": False}, {"name": "pd"}])
    assert mixed["pricing_basis"]["why"].startswith("hardware: ") and mixed["pricing_basis"]["label"] == "estimated"


def test_plans_pricing_basis_is_the_pools():
    """kvsim plan's meta labels a disaggregated scenario as a run does: by its pools."""
    from kvsim.planning.capacity import plan

    sc = disagg_scenario(prompt=300, output=50, n=60, rate=5.0, decode={"gpu": "L40S"})
    basis = plan(sc, seeds=1, resolution=0.2, workers=1).meta["pricing_basis"]
    assert basis["label"] == "estimated" and basis["why"].startswith("decode pool: ")
