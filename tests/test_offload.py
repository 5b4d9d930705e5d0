"""KV offload tiers behind the KV connector (issue 28): the tier against its plain specification, the
host link's prices by hand, loads and stores conserved in whole simulations, and bad input."""

import math
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import make_scenario
from kvsim.engine.host_link import host_links
from kvsim.engine import lru_tier
from kvsim.engine.offload_tier import make_tier
from kvsim.engine.tier_reference import ReferenceTier

KEYS = st.integers(0, 11)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["lru", "arc"]), capacity=st.integers(1, 6), threshold=st.sampled_from([0, 2, 3]),
       ops=st.lists(st.tuples(st.sampled_from(["lookup", "touch", "store", "complete", "load", "unload"]),
                              st.lists(KEYS, min_size=1, max_size=5, unique=True)), max_size=60))
def test_the_tier_is_its_specification(policy, capacity, threshold, ops):
    """LRU and ARC as vLLM v0.26.0 keeps them: the same answers and contents as the plain specification
    after every operation (stores, their completion, loads holding blocks, reuse gating)."""
    tier = make_tier(capacity, policy, threshold, max_tracker_size=8)
    ref = ReferenceTier(capacity, policy, threshold, max_tracker_size=8)
    loading: list = []
    for op, keys in ops:
        if op == "lookup":
            assert tier.lookup(keys) == ref.lookup(keys)
        elif op == "touch":
            tier.touch(keys)
            ref.touch(keys)
        elif op == "store":
            assert tier.prepare_store(keys) == ref.prepare_store(keys)
        elif op == "complete":
            tier.complete_store(keys)
            ref.complete_store(keys)
        elif op == "load":
            ready = keys[:tier.lookup(keys)]
            ref.lookup(keys)
            tier.prepare_load(ready)
            ref.prepare_load(ready)
            loading.append(ready)
        elif loading:
            done = loading.pop(0)
            tier.complete_load(done)
            ref.complete_load(done)
        assert tier.keys() == ref.keys()
        assert len(tier) <= capacity
        if policy == "arc":
            assert (list(tier.policy.b1), list(tier.policy.b2)) == (ref.b1, ref.b2)
            assert tier.policy.target_t1 == ref.target


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(1, 12), threshold=st.sampled_from([0, 2]),
       ops=st.lists(st.tuples(st.sampled_from(["lookup", "touch", "store", "complete", "load", "unload"]),
                              st.lists(st.integers(0, 24), min_size=1, max_size=8, unique=True)), max_size=80))
def test_the_lru_tier_in_arrays_is_its_specification(capacity, threshold, ops):
    """The numpy LRU tier with its growth, eviction windows and index rebuilds made tiny: the same answers
    and order as the plain specification, and its bulk resolution (sorted index, recent inserts, slots
    remembered from before) always the dict's."""
    keys_of = {k: (k * 0x9E3779B97F4A7C15) % (1 << 64) if k % 3 else (1 << 70) | k for k in range(25)}  # some > 64 bits
    with patch.object(lru_tier, "REINDEX", 3), patch.object(lru_tier, "WINDOW", 2), \
            patch.object(lru_tier, "SORTED_NEEDLES", 2), patch.object(lru_tier, "INITIAL_SLOTS", 1):
        tier = make_tier(capacity, "lru", threshold, max_tracker_size=8, arrays=True)
        assert isinstance(tier, lru_tier.LRUTier)
        ref = ReferenceTier(capacity, "lru", threshold, max_tracker_size=8)
        loading, remembered = [], {}
        for op, small in ops:
            keys = [keys_of[k] for k in small]
            folded = lru_tier.fold_keys(keys)
            fresh = tier.resolve(keys)
            assert tier.resolve(keys, folded).tolist() == fresh.tolist()
            if tuple(keys) in remembered:  # slots found earlier, revalidated
                assert tier.resolve(keys, folded, remembered[tuple(keys)].copy()).tolist() == fresh.tolist()
            remembered[tuple(keys)] = fresh
            if op == "lookup":
                assert tier.lookup(keys) == ref.lookup(keys)
            elif op == "touch":
                tier.touch(keys, fresh)
                ref.touch(keys)
            elif op == "store":
                assert tier.prepare_store(keys) == ref.prepare_store(keys)
            elif op == "complete":
                tier.complete_store(keys)
                ref.complete_store(keys)
            elif op == "load":
                ready = keys[:tier.lookup(keys)]
                ref.lookup(keys)
                tier.prepare_load(ready)
                ref.prepare_load(ready)
                loading.append(ready)
            elif loading:
                done = loading.pop(0)
                tier.complete_load(done)
                ref.complete_load(done)
            assert tier.keys() == ref.keys()
            assert tier.num_evictable == sum(tier.ref_of(k) == 0 for k in tier.keys())


