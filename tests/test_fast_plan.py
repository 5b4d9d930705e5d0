"""The fast plan (issue 27) gives the exhaustive plan's answers: a run stopped early is one the whole run
finds unsustainable, the guided searches and the guided safe ladder end where the plain ones end, and a
plan and a deployment search agree with `exhaustive=True` (kvsim.planning.agree)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_scenario
from kvsim.cli import main
from kvsim.planning import safe
from kvsim.planning.agree import differences
from kvsim.planning.capacity import plan
from kvsim.planning.deploy import deploy
from kvsim.planning.executors import InlineExecutor
from kvsim.planning.points import evaluate_point, is_stopped
from kvsim.planning.search import Guided, Search
from kvsim.results.distributions import nearest_rank
from kvsim.results.early_stop import allowed_misses
from kvsim.scenario.config import load_scenario

import numpy as np


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.sampled_from([50.0, 90.0, 95.0, 99.0, 99.9, 100.0]))
def test_allowed_misses_is_where_the_nearest_rank_percentile_turns_infinite(total, q):
    m = allowed_misses(total, q)
    finite = np.zeros(total)
    assert nearest_rank(finite[:total - m], m, q) is not None  # m missing: still a finite figure
    if m < total:
        assert nearest_rank(finite[:total - m - 1], m + 1, q) is None  # one more: over every bound


def drive(g: Guided, verdict) -> int:
    """Run a Guided search to its end on a verdict function; the number of points simulated."""
    n = 0
    while rates := g.next_rates():
        for rate in rates:
            g.update(rate, {"sustainable": verdict(rate)})
            n += 1
    g.finish()
    return n


def plain(search: Search, verdict) -> int:
    n = 0
    while (rate := search.next_rate()) is not None:
        search.update(rate, {"sustainable": verdict(rate)})
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(start=st.floats(0.1, 100.0), knee_ratio=st.floats(0.005, 300.0),
       resolution=st.sampled_from([0.01, 0.02, 0.05, 0.1]),
       growth=st.sampled_from([2.0, 1.1, 1.25]), guess_ratio=st.one_of(st.none(), st.floats(0.01, 100.0)),
       integer=st.booleans())
def test_a_guided_search_ends_where_the_plain_search_ends(start, knee_ratio, resolution, growth, guess_ratio, integer):
    knee = start * knee_ratio
    if integer:
        start = float(max(1, round(start)))

    def verdict(rate):
        return rate < knee

    full = Search(("x", 0), start, resolution, growth, integer)
    n_plain = plain(full, verdict)
    guess = None if guess_ratio is None else knee * guess_ratio
    g = Guided(Search(("x", 0), start, resolution, growth, integer), guess)
    drive(g, verdict)
    s = g.search
    assert (s.lo, s.hi, s.knee, s.censored) == (full.lo, full.hi, full.knee, full.censored)
    if s.hi is not None:
        assert s.hi_record is g.known[s.hi]
    if guess_ratio is not None and 0.99 < guess_ratio < 1.01 and not integer and full.lo and full.hi:
        assert len(g.known) <= min(n_plain, 3)  # a right guess: the bracket's two ends (and a third at most)
    # a verdict implied for the scenario's own rate is the one the plain search simulated there
    if start in s.implied:
        assert s.implied[start] == verdict(start)


@settings(max_examples=200, deadline=None)
@given(long_knee=st.floats(1.0, 50.0), seed_gap=st.floats(0.8, 1.3), candidate=st.floats(1.0, 80.0),
       integer=st.booleans())
def test_the_guided_safe_ladder_ends_where_the_plain_ladder_ends(long_knee, seed_gap, candidate, integer):
    seeds_knee = long_knee * seed_gap  # the seeds may fail below the long run (a ladder that must walk again)
    calls = {"plain": 0, "guided": 0}

    def point(label, rate, seed, long):
        return (label, rate, seed, long)

    def run(kind):
        def fake(label, rate, seed, long):
            calls[kind] += 1
            return {"sustainable": rate < (long_knee if long else seeds_knee), "rate": rate, "seed": seed}
        original = safe.evaluate_point
        safe.evaluate_point = fake
        try:
            fn = safe.safe_rates if kind == "plain" else safe.safe_rates_guided
            return fn(InlineExecutor(), {"a": float(round(candidate)) if integer else candidate}, [0, 1, 2], 0.02,
                      point, lambda *a: None, integer=integer)["a"]
        finally:
            safe.evaluate_point = original

    p, g = run("plain"), run("guided")
    assert (g.passed, g.failed, g.safe_rate) == (p.passed, p.failed, p.safe_rate)
    assert g.records == p.records and g.long_record == p.long_record
    if seed_gap >= 1:  # the usual case: the long run fails first; the seeds then run once, where the ladder ends
        assert calls["guided"] <= calls["plain"]


def chat(requests=600, **sections):
    sc = load_scenario("scenarios/chat.toml")
    data = sc.model_dump()
    for k, v in sections.items():
        data[k] = {**(data.get(k) or {}), **v}
    data["workload"]["num_requests"] = requests
    from kvsim.scenario.config import scenario_from_dict
    return scenario_from_dict(data, sc.source, sc.base_dir)


@pytest.mark.parametrize("sections, policy, rates", [
    ({}, "paged", (10.0, 24.0, 27.0, 45.0)),  # TTFT: the p99 bound
    ({"hardware": {"num_replicas": 2}}, "paged", (30.0, 52.0, 90.0)),  # two replicas' queues
    ({"slo": {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 30000}}, "contiguous", (10.0, 20.0, 40.0)),  # E2E
    ({"slo": {"ttft_ms": None, "tpot_ms": 500}}, "paged-chunked", (20.0, 40.0)),  # the backlog (stability)
])
def test_a_run_stopped_early_is_one_the_whole_run_finds_unsustainable(sections, policy, rates):
    sc = chat(**sections)
    stopped = 0
    for rate in rates:
        whole = evaluate_point(sc, policy, rate, 0, 600)
        fast = evaluate_point(sc, policy, rate, 0, 600, None, None, True)
        assert fast["sustainable"] == whole["sustainable"], (rate, fast, whole)
        if is_stopped(fast):
            stopped += 1
            assert not whole["sustainable"] and (fast["slo_met"] is False and not whole["slo_met"]
                                                 or fast["stable"] is False and not whole["stable"])
            assert fast["binding_detail"].startswith("stopped at")
        else:  # watched to its end: the very same record
            assert fast == whole
    assert stopped >= 1


def test_the_fast_plan_gives_the_exhaustive_plans_answers_with_fewer_points():
    sc = chat(requests=400)
    kw = dict(policies=["paged-chunked", "contiguous"], seeds=3, executor=InlineExecutor())
    fast, full = plan(sc, **kw), plan(sc, exhaustive=True, **kw)
    assert differences(fast, full) == []
    assert [p.safe_rate for p in fast.policies] == [p.safe_rate for p in full.policies]
    assert [(p.binding, p.binding_detail) for p in fast.policies] == \
        [(p.binding, p.binding_detail) for p in full.policies]
    assert [p.at_safe_rate for p in fast.policies] == [p.at_safe_rate for p in full.policies]
    assert [p.sustainable_at_scenario_rate for p in fast.policies] == [p.sustainable_at_scenario_rate
                                                                       for p in full.policies]
    assert fast.policies == full.policies  # every field: knees, intervals, the step-cost knees too
    assert len(fast.points) < len(full.points)
    assert any(str(pt["binding_detail"]).startswith("stopped at") for pt in fast.points)
    assert not any(str(pt["binding_detail"]).startswith("stopped at") for pt in full.points)


def test_the_fast_deployment_search_picks_the_exhaustive_winner():
    sc = chat(requests=300)
    kw = dict(gpus=["H100-SXM", "L40S"], tensor_parallel=(1,), policy="paged", seeds=2, top=1,
              executor=InlineExecutor())
    fast, full = deploy(sc, 30.0, **kw), deploy(sc, 30.0, exhaustive=True, **kw)
    assert differences(fast, full) == []
    assert len(fast.points) <= len(full.points)


def test_plan_exhaustive_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(open("scenarios/chat.toml").read().replace("num_requests = 3000", "num_requests = 200"))
    args = ["plan", str(path), "--policy", "paged", "--seeds", "1", "--resolution", "0.1", "--workers", "1",
            "--quiet"]
    assert main(args + ["--exhaustive", "--out", str(tmp_path / "full")]) == 0
    assert main(args + ["--out", str(tmp_path / "fast")]) == 0
    full = (tmp_path / "full" / "plan.csv").read_text()
    fast = (tmp_path / "fast" / "plan.csv").read_text()
    assert full.splitlines()[0] == fast.splitlines()[0]  # the same columns
    col = full.splitlines()[0].split(",").index("safe_rate")
    assert math.isclose(float(full.splitlines()[1].split(",")[col]), float(fast.splitlines()[1].split(",")[col]))


def test_a_watched_run_with_an_energy_meter_keeps_its_energy_figures():
    sc = chat(energy={"pue": 1.3, "usd_per_kwh": 0.1})
    whole = evaluate_point(sc, "paged", 10.0, 0, 600)
    watched = evaluate_point(sc, "paged", 10.0, 0, 600, None, None, True)
    assert whole["joules_per_output_token"] and watched == whole  # the meter saw every event through the watch
    assert is_stopped(evaluate_point(sc, "paged", 45.0, 0, 600, None, None, True))
