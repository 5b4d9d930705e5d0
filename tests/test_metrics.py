"""Metrics: exact latency statistics, SLO goodput, the ITL histogram, time-series bucketing, summary."""

import csv
import io
import json
import math

import numpy as np
import pytest

from kvsim.results.distributions import LogHistogram
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS, Metrics
from kvsim.scenario.config import SloConfig
from kvsim.sequence import Request, Sequence

NO_SLO = SloConfig(ttft_ms=None, tpot_ms=None, itl_ms=None, e2e_ms=None)


def make_seq(rid, arrival, first_token, finish, out, *, prompt=100, scheduled=None, cached=0, preempt=0):
    seq = Sequence(Request(rid, arrival, prompt, out))
    seq.first_scheduled_time = arrival if scheduled is None else scheduled
    seq.first_token_time, seq.finish_time = first_token, finish
    seq.num_output_tokens, seq.num_cached_tokens, seq.num_preemptions = out, cached, preempt
    return seq


def summarize(m, duration=10.0, num_blocks=100):
    return m.summary(duration_s=duration, num_blocks=num_blocks, block_size=16, bytes_per_block=1024)


def sample(m, t, replica=0, *, running=0, waiting=0, used=0, batch=0):
    m.sample(t, m.series(replica), running=running, waiting=waiting, swapped=0, blocks_used=used, blocks_cached=1,
             blocks_free=100 - used, reserved_unused_tokens=0, batch_tokens=batch)


# (arrival, first_token, finish, output_tokens)
REQS = [(0.0, 0.5, 2.5, 5), (1.0, 1.2, 1.2, 1), (2.0, 3.0, 7.0, 9), (2.5, 2.6, 3.6, 11), (4.0, 6.0, 6.0, 1)]


def test_exact_latency_stats():
    m = Metrics("p", NO_SLO, 1.0)
    for i, r in enumerate(REQS):
        m.on_finish(make_seq(i, *r))
    s = summarize(m)
    ttft = [0.5, 0.2, 1.0, 0.1, 2.0]
    e2e = [2.5, 0.2, 5.0, 1.1, 2.0]
    tpot = [2.0 / 4, 4.0 / 8, 1.0 / 10]  # one-token requests have no inter-token gap
    for key, ref in (("ttft_s", ttft), ("e2e_s", e2e), ("tpot_s", tpot)):
        assert s[key]["mean"] == pytest.approx(np.mean(ref))
        assert s[key]["max"] == pytest.approx(max(ref))
        for q in (50, 90, 99):
            assert s[key][f"p{q}"] == pytest.approx(np.percentile(ref, q))
    assert s["ttft_s"]["p50"] == pytest.approx(0.5)  # middle of 0.1 0.2 0.5 1.0 2.0
    assert s["requests"] == {"received": 5, "finished": 5, "rejected": 0, "rejected_by_reason": {}}


def test_throughput_preemptions_prefix_hits():
    m = Metrics("p", NO_SLO, 1.0)
    m.on_finish(make_seq(0, 0.0, 1.0, 2.0, 10, prompt=200, cached=64, preempt=2))
    m.on_finish(make_seq(1, 0.0, 1.0, 3.0, 30, prompt=300, cached=0, preempt=1))
    s = summarize(m, duration=4.0)
    assert s["throughput"]["requests_per_s"] == pytest.approx(2 / 4)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(40 / 4)
    assert s["throughput"]["total_tokens_per_s"] == pytest.approx(540 / 4)
    assert s["preemptions"] == 3
    assert s["prefix_hit_rate"] == pytest.approx(64 / 500)