def test_a_transfer_costs_its_bytes_over_the_bandwidth_and_the_latency():
    """3 blocks of 2 MiB at 50 GB/s plus 10 us, by hand; a second queued behind it; the other direction
    busy meanwhile: the overlapping bytes at 83.4 / 2 GB/s."""
    h2d, d2h = host_links(50.0, 50.0, 83.4, 10e-6)
    nbytes = 3 * 2 * 2**20
    assert h2d.transfer(1.0, nbytes) == (1.0, pytest.approx(1.0 + 10e-6 + nbytes / 50e9))
    first_end = 1.0 + 10e-6 + nbytes / 50e9
    start, end = h2d.transfer(1.0, nbytes)
    assert start == first_end and end == pytest.approx(first_end + 10e-6 + nbytes / 50e9)
    _, d_end = d2h.transfer(1.0, nbytes)  # h2d busy until `end`: all of it overlaps
    assert d_end == pytest.approx(1.0 + 10e-6 + nbytes / 41.7e9)
    assert h2d.bytes == 2 * nbytes and h2d.count == 2


def _offload_dict(**over) -> dict:
    base = {"engine": {"enable_prefix_caching": False, "max_num_batched_tokens": 16384, "max_model_len": 32768},
            "kv_offload": {"kv_offloading_size": 40.0},
            "workload": {"seed": 1, "num_requests": 2, "arrival": {"process": "deterministic", "rate": 0.5},
                         "prompt_len": {"dist": "fixed", "value": 16}, "output_len": {"dist": "fixed", "value": 4},
                         "prefix": {"num_groups": 1, "prefix_len": 8192}}}
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


def _offload_scenario(**over):
    return make_scenario(**_offload_dict(**over))


def _run(sc):
    from kvsim.pipeline import simulate_policy
    from kvsim.results.metrics import Metrics
    from kvsim.scenario.catalog import gpu_spec, model_spec

    metrics = Metrics(sc.policies[0].name, sc.slo, 1.0)
    return simulate_policy(sc, sc.policies[0], model_spec(sc), gpu_spec(sc), metrics)


def test_a_second_request_loads_the_first_ones_prompt_by_hand():
    """Two prompts of the same 8,192 tokens and 16 of their own, 2 s apart, GPU prefix caching off (the
    blog's setup): the first stores its 513 blocks, the second loads the 512 shared ones at 2 MiB a block
    over 50 GB/s plus 10 us, then computes and stores its own block."""
    summary, sim = _run(_offload_scenario())
    off = summary["kv_offload"]
    block = 16 * 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B: 16 tokens x 32 layers x 8 KV heads x 128 x K,V x bf16
    assert off["bytes_per_block_per_gpu"] == block
    assert off["stores"]["blocks"] == 514 and off["stores"]["bytes"] == 514 * block
    assert off["loads"]["blocks"] == 512 and off["loads"]["bytes"] == 512 * block
    assert off["loads"]["transfer_s"] == pytest.approx(10e-6 + 512 * block / 50e9)
    assert off["tokens"]["cpu_hits"] == 8192 and off["hit_rate"]["cpu"] == pytest.approx(8192 / (2 * 8208))
    second = sim.replicas[0].connector  # the second request ran after its load: TTFT = wait for the
    assert not second.loads  # step boundary + load + one 16-token step
    assert summary["requests"]["finished"] == 2


