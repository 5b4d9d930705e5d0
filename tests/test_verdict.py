"""SLO figures at the percentile (nearest rank, rejected requests infinitely late), the verdict and
the binding constraint it names, on hand-made summaries and on small real simulations."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_scenario
from kvsim.results.distributions import nearest_rank
from kvsim.results.metrics import Metrics
from kvsim.results.verdict import judge
from kvsim.pipeline import run_scenario
from kvsim.scenario.config import SloConfig
from kvsim.sequence import Request, Sequence


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e3), max_size=40), st.integers(0, 10), st.floats(0.5, 100.0))
def test_nearest_rank_against_brute_force(values, missing, q):
    everything = sorted(values) + [math.inf] * missing
    if not everything:
        assert nearest_rank(np.array(values), missing, q) is None
        return
    # the smallest x with at least q% of all values <= x
    want = next(x for x in everything if sum(v <= x for v in everything) * 100 >= q * len(everything) - 1e-6)
    got = nearest_rank(np.array(values, dtype=np.float64), missing, q)
    assert (got is None) if want == math.inf else got == want


def finished(rid, ttft, tpot, n_out=11, arrival=0.0):
    seq = Sequence(Request(rid, arrival, 100, n_out))
    seq.first_scheduled_time = arrival
    seq.first_token_time = arrival + ttft
    seq.finish_time = seq.first_token_time + tpot * (n_out - 1)
    seq.num_output_tokens = n_out
    return seq


def summary_of(slo, ttfts, tpot=0.02, rejected=0):
    m = Metrics("p", slo, 1.0)
    for i, t in enumerate(ttfts):
        m.on_finish(finished(i, t, tpot, arrival=float(i)))
    for j in range(rejected):
        seq = Sequence(Request(100 + j, 0.5, 10**6, 8))
        seq.reject_reason, seq.finish_time = "too long", 0.5
        m.on_reject(seq)
    return m.summary(duration_s=20.0, num_blocks=10, block_size=16, bytes_per_block=1024)


def test_figures_at_the_percentile_count_rejections_as_misses():
    slo = SloConfig(ttft_ms=500, tpot_ms=30, percentile=80)
    ttfts = [0.1, 0.2, 0.3, 0.4, 0.45, 0.6, 0.7, 0.8]  # 8 finished + 2 rejected: p80 is rank 8 of 10
    s = summary_of(slo, ttfts, rejected=2)
    assert s["slo"]["at_percentile"]["ttft_ms"] == pytest.approx(800.0)
    assert s["slo"]["served_fraction"] == pytest.approx(0.8)
    v = judge(s)
    assert not v.met and v.checks[0].label == "TTFT p80" and v.checks[0].margin == pytest.approx(1 - 800 / 500)
    # three rejections of ten: p80 lies among the rejected, beyond any finite value
    s3 = summary_of(slo, ttfts[:7], rejected=3)
    assert s3["slo"]["at_percentile"]["ttft_ms"] is None and not judge(s3).met and judge(s3).margin is None
    # all finished and fast: met, and the worst margin is TPOT's (20 of 30 ms)
    ok = judge(summary_of(slo, [0.1] * 10))
    assert ok.met and ok.margin == pytest.approx(1 - 20 / 30) and ok.worst.key == "tpot_ms"


def test_token_level_itl_is_judged_apart_from_tpot():
    slo = SloConfig(ttft_ms=None, tpot_ms=100, itl_ms=60, percentile=99)
    m = Metrics("p", slo, 1.0)
    m.on_finish(finished(0, 0.1, 0.05))  # TPOT 50 ms: a good request
    m.record_itl(0.02, 95)
    m.record_itl(0.5, 5)  # 5% of the gaps are 500 ms stalls: token-level p99 is a stall
    s = m.summary(duration_s=2.0, num_blocks=10, block_size=16, bytes_per_block=1024)
    assert s["slo_attainment"] == 1.0  # per request, every bound holds
    v = judge(s)
    assert not v.met and [c.key for c in v.checks if not c.met] == ["itl_ms"]


def overloaded(**sections):
    base = {"workload": {"seed": 3, "num_requests": 160, "arrival": {"process": "poisson", "rate": 40.0},
                         "prompt_len": {"dist": "fixed", "value": 512}, "output_len": {"dist": "fixed", "value": 256}}}
    for key, value in sections.items():
        base[key] = value
    return make_scenario(**base)


def test_verdict_names_the_kv_cache_when_blocks_run_out():
    # About 2,900 KV tokens (0.35 GiB left for the cache): three 768-token requests at most, max_num_seqs 64.
    sc = overloaded(engine={"max_model_len": 2048, "max_num_seqs": 64, "activation_reserve_gib": 55.6})
    s = run_scenario(sc, write=False).summaries["paged"]
    v = judge(s)
    assert s["kv"]["num_blocks"] * 16 < 3000 and s["peak_running"] < 64
    assert v.binding == "kv_cache" and not v.sustainable, v.binding_detail


def test_verdict_names_max_num_seqs_when_the_running_queue_is_full():
    sc = overloaded(engine={"max_model_len": 2048, "max_num_seqs": 4})
    s = run_scenario(sc, write=False).summaries["paged"]
    v = judge(s)
    assert s["peak_running"] == 4 and s["kv"]["peak_used_fraction"] < 0.05
    assert v.binding == "max_num_seqs" and not v.sustainable, v.binding_detail
    assert "held waiting requests back" in v.binding_detail and "peak running 4 of 4" in v.binding_detail