def test_goodput_matches_hand_count():
    slo = SloConfig(ttft_ms=500, tpot_ms=50, e2e_ms=None)
    m = Metrics("p", slo, 1.0)
    m.on_finish(make_seq(0, 0.0, 0.4, 0.4 + 9 * 0.04, 10))  # ttft 400 ms, tpot 40 ms: good
    m.on_finish(make_seq(1, 0.0, 0.6, 0.6 + 9 * 0.01, 10))  # ttft 600 ms: misses
    m.on_finish(make_seq(2, 0.0, 0.1, 0.1 + 9 * 0.06, 10))  # tpot 60 ms: misses
    m.on_finish(make_seq(3, 0.0, 0.5, 0.5, 1))  # ttft exactly 500 ms, no tpot: good
    m.on_finish(make_seq(4, 5.0, 5.2, 5.2 + 99 * 0.05, 100))  # tpot exactly 50 ms, long e2e (no bound): good
    rejected = make_seq(5, 1.0, -1.0, 1.0, 0, scheduled=-1.0)
    rejected.reject_reason = "prompt_too_long"
    m.on_reject(rejected)
    s = summarize(m, duration=8.0)
    assert s["goodput_rps"] == pytest.approx(3 / 8)
    assert s["slo_attainment"] == pytest.approx(3 / 6)
    assert s["requests"]["rejected_by_reason"] == {"prompt_too_long": 1}


def test_slo_bounds_none_are_ignored():
    reqs = [make_seq(0, 0.0, 5.0, 50.0, 10), make_seq(1, 0.0, 0.1, 0.2, 2)]
    for slo, good in ((NO_SLO, 2), (SloConfig(ttft_ms=None, tpot_ms=None, e2e_ms=1000), 1),
                      (SloConfig(ttft_ms=None, tpot_ms=1000, e2e_ms=None), 1)):
        m = Metrics("p", slo, 1.0)
        for seq in reqs:
            m.on_finish(seq)
        assert summarize(m, duration=1.0)["goodput_rps"] == pytest.approx(good), slo


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_itl_histogram_percentiles_within_one_percent(seed):
    rng = np.random.default_rng(seed)
    gaps = rng.lognormal(mean=math.log(0.02), sigma=1.5, size=3000)
    counts = rng.integers(1, 50, size=3000)
    m = Metrics("p", NO_SLO, 1.0)
    for g, c in zip(gaps, counts):
        m.record_itl(float(g), int(c))
    exact = np.repeat(gaps, counts)
    itl = summarize(m)["itl_s"]
    for q in (50, 90, 99):
        ref = np.percentile(exact, q)
        assert abs(itl[f"p{q}"] - ref) <= 0.01 * ref, q
    assert itl["mean"] == pytest.approx(exact.mean(), rel=1e-9)
    assert itl["max"] == exact.max()


def test_itl_histogram_extremes_and_zero_count():
    h = LogHistogram()
    h.add(0.5, 0)
    assert h.count == 0 and h.percentile(50) is None
    h.add(0.0, 3)  # below the range: lowest bin, clamped to the exact minimum
    h.add(1e6, 1)  # above the range: highest bin, clamped to the exact maximum
    assert h.percentile(0) == 0.0
    assert h.percentile(100) == 1e6
    assert h.stats()["mean"] == pytest.approx(1e6 / 4)


