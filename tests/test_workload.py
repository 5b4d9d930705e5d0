"""Request streams: exact values for fixed lengths and fixture traces, statistics of the synthetic
distributions over 200k draws, duration cut-off, determinism, prefix groups and streaming."""

import collections
import math
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import KvsimError
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.workload import arrival_window, expected_count, generate_requests, timeseries_interval
from kvsim.sequence import Request

FIXTURES = Path(__file__).parent / "fixtures"


def scenario(**workload):
    return scenario_from_dict({"model": {"name": "m"}, "policies": [{"name": "p"}], "workload": workload},
                              "scn.toml", FIXTURES)


def fixed(value):
    return {"dist": "fixed", "value": value}


def arrivals(sc):
    return np.array([r.arrival_time for r in generate_requests(sc)])


def test_fixed_lengths_poisson_stream():
    reqs = list(generate_requests(scenario(num_requests=1000, arrival={"rate": 5.0},
                                           prompt_len=fixed(300), output_len=fixed(20))))
    assert [r.request_id for r in reqs] == list(range(1000))
    assert all(isinstance(r, Request) and r.prompt_len == 300 and r.output_len == 20 and r.token_ids is None
               for r in reqs)
    t = [r.arrival_time for r in reqs]
    assert t[0] > 0 and all(b > a for a, b in zip(t, t[1:]))


def test_poisson_gaps():
    t = arrivals(scenario(num_requests=200_000, arrival={"process": "poisson", "rate": 8.0}))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.01)  # standard error 0.22 %
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_gaps(cv):
    t = arrivals(scenario(num_requests=200_000, arrival={"process": "gamma", "rate": 4.0, "cv": cv}))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_lognormal_mean_and_clipping():
    sc = scenario(num_requests=200_000, prompt_len={"dist": "lognormal", "mean": 1000.0, "sigma": 1.0},
                  output_len={"dist": "lognormal", "mean": 50.0, "sigma": 1.5, "max": 200})
    reqs = list(generate_requests(sc))
    prompt = np.array([r.prompt_len for r in reqs])
    output = np.array([r.output_len for r in reqs])
    assert prompt.mean() == pytest.approx(1000.0, rel=0.02)  # standard error 0.3 %
    assert np.median(prompt) == pytest.approx(1000 * math.exp(-0.5), rel=0.02)  # exp(mu)
    assert output.min() >= 1 and output.max() == 200
    assert np.mean(output == 200) == pytest.approx(0.5 * math.erfc((math.log(200 / 50) + 1.5**2 / 2) / (1.5 * math.sqrt(2))),
                                                   abs=0.005)  # mass above the cap lands on it


def test_uniform_lengths():
    reqs = list(generate_requests(scenario(num_requests=50_000, prompt_len={"dist": "uniform", "min": 10, "max": 20})))
    p = np.array([r.prompt_len for r in reqs])
    assert set(p.tolist()) == set(range(10, 21))
    assert p.mean() == pytest.approx(15.0, abs=0.05)


def test_duration_cuts_the_same_stream():
    full = arrivals(scenario(num_requests=5000, arrival={"rate": 100.0}))
    cut = arrivals(scenario(num_requests=5000, duration_s=10.0, arrival={"rate": 100.0}))
    assert np.array_equal(cut, full[full <= 10.0]) and len(cut) < 5000
    assert abs(len(cut) - 1000) < 5 * math.sqrt(1000)
    few = arrivals(scenario(num_requests=50, duration_s=10.0, arrival={"rate": 100.0}))
    assert np.array_equal(few, full[:50])


def test_duration_alone_across_chunks():
    t = arrivals(scenario(duration_s=1000.0, arrival={"rate": 100.0}))  # ~100k: two chunks
    assert t[-1] <= 1000.0 and abs(len(t) - 100_000) < 5 * math.sqrt(100_000)
    assert np.all(np.diff(t) > 0)


def test_determinism_and_independent_streams():
    def stream(seed, prompt):
        sc = scenario(seed=seed, num_requests=2000, arrival={"rate": 3.0}, prompt_len=prompt,
                      output_len={"dist": "uniform", "min": 1, "max": 100},
                      prefix={"num_groups": 4, "prefix_len": 8, "fraction": 0.5})
        return [(r.arrival_time, r.prompt_len, r.output_len, None if r.token_ids is None else r.token_ids.tolist())
                for r in generate_requests(sc)]

    lognormal = {"dist": "lognormal", "mean": 500.0, "sigma": 0.5}
    a = stream(1, lognormal)
    assert a == stream(1, lognormal)
    b = stream(2, lognormal)
    assert [x[0] for x in a] != [x[0] for x in b] and [x[3] for x in a] != [x[3] for x in b]
    c = stream(1, fixed(7))  # another prompt distribution: same arrivals, outputs and groups
    assert [x[0] for x in c] == [x[0] for x in a]
    assert [x[2:] for x in c] == [x[2:] for x in a]


