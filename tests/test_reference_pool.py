"""Whole simulations on the allocator's specification (kvsim.engine.reference_pool) give the fast
BlockManager's results: every request's times and counts, every figure, every time-series row.

The step-by-step check is the Hypothesis machine in test_block_manager.py; here the scheduler, the
decode cohort (reserve, claim, note_written), preemption and the fused runs' evictions read ahead
(evictions_ahead) all go through the KVAllocator interface on both. Prefix groups run without
chunked prefill: concurrent chunked prefills can cache the same content twice, and then
BlockManager may hit another copy than vLLM's first registered one (the licensed difference).
"""

import pytest

from kvsim.engine import replica
from kvsim.engine.reference_pool import ReferencePool

from conftest import make_scenario, per_request

TIGHT = {"memory_gib": 20.0}  # Llama-3.1-8B on 20 GiB: about 970 blocks, memory binds
BUSY = {"num_requests": 400, "arrival": {"rate": 50.0},
        "prompt_len": {"dist": "uniform", "min": 200, "max": 1500},
        "output_len": {"dist": "uniform", "min": 50, "max": 400}}
GROUPS = {"num_requests": 400, "arrival": {"rate": 30.0},
          "prompt_len": {"dist": "uniform", "min": 100, "max": 900},
          "output_len": {"dist": "uniform", "min": 20, "max": 300},
          "prefix": {"num_groups": 4, "prefix_len": 1024, "fraction": 0.8}}
CASES = {
    "preemptions, chunked prefill": dict(hardware=TIGHT, workload=BUSY),
    "swap preemption": dict(hardware=TIGHT, workload=BUSY, engine={"preemption_mode": "swap", "swap_space": 0.5}),
    "prefix groups, evictions": dict(hardware=TIGHT, workload=GROUPS,
                                     policies=[{"name": "paged", "enable_chunked_prefill": False}]),
    "prefix groups, two replicas": dict(hardware={"num_replicas": 2, "router": "prefix_affinity", **TIGHT},
                                        workload=GROUPS, policies=[{"name": "paged", "enable_chunked_prefill": False}]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulations_on_the_specification_match_block_manager(monkeypatch, case):
    sc = make_scenario(**CASES[case])
    fast, fast_sum = per_request(monkeypatch, sc)
    monkeypatch.setitem(replica.ALLOCATORS, "paged", lambda settings, num_blocks: ReferencePool(
        num_blocks, settings.block_size, settings.enable_prefix_caching))
    spec, spec_sum = per_request(monkeypatch, sc)
    assert fast == spec and len(fast) > 50
    for name, s in fast_sum.items():
        backend = s.pop("backend"), spec_sum[name].pop("backend")
        assert backend[0] == backend[1]
        assert s == spec_sum[name], name
    figures = fast_sum["paged"]
    assert figures["preemptions"] > 0 or figures["prefix_hit_rate"] > 0.1  # something to get wrong