def test_sample_buckets_keep_last_values_and_peaks():
    m = Metrics("p", NO_SLO, timeseries_interval_s=1.0)
    for i in range(1000):
        t = i * 0.01
        for replica in (0, 1):
            running = 50 if i == 333 else i % 7  # a one-sample spike in the middle of bucket 3
            sample(m, t, replica, running=running, waiting=i // 100, used=i % 90, batch=i % 100 + replica)
    rows = m.timeseries_rows()
    assert all(len(r) == len(TIMESERIES_COLUMNS) for r in rows)
    for replica in (0, 1):
        mine = [r for r in rows if r[1] == replica]
        assert len(mine) == 10
        times = [r[2] for r in mine]
        assert times == sorted(times)
        last = mine[3]  # bucket [3, 4): last sample i = 399
        assert last[2] == pytest.approx(3.99)
        assert last[3:5] == (399 % 7, 3)
        assert last[-1] == 99 + replica  # batch_tokens: the bucket's maximum, not its last (399 % 100 = 99)
        assert mine[0][-1] == 99 + replica
    s = summarize(m)
    assert s["peak_running"] == 100  # both replicas spike at the same step
    assert s["peak_waiting"] == 18
    assert s["kv"]["peak_used_blocks"] == 89


def test_peak_running_sums_latest_replica_values():
    m = Metrics("p", NO_SLO, 1.0)
    sample(m, 0.0, 0, running=3)
    sample(m, 0.1, 1, running=4)
    sample(m, 0.2, 0, running=0)
    sample(m, 0.3, 1, running=5)
    assert summarize(m)["peak_running"] == 7


def test_time_weighted_kv_usage():
    m = Metrics("p", NO_SLO, 10.0)
    sample(m, 0.0, used=10)
    sample(m, 1.0, used=20)
    sample(m, 3.0, used=0)
    kv = summarize(m, num_blocks=100)["kv"]
    assert kv["mean_used_fraction"] == pytest.approx((10 * 1 + 20 * 2) / 3 / 100)
    assert kv["peak_used_blocks"] == 20
    assert kv["peak_used_fraction"] == pytest.approx(0.2)
    assert (kv["num_blocks"], kv["block_size"], kv["bytes_per_block"]) == (100, 16, 1024)
    # a second replica at 50 blocks for 1 s: block-seconds and seconds add up over replicas
    sample(m, 0.0, 1, used=50)
    sample(m, 1.0, 1, used=0)
    assert summarize(m, num_blocks=100)["kv"]["mean_used_fraction"] == pytest.approx((50 + 50) / 4 / 100)


def test_zero_finished_summary_is_defined_and_json():
    m = Metrics("p", SloConfig(), 1.0)
    s = summarize(m, duration=0.0, num_blocks=0)
    assert s["ttft_s"]["p99"] is None and s["itl_s"]["mean"] is None
    assert s["goodput_rps"] is None and s["slo_attainment"] is None and s["prefix_hit_rate"] is None
    seq = make_seq(0, 0.0, -1.0, 0.5, 0, scheduled=-1.0)
    seq.reject_reason = "too_long"
    m.on_reject(seq)
    s = summarize(m)
    assert s["requests"]["received"] == 1 and s["slo_attainment"] == 0.0
    assert s["e2e_s"]["p50"] is None and s["kv"]["mean_used_fraction"] is None
    json.dumps(s, allow_nan=False)


def _plain(x):
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    return x is None or type(x) in (int, float, str, bool)


def test_summary_is_plain_json_and_extra_merges():
    m = Metrics("p", SloConfig(), 0.5)
    for i, r in enumerate(REQS):
        m.on_finish(make_seq(i, *r))
    m.record_itl(0.01, 5)
    sample(m, 0.0, used=5, batch=3)
    sample(m, 2.0, used=7, batch=4)
    s = m.summary(duration_s=10.0, num_blocks=100, block_size=16, bytes_per_block=2048,
                  extra={"num_replicas": 1})
    assert _plain(s)  # no numpy scalars
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    assert s["num_replicas"] == 1


def test_request_rows():
    buf = io.StringIO()
    m = Metrics("paged", NO_SLO, 1.0, requests_file=buf)
    m.on_finish(make_seq(7, 1.0, 1.5, 3.5, 5, prompt=64, scheduled=1.25, cached=16, preempt=1))
    m.on_finish(make_seq(8, 2.0, 2.25, 2.25, 1))
    rej = make_seq(9, 3.0, -1.0, 3.0, 0, scheduled=-1.0)
    rej.reject_reason = "kv_capacity"
    m.on_reject(rej)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue()), fieldnames=REQUEST_COLUMNS))
    assert [r["status"] for r in rows] == ["finished", "finished", "rejected"]
    a, b, c = rows
    assert (a["policy"], a["request_id"], a["first_scheduled_s"]) == ("paged", "7", "1.25")
    assert float(a["ttft_s"]) == 0.5 and float(a["e2e_s"]) == 2.5 and float(a["mean_itl_s"]) == 0.5
    assert (a["prompt_tokens"], a["output_tokens"], a["prefix_hit_tokens"], a["preemptions"]) == ("64", "5", "16", "1")
    assert b["mean_itl_s"] == "" and float(b["ttft_s"]) == 0.25
    assert c["reject_reason"] == "kv_capacity" and c["ttft_s"] == c["first_token_s"] == c["first_scheduled_s"] == ""
    assert float(c["finish_s"]) == 3.0