@pytest.mark.parametrize("policy,threshold,disk", [("lru", 0, False), ("arc", 0, False), ("lru", 2, True)])
def test_loads_and_stores_are_conserved(policy, threshold, disk):
    """A busy run with shared prefixes on a small GPU cache and a small CPU tier: every request ends,
    every stored block's bytes are its blocks', every loaded block was a hit, nothing is left held."""
    kv = {"kv_offloading_size": 2.0, "eviction_policy": policy, "store_threshold": threshold}
    if disk:
        kv["disk"] = {"size_gib": 4.0}
    sc = _offload_scenario(kv_offload=kv, hardware={"gpu_memory_utilization": 0.25},
                           engine={"enable_prefix_caching": True, "max_model_len": 8192},
                           workload={"num_requests": 150, "arrival": {"process": "poisson", "rate": 20.0},
                                     "prompt_len": {"dist": "uniform", "min": 64, "max": 6000},
                                     "output_len": {"dist": "uniform", "min": 1, "max": 200},
                                     "prefix": {"num_groups": 6, "prefix_len": 2048, "fraction": 0.8}})
    summary, sim = _run(sc)
    off, block = summary["kv_offload"], summary["kv_offload"]["bytes_per_block_per_gpu"]
    assert summary["requests"]["finished"] == 150
    assert off["stores"]["bytes"] == off["stores"]["blocks"] * block
    assert off["loads"]["bytes"] == off["loads"]["blocks"] * block  # block-aligned GPU hits: whole blocks
    assert off["loads"]["blocks"] * 16 == off["tokens"]["cpu_hits"] + off["tokens"]["disk_hits"]
    assert off["tokens"]["cpu_hits"] > 0
    for rep in sim.replicas:
        c = rep.connector
        assert not c.loads and not c.cpu.in_use(c.cpu.keys()) and c.num_held == 0  # no load reads a block
        assert rep.allocator.num_used_blocks == 0
        assert c.cpu.num_evictable + c.cpu.num_pending + sum(c.cpu.ref_of(k) > 0 for k in c.cpu.keys()) == len(c.cpu)
        assert c.cpu.num_evictable == sum(c.cpu.ref_of(k) == 0 for k in c.cpu.keys())
    if disk:
        assert off["promotions"]["blocks"] >= 0 and off["disk_writes"]["blocks"] > 0


def test_the_gpu_only_policy_of_an_offload_scenario_is_unchanged():
    """kv_offload = false runs exactly as a scenario without the section."""
    from kvsim.pipeline import run_scenario

    plain = make_scenario(**{k: v for k, v in _offload_dict().items() if k != "kv_offload"})
    off = _offload_scenario(policies=[{"name": "paged", "kv_offload": False}])
    a = run_scenario(plain, write=False).summaries["paged"]
    b = run_scenario(off, write=False).summaries["paged"]
    assert a == b and "kv_offload" not in b


@settings(max_examples=200, deadline=None)
@given(refs=st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=9), capacity=st.integers(0, 3))
def test_belady_is_the_best_any_policy_gets(refs, capacity):
    """Belady's MIN with bypass, where only counted references hit, against trying every choice."""
    import numpy as np

    from kvsim.engine.belady import belady_hits, brute_force

    ids, counted = [r[0] for r in refs], [int(r[1]) for r in refs]
    assert belady_hits(np.array(ids, dtype=np.int64), np.array(counted, dtype=bool), capacity) == \
        brute_force(ids, counted, capacity)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_the_optimal_bound_is_never_below_the_simulated_hit_rate(policy):
    sc = _offload_scenario(kv_offload={"kv_offloading_size": 1.0, "eviction_policy": policy},
                           hardware={"gpu_memory_utilization": 0.25},
                           engine={"enable_prefix_caching": True, "max_model_len": 8192},
                           workload={"num_requests": 200, "arrival": {"process": "poisson", "rate": 15.0},
                                     "prompt_len": {"dist": "uniform", "min": 64, "max": 3000},
                                     "output_len": {"dist": "uniform", "min": 1, "max": 100},
                                     "prefix": {"num_groups": 12, "prefix_len": 1536, "fraction": 0.9}})
    off = _run(sc)[0]["kv_offload"]
    opt = off["optimal"]
    assert opt["simulated_cpu_hit_rate"] == off["hit_rate"]["cpu"]
    assert opt["cpu_hit_rate"] >= opt["simulated_cpu_hit_rate"] > 0


OFFLOAD_BAD = {
    "tier larger than the host": ("kv_offloading_size = 5000", ("kv_offload.kv_offloading_size", "host memory")),
    "zero bandwidth": ("kv_offloading_size = 8\nh2d_gbps = 0", ("kv_offload.h2d_gbps", "at least")),
    "block not a multiple": ("kv_offloading_size = 8\nblock_size = 24", ("kv_offload.block_size", "multiple")),
    "contiguous allocator": ("kv_offloading_size = 8\n[[policies]]\nname = \"slab\"\nallocator = \"contiguous\"\n"
                             "enable_chunked_prefill = false\nkv_offload = true", ("policies[2].kv_offload", "paged")),
}


@pytest.mark.parametrize("case", sorted(OFFLOAD_BAD))
def test_bad_offload_input_is_one_line_naming_the_key(tmp_path, capsys, case):
    from test_cli import GOOD, assert_one_line_error, run_cli

    section, names = OFFLOAD_BAD[case]
    text = GOOD.format(engine="", rate="20.0", workload="") + "[kv_offload]\n" + section + "\n"
    path = tmp_path / "in" / "s.toml"
    path.parent.mkdir()
    path.write_text(text)
    code, _, err = run_cli(capsys, path, "--out", tmp_path / "out" / "res", "--quiet")
    assert_one_line_error(code, err, "s.toml", *names)
    assert not (tmp_path / "out").exists()