def test_prefix_groups():
    reqs = list(generate_requests(scenario(num_requests=20_000, prompt_len=fixed(100),
                                           prefix={"num_groups": 3, "prefix_len": 64, "fraction": 0.6})))
    members = [r for r in reqs if r.token_ids is not None]
    assert all(r.prompt_len == 100 for r in reqs if r.token_ids is None)
    assert all(r.prompt_len == 164 for r in members)
    assert len(members) / len(reqs) == pytest.approx(0.6, abs=0.02)
    by_content = collections.Counter(r.token_ids.tobytes() for r in members)
    assert len(by_content) == 3
    assert all(abs(n - len(members) / 3) < 5 * math.sqrt(len(members) / 3) for n in by_content.values())
    assert len({id(r.token_ids) for r in members}) == 3  # one shared array per group
    tok = members[0].token_ids
    assert tok.dtype == np.int32 and len(tok) == 64 and tok.min() >= 0 and tok.max() < 32000


def test_csv_trace_replay_exact():
    sc = scenario(arrival={"process": "trace", "time_scale": 2.0}, prompt_len={"dist": "trace"},
                  output_len={"dist": "trace"}, trace={"format": "csv", "path": "generic_small.csv"})
    got = [(r.request_id, r.arrival_time, r.prompt_len, r.output_len) for r in generate_requests(sc)]
    assert got == [(0, 0.0, 200, 20), (1, 1.0, 400, 40), (2, 2.0, 100, 10), (3, 2.0, 300, 30)]
    assert expected_count(sc) == 4


def test_trace_limits():
    base = dict(arrival={"process": "trace"}, prompt_len=fixed(5), trace={"format": "csv", "path": "generic_small.csv"})
    assert [r.prompt_len for r in generate_requests(scenario(**base))] == [5] * 4
    short = scenario(num_requests=10, duration_s=0.6, **base)
    assert [r.arrival_time for r in generate_requests(short)] == [0.0, 0.5] and expected_count(short) == 2
    capped = scenario(**{**base, "trace": {"format": "csv", "path": "generic_small.csv", "max_requests": 3}})
    assert len(list(generate_requests(capped))) == 3 == expected_count(capped)


def test_synthetic_arrivals_cycle_trace_lengths():
    trace = {"format": "csv", "path": "generic_small.csv"}
    sc = scenario(num_requests=9, arrival={"rate": 1.0}, prompt_len={"dist": "trace"}, output_len=fixed(3), trace=trace)
    assert [r.prompt_len for r in generate_requests(sc)] == [200, 400, 100, 300] * 2 + [200]
    one_pass = scenario(arrival={"rate": 1.0}, output_len={"dist": "trace"}, trace=trace)
    assert [r.output_len for r in generate_requests(one_pass)] == [20, 40, 10, 30] == [20, 40, 10, 30][:expected_count(one_pass)]


def test_mooncake_replay_shares_prefix_blocks():
    sc = scenario(arrival={"process": "trace"}, prompt_len={"dist": "trace"}, output_len={"dist": "trace"},
                  trace={"format": "mooncake", "path": "mooncake_small.jsonl"})
    reqs = list(generate_requests(sc))
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 1100, 5), (0.25, 1500, 7), (0.5, 512, 3), (1.0, 10, 1), (1.0, 600, 2)]
    assert all(len(r.token_ids) == r.prompt_len for r in reqs)
    a, b = reqs[0].token_ids, reqs[1].token_ids  # hash ids [0, 1, 2] and [0, 1, 3]
    assert np.array_equal(a[:1024], b[:1024]) and np.mean(a[1024:] == b[1024:1100]) < 0.05


def test_prefix_group_before_trace_tokens():
    sc = scenario(arrival={"process": "trace"}, prompt_len={"dist": "trace"}, output_len={"dist": "trace"},
                  prefix={"num_groups": 1, "prefix_len": 16, "fraction": 1.0},
                  trace={"format": "mooncake", "path": "mooncake_small.jsonl"})
    plain = scenario(arrival={"process": "trace"}, prompt_len={"dist": "trace"}, output_len={"dist": "trace"},
                     trace={"format": "mooncake", "path": "mooncake_small.jsonl"})
    for r, p in zip(generate_requests(sc), generate_requests(plain)):
        assert r.prompt_len == p.prompt_len + 16 and len(r.token_ids) == r.prompt_len
        assert np.array_equal(r.token_ids[16:], p.token_ids)


def test_expected_count_synthetic():
    assert expected_count(scenario(num_requests=123)) == 123
    assert expected_count(scenario(duration_s=10.0, arrival={"rate": 2.5})) == 25
    assert expected_count(scenario(num_requests=7, duration_s=10.0, arrival={"rate": 2.5})) == 7