def test_request_rows_quote_the_policy_and_keep_twelve_digits():
    buf = io.StringIO()
    m = Metrics('fp8, "tuned"', NO_SLO, 1.0, requests_file=buf)
    arrival = 3599.123456789012
    m.on_finish(make_seq(1, arrival, arrival + 0.0123456789, arrival + 7.5, 300))
    (row,) = csv.DictReader(io.StringIO(buf.getvalue()), fieldnames=REQUEST_COLUMNS)
    assert row["policy"] == 'fp8, "tuned"' and row["status"] == "finished"
    assert row["arrival_s"] == "3599.12345679"  # 12 significant digits
    assert float(row["ttft_s"]) == pytest.approx(0.0123456789, rel=1e-11)
    assert float(row["mean_itl_s"]) == pytest.approx((7.5 - 0.0123456789) / 299, rel=1e-11)


def test_bulk_itl_binning_equals_one_by_one():
    from kvsim.results.distributions import LogHistogram
    values = np.random.default_rng().lognormal(-4, 1.5, 5000)
    a, b = LogHistogram(), LogHistogram()
    for v in values:
        a.add(float(v))
    b.add_many(values)
    assert np.array_equal(a.counts, b.counts) and a.count == b.count
    assert a.min == b.min and a.max == b.max and abs(a.total - b.total) < 1e-9 * a.total


def test_a_replica_that_never_ran_a_step_is_left_out():
    m = Metrics("p", NO_SLO, 1.0)
    m.series(1)  # the engine loop takes its series before its first step
    sample(m, 0.0, 0, used=10)
    kv = summarize(m, num_blocks=100)["kv"]
    assert kv["mean_used_fraction"] == pytest.approx(0.1) and kv["peak_used_blocks"] == 10
    assert [row[1] for row in m.timeseries_rows()] == [0]


def test_rows_are_keyed_by_floor_division_at_bucket_edges():
    m = Metrics("p", NO_SLO, 0.1)
    assert 0.5 >= 5 * 0.1 and 0.5 // 0.1 == 4  # 0.5 is past the product but in bucket 4
    for t in (0.41, 0.45, 0.5, 0.51, 0.75):
        sample(m, t, used=int(t * 100))
    assert [row[2] for row in m.timeseries_rows()] == [0.5, 0.51, 0.75]  # one row a bucket, its last sample


def test_two_full_replicas_report_a_full_peak_and_the_arrival_window():
    from kvsim.sequence import Request, Sequence
    m = Metrics("p", SloConfig(), 1.0)
    for i in (0, 1):  # each replica of 100 blocks fills up
        r = m.series(i)
        m.sample(0.5, r, 1, 0, 0, 40, 0, 60, 0, 10)
        m.sample(1.5, r, 1, 0, 0, 100, 0, 0, 0, 10)
    for rid, (arrival, finish) in enumerate([(0.0, 1.0), (2.0, 3.0), (4.0, 9.0)]):
        s = Sequence(Request(rid, arrival, 10, 5))
        s.first_token_time, s.finish_time, s.num_output_tokens = arrival + 0.1, finish, 5
        m.on_finish(s)
    out = m.summary(duration_s=9.0, num_blocks=200, block_size=16, bytes_per_block=1, num_replicas=2)
    kv = out["kv"]
    assert kv["num_blocks_per_replica"] == 100 and kv["peak_used_blocks"] == 100
    assert kv["peak_used_fraction"] == 1.0  # not 100 / 200
    assert kv["mean_used_fraction"] == pytest.approx(0.4)  # 40 blocks held for 1 s of each replica's 1 s
    w = out["arrivals"]
    assert (w["start_s"], w["end_s"], w["offered_rps"]) == (0.0, 4.0, 0.5)  # 3 arrivals, 2 gaps in 4 s
    assert w["requests_per_s"] == 2 / 4 and w["output_tokens_per_s"] == 10 / 4 and w["total_tokens_per_s"] == 30 / 4
    assert w["window_s"] == 4.0 and w["backlog_at_last_arrival"] == 0
    assert out["throughput"]["requests_per_s"] == 3 / 9.0