def test_offload_of_a_hybrid_kv_cache_is_refused(tmp_path, capsys):
    """gemma-2-9b keeps a 4,096-token window in half its layers (vLLM's hybrid KV cache)."""
    from test_cli import assert_one_line_error, run_cli

    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "gemma-2-9b"\n[engine]\nmax_model_len = 8192\n[[policies]]\nname = "p"\n'
                    '[workload]\nnum_requests = 5\narrival = { process = "poisson", rate = 1.0 }\n'
                    'prompt_len = { dist = "fixed", value = 100 }\noutput_len = { dist = "fixed", value = 5 }\n'
                    '[kv_offload]\nkv_offloading_size = 8\n')
    code, _, err = run_cli(capsys, path, "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(code, err, "s.toml", "kv_offload", "sliding window")


def test_a_load_delays_its_request_not_the_engine(monkeypatch):
    """The first request decodes 3,000 tokens; the second, 2 s later, loads its 8,192 shared tokens from the
    CPU tier (512 blocks, ~21 ms) while the first keeps decoding: the second's first token comes after its
    load has ended, within two steps of it; no gap of the first's tokens grows by the load."""
    from conftest import per_request

    sc = _offload_scenario(workload={"output_len": {"dist": "fixed", "value": 3000}})
    rows, summaries = per_request(monkeypatch, sc)
    off = summaries["paged"]["kv_offload"]
    load_s = off["loads"]["transfer_s"]
    ttft_second = rows[("paged", 1)][0]
    assert off["loads"]["count"] == 1 and load_s > 0.015
    assert load_s < ttft_second < load_s + 0.1
    assert summaries["paged"]["itl_s"]["max"] < load_s  # the decoding request never waited for the load


def test_the_oracle_knows_each_blocks_next_use_by_hand():
    """Admissions 0..3 on one replica: (keys, GPU-hit blocks); a key's next use is the first admission at or
    after now that looked it up past its GPU hits."""
    import numpy as np

    from kvsim.engine.belady_tier import NEVER, BeladyTier, Future

    k = np.array([10, 20, 30, 40], dtype=np.uint64)
    future = Future([(k[[0, 1]], 0), (k[[0, 2]], 1), (k[[1]], 0), (k[[0, 3]], 0)])  # 10 at 0 and 3 (held at 1)
    assert future.next_use(k, 0).tolist() == [0, 0, 1, 3]
    assert future.next_use(k, 1).tolist() == [3, 2, 1, 3]
    assert future.next_use(k, 4).tolist() == [NEVER] * 4
    assert future.next_use(np.array([99], dtype=np.uint64), 0).tolist() == [NEVER]
    now = [2]
    tier = BeladyTier(3, future, lambda: now[0])
    for key in (10, 20, 30):
        tier.prepare_store([key])
        tier.complete_store([key])
    # at admission 2: 20 is used at 2, 10 at 3, 30 never again: 30 goes, then 10
    assert tier.prepare_store([40]) == [40] and tier.keys() == [10, 20, 40]
    tier.complete_store([40])
    assert tier.prepare_store([50]) == [50] and sorted(tier.keys()) == [20, 40, 50]


def test_the_oracle_rerun_gives_the_ttft_a_better_eviction_would():
    """48 system prompts cycling through a CPU tier a third their size: LRU evicts each one just before
    its reuse (no CPU hit), the oracle keeps a part of them: more hits, a lower TTFT."""
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario

    sc = load_scenario("scenarios/offload_sizing.toml", ["kv_offload.kv_offloading_size=8",
                                                         "kv_offload.optimal_ttft=true", "workload.num_requests=600"])
    summary = run_scenario(sc, policies=["cpu-tier"], write=False).summaries["cpu-tier"]
    opt = summary["kv_offload"]["optimal"]
    assert opt["simulated_cpu_hit_rate"] == summary["kv_offload"]["hit_rate"]["cpu"]
    assert opt["oracle_cpu_hit_rate"] > opt["simulated_cpu_hit_rate"]
    assert opt["cpu_hit_rate"] >= opt["oracle_cpu_hit_rate"]
    assert opt["ttft_ms"]["mean"] < opt["simulated_ttft_ms"]["mean"]
    assert opt["simulated_ttft_ms"]["mean"] == pytest.approx(summary["ttft_s"]["mean"] * 1e3, rel=1e-9)