def test_errors_raised_before_iteration():
    with pytest.raises(KvsimError, match="^scn.toml: workload.seed: must be at least 0, got -1"):
        generate_requests(scenario(seed=-1, num_requests=3))  # rejected when the scenario is validated
    with pytest.raises(KvsimError, match="^scn.toml: workload.trace.path: file not found: .*absent.csv$"):
        generate_requests(scenario(arrival={"process": "trace"}, trace={"format": "csv", "path": "absent.csv"}))


def test_million_requests_stream():
    it = generate_requests(scenario(num_requests=1_000_000, arrival={"rate": 1000.0},
                                    prompt_len={"dist": "lognormal", "mean": 800.0, "sigma": 1.0}))
    assert iter(it) is it and not isinstance(it, (list, tuple))
    last = collections.deque(it, maxlen=1)[0]  # consumed without keeping the stream
    assert last.request_id == 999_999 and 900 < last.arrival_time < 1100


@pytest.mark.parametrize("num_requests, rate, interval", [
    (100, 10.0, 0.25),     # a 10 s window: the floor
    (2500, 10.0, 0.25),    # 250 s / 1000 = 0.25 exactly
    (2501, 10.0, 0.5),     # just over: the next step up
    (8000, 10.0, 1.0),     # 800 s
    (15000, 10.0, 2.0),    # 1500 s
    (35000, 10.0, 5.0),    # 3500 s: an hour-long trace's
    (10**6, 25.0, 50.0),   # 40,000 s
])
def test_unset_timeseries_interval_gives_about_a_thousand_rows(num_requests, rate, interval):
    sc = scenario(num_requests=num_requests, arrival={"process": "deterministic", "rate": rate})
    assert arrival_window(sc) == pytest.approx(num_requests / rate)
    assert timeseries_interval(sc) == pytest.approx(interval)
    assert arrival_window(sc) / timeseries_interval(sc) <= 1000 * (1 + 1e-9)
    explicit = sc.model_copy(update={"output": sc.output.model_copy(update={"timeseries_interval_s": 0.1})})
    assert timeseries_interval(explicit) == 0.1


def test_trace_window_is_its_last_used_arrival():
    sc = scenario(arrival={"process": "trace", "time_scale": 2.0}, prompt_len={"dist": "trace"},
                  output_len={"dist": "trace"}, trace={"format": "csv", "path": "generic_small.csv"})
    last = arrivals(sc)[-1]
    assert arrival_window(sc) == pytest.approx(last)


def test_prompt_pool_cycles_whole_prompts():
    """prefix.prompts_per_group: inference-perf's shared_prefix data, a fixed pool of whole prompts
    shuffled once and re-sent in that order: request n sends pool prompt order[n mod pool]."""
    wl = dict(num_requests=250, prompt_len={"dist": "uniform", "min": 40, "max": 60}, output_len=fixed(8),
              prefix={"num_groups": 3, "prefix_len": 16, "prompts_per_group": 4})
    reqs = list(generate_requests(scenario(**wl)))
    pool = 12
    assert len({id(r.token_ids) for r in reqs}) == pool  # one array per pool prompt, the same every time
    for r in reqs:
        again = reqs[r.request_id % pool]
        assert r.token_ids is again.token_ids and r.prompt_len == again.prompt_len == len(r.token_ids)
        assert 16 + 40 <= r.prompt_len <= 16 + 60 and r.output_len == 8
    first = reqs[:pool]
    assert len({r.token_ids.tobytes() for r in first}) == pool  # every prompt once a cycle
    by_prefix = collections.Counter(r.token_ids[:16].tobytes() for r in first)
    assert sorted(by_prefix.values()) == [4, 4, 4]  # each system prompt heads its group's 4 questions
    t = [r.arrival_time for r in reqs]
    assert all(b > a for a, b in zip(t, t[1:]))
    assert [(r.arrival_time, r.token_ids.tobytes()) for r in generate_requests(scenario(**wl))] == \
        [(r.arrival_time, r.token_ids.tobytes()) for r in reqs]  # same seed, same requests


@pytest.mark.parametrize("extra, message", [
    ({"prefix": {"num_groups": 2, "prefix_len": 8, "prompts_per_group": 3, "fraction": 0.5}}, "needs fraction = 1"),
    ({"prefix": {"num_groups": 2, "prefix_len": 8, "prompts_per_group": 3}, "prompt_len": {"dist": "trace"},
      "trace": {"format": "csv", "path": "generic_small.csv"}}, "synthetic prompt_len"),
])
def test_prompt_pool_refusals(extra, message):
    with pytest.raises(KvsimError, match=message):
        scenario(**{"num_requests": 5, **extra})
