"""Closed loops (kvsim.engine.arrivals.ClosedLoop, kvsim/scenario/sessions.py): clients as `vllm
bench serve --max-concurrency` and vLLM's multi-turn benchmark drive a server. Little's law on a case
computed by hand from the step model, a conversation's prefix hits counted by hand, and the engine's
fast paths (fused decode runs, one replica without SimPy, engines running ahead of SimPy) giving what
plain step-by-step scheduling gives."""

import math

import pytest

from kvsim.backends.analytic import AnalyticBackend
from kvsim.batch import Batch, DecodeShape
from kvsim.engine.simulator import Simulation
from kvsim.perf.basis import pricing_basis
from kvsim.perf.measured import request_overhead_s
from kvsim.pipeline import resolve_policy, run_scenario
from kvsim.results.metrics import Metrics
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.sequence import Sequence, Request

from conftest import make_scenario
from test_simulation import (assert_replays_simpy, assert_running_ahead_changes_nothing, assert_same_requests,
                             per_request)

IMMEDIATE = {"process": "immediate", "rate": None}


def summary(sc) -> dict:
    return run_scenario(sc, write=False).summaries["paged"]


# ---- Little's law ------------------------------------------------------------------------------

def _step_model(sc):
    policy, model, gpu = sc.policies[0], model_spec(sc), gpu_spec(sc)
    capacity, settings = resolve_policy(sc, policy, model, gpu)
    return AnalyticBackend(sc, policy, model, gpu, capacity, settings)


@pytest.mark.parametrize("think", [0.0, 0.75])
def test_clients_in_lockstep_meet_littles_law_computed_by_hand(think):
    """N clients, fixed lengths, think time Z: every cycle the N requests are admitted in one prefill
    step, decode together for O - 1 steps and finish at once, so the engine's R = one prefill step
    of N x P tokens plus O - 1 decode steps of N sequences (priced here by the step model, apart
    from the simulation); a client has its reply d later (the API server's time, which the
    measured pricing adds to every request's latency), so the response time is R + d and over K
    cycles throughput = N K / (K R + (K - 1)(d + Z)) -> N / (R + d + Z)."""
    n, p, o, k = 8, 256, 64, 5
    sc = make_scenario(engine={"max_num_batched_tokens": 4096, "max_num_seqs": 64},
                       workload={"num_requests": n * k, "arrival": IMMEDIATE, "max_concurrency": n,
                                 "think_time_s": {"dist": "fixed", "value": think},
                                 "prompt_len": {"dist": "fixed", "value": p}, "output_len": {"dist": "fixed", "value": o}})
    backend = _step_model(sc)
    prefill = Batch()
    for i in range(n):
        prefill.add(Sequence(Request(i, 0.0, p, o)), p)
    r = backend.execute(prefill) + backend.decode_run_time(DecodeShape(n, n * (p + 1), p + 1), o - 1)
    d = _reply_delay(sc)
    s = summary(sc)
    assert s["requests"]["finished"] == n * k and s["clients"]["peak_in_flight"] == n
    assert s["duration_s"] == pytest.approx(k * r + (k - 1) * (d + think), rel=1e-12)
    assert s["throughput"]["requests_per_s"] == pytest.approx(n * k / (k * r + (k - 1) * (d + think)), rel=1e-12)
    assert s["e2e_s"]["mean"] == pytest.approx(r + d, rel=1e-12)  # every request: one prefill, O - 1 decodes
    # In the steady state N = X (R + d + Z): K cycles fall short of it by the last reply and think time.
    x, cycle = s["throughput"]["requests_per_s"], r + d + think
    assert x * cycle / n == pytest.approx(k * cycle / (k * cycle - d - think), rel=1e-12)



def _reply_delay(sc) -> float:
    """The API server's time past the last token (measured pricing's request overhead)."""
    gpu = gpu_spec(sc)
    return request_overhead_s(sc, pricing_basis(sc, model_spec(sc), gpu), gpu)


def test_a_semaphore_over_the_arrival_process_sends_each_request_when_a_client_is_free(monkeypatch):
    """vllm bench serve --request-rate R --max-concurrency 2: arrivals every 1/R, two clients, so
    a request is sent at max(its arrival, the reply that frees a client), in arrival order."""
    sc = make_scenario(workload={"num_requests": 16, "arrival": {"process": "deterministic", "rate": 50.0},
                                 "max_concurrency": 2, "prompt_len": {"dist": "uniform", "min": 100, "max": 900},
                                 "output_len": {"dist": "uniform", "min": 10, "max": 80}})
    rows = {}
    on_finish = Metrics.on_finish

    def spy(self, seq):
        rows[seq.seq_id] = (seq.request.arrival_time, seq.finish_time)
        on_finish(self, seq)

    monkeypatch.setattr(Metrics, "on_finish", spy)
    s = summary(sc)
    d = _reply_delay(sc)  # the API server's time: a client has its reply that much later
    free = [0.0, 0.0]  # when each client is next free
    for rid in range(16):
        sent = max(0.02 * (rid + 1), min(free))
        assert rows[rid][0] == pytest.approx(sent, abs=1e-12), rid
        free[free.index(min(free))] = rows[rid][1] + d
    assert s["clients"]["peak_in_flight"] == 2 and s["clients"]["client_wait_s"]["max"] > 0


# ---- a conversation's prefix hits --------------------------------------------------------------

def test_a_conversation_hits_everything_said_before_counted_by_hand():
    """Two sessions of three turns, one after the other (one client), a 40-token system prompt they
    share, 100 new tokens and a 50-token reply a turn, blocks of 16. A turn hits the full blocks of
    what the previous turn computed (its prompt and all but the last token of its reply):
    A: 140 tokens (hits 0), 290 (the 189 computed before: 11 blocks, 176), 440 (339: 21 blocks, 336);
    B: 140 (the system prompt's 2 full blocks, 32: the third holds B's own tokens), 290 (176), 440 (336).
    Hit rate (176 + 336 + 32 + 176 + 336) / 2 (140 + 290 + 440) = 1056 / 1740."""
    sc = make_scenario(workload={"num_requests": 6, "arrival": IMMEDIATE, "max_concurrency": 1,
                                 "sessions": {"turns": {"dist": "fixed", "value": 3}},
                                 "prefix": {"num_groups": 1, "prefix_len": 40},
                                 "prompt_len": {"dist": "fixed", "value": 100}, "output_len": {"dist": "fixed", "value": 50}})
    s = summary(sc)
    assert s["requests"]["finished"] == 6 and s["clients"]["sessions"] == 2
    assert s["prefix_hit_rate"] == pytest.approx(1056 / 1740, rel=1e-12)


@pytest.mark.parametrize("router", ["prefix_affinity", "round_robin"])
def test_prefix_affinity_keeps_a_session_on_its_replica(router):
    """Three sessions of three turns (600 new tokens, 50-token replies: past the router's 512-token
    blocks from the first turn) on two replicas: a session that stays where its conversation is
    cached hits 640 then 1296 tokens (by hand as above), 1936 of every 3750 prompt tokens; sent
    round robin, its turns change replica and miss."""
    sc = make_scenario(hardware={"num_replicas": 2, "router": router},
                       workload={"num_requests": 9, "arrival": IMMEDIATE, "max_concurrency": 3,
                                 "sessions": {"turns": {"dist": "fixed", "value": 3}},
                                 "prompt_len": {"dist": "fixed", "value": 600}, "output_len": {"dist": "fixed", "value": 50}})
    rate = summary(sc)["prefix_hit_rate"]
    if router == "prefix_affinity":
        assert rate == pytest.approx(1936 / 3750, rel=1e-12)
    else:
        assert rate < 0.9 * 1936 / 3750, rate  # a turn back where the one before last went hits part


# ---- the engine's fast paths give step-by-step results -----------------------------------------

CLOSED_CASES = {
    "clients, exponential think, three replicas": dict(hardware={"num_replicas": 3}, workload={
        "num_requests": 150, "arrival": IMMEDIATE, "max_concurrency": 24,
        "think_time_s": {"dist": "exponential", "mean": 0.3}}),
    "clients, no think, two replicas": dict(hardware={"num_replicas": 2, "router": "round_robin"}, workload={
        "num_requests": 150, "arrival": IMMEDIATE, "max_concurrency": 32}),
    "sessions, prefix affinity": dict(hardware={"num_replicas": 2, "router": "prefix_affinity"}, workload={
        "num_requests": 150, "arrival": IMMEDIATE, "max_concurrency": 12,
        "think_time_s": {"dist": "uniform", "min": 0.05, "max": 0.5},
        "sessions": {"turns": {"dist": "uniform", "min": 1, "max": 6}},
        "prefix": {"num_groups": 2, "prefix_len": 300}}),
    "semaphore over poisson arrivals": dict(hardware={"num_replicas": 2, "router": "round_robin"}, workload={
        "num_requests": 150, "arrival": {"rate": 30.0}, "max_concurrency": 10}),
}


@pytest.mark.parametrize("case", sorted(CLOSED_CASES))
def test_fused_decode_runs_match_step_by_step_in_a_closed_loop(monkeypatch, case):
    """A fused run on one replica must not start steps after a request another replica's finish
    releases (Simulation.arrival_bound): per-request results are those of one step per event."""
    sc = make_scenario(**CLOSED_CASES[case])
    fused, fused_sum = per_request(monkeypatch, sc)
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain, plain_sum = per_request(monkeypatch, sc)
    assert_same_requests(fused, plain)
    f, p = fused_sum["paged"], plain_sum["paged"]
    assert f["engine_steps"] == p["engine_steps"] and f["engine_events"] < p["engine_steps"]
    assert f["duration_s"] == pytest.approx(p["duration_s"], rel=1e-9)


def test_without_the_bound_fused_runs_overrun_what_other_replicas_release(monkeypatch):
    """The check above has teeth: bounded by the source's next send alone, runs on one replica
    overrun requests that a finish on another releases, and results change."""
    sc = make_scenario(**CLOSED_CASES["clients, no think, two replicas"])
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain, _ = per_request(monkeypatch, sc)
    monkeypatch.undo()
    monkeypatch.setattr(Simulation, "arrival_bound", lambda self, rep, now: self.source.next_time)
    unbounded, _ = per_request(monkeypatch, sc)
    assert unbounded.keys() == plain.keys()
    assert any(unbounded[k][:2] != pytest.approx(plain[k][:2], rel=1e-9) for k in plain)


@pytest.mark.parametrize("case", ["clients, fixed think, rejections", "sessions", "semaphore"])
def test_one_replica_without_simpy_replays_simpy_in_a_closed_loop(monkeypatch, case):
    """The lone replica's WakeClock replays SimPy's wakes (URGENT) and engine events to the bit,
    ties included (a fixed think time, rejected turns ending sessions at dispatch)."""
    sections = {
        "clients, fixed think, rejections": dict(engine={"max_model_len": 700}, workload={
            "num_requests": 120, "arrival": IMMEDIATE, "max_concurrency": 9, "think_time_s": {"dist": "fixed", "value": 0.2}}),
        "sessions": dict(engine={"max_model_len": 2500}, workload={
            "num_requests": 120, "arrival": {"rate": 3.0}, "think_time_s": {"dist": "exponential", "mean": 0.4},
            "sessions": {"turns": {"dist": "uniform", "min": 1, "max": 8}}}),
        "semaphore": dict(workload={"num_requests": 120, "arrival": {"process": "deterministic", "rate": 25.0},
                                    "max_concurrency": 5}),
    }[case]
    alone_sum = assert_replays_simpy(monkeypatch, make_scenario(**sections))
    if case != "semaphore":
        assert alone_sum["paged"]["requests"]["rejected"] > 0 or case == "sessions"


@pytest.mark.parametrize("case", ["clients, exponential think, three replicas", "sessions, prefix affinity"])
def test_engines_running_ahead_of_simpy_change_nothing_in_a_closed_loop(monkeypatch, case):
    assert_running_ahead_changes_nothing(monkeypatch, make_scenario(**CLOSED_CASES[case]))


# ---- planning a closed loop --------------------------------------------------------------------

def test_plan_finds_the_closed_loops_concurrency_by_hand(tmp_path):
    """One request at a time, each 10 steps of 10 ms (test_plan's serial engine), clients with no
    think time: in the steady state a request sent as a client's last one ends finds the N - 1
    others ahead of it, so its TTFT is (N - 1) x 0.1 s + 0.01 s: at most 0.55 s for N <= 6. The
    safe concurrency is 6 for every seed and the long run, and there the server is never idle:
    10 requests/s. The safe check runs every step the planner's margin dearer (0.535 s, still safe):
    its figures are 10 / 1.05 requests/s and a TTFT of 510 ms x 1.05."""
    from kvsim.planning.capacity import plan
    from kvsim.planning.executors import InlineExecutor
    from test_plan import serial_scenario

    sc = serial_scenario(tmp_path, workload={"seed": 0, "num_requests": 200, "arrival": IMMEDIATE, "max_concurrency": 3,
                                             "prompt_len": {"dist": "fixed", "value": 100},
                                             "output_len": {"dist": "fixed", "value": 10}},
                         slo={"ttft_ms": 550, "tpot_ms": None, "percentile": 99})
    result = plan(sc, seeds=2, resolution=0.02, executor=InlineExecutor())
    (answer,) = result.policies
    assert result.meta["load_unit"] == "clients" and result.meta["scenario_rate"] == 3
    # nothing random (fixed lengths, clients with no think time): every seed is the same run, simulated once
    assert answer.safe_rate == 6 and answer.seed_max_rates == [6] and answer.mean_rate == 6
    assert answer.replications == 1
    scale = result.meta["safe_check_step_time_scale"]
    assert scale == pytest.approx(1.05)
    assert answer.at_safe_rate["throughput_rps"] == pytest.approx(10.0 / scale, rel=0.01)
    assert answer.at_safe_rate["worst_ttft_ms_at_pct"] == pytest.approx(510 * scale, rel=0.01)
    assert answer.headroom == pytest.approx(1.0) and answer.sustainable_at_scenario_rate
    for p in result.points:
        assert p["rate"] == int(p["rate"]) and p["sustainable"] == (p["rate"] <= 6), p
    assert {p["phase"] for p in result.points} >= {"search", "safe_check", "safe_check_long"}


def test_a_target_rate_plans_a_closed_loop_as_its_open_loop_and_refuses_sessions(tmp_path):
    from kvsim.errors import KvsimError
    from kvsim.planning.deploy import deploy, rate_based
    from kvsim.planning.executors import InlineExecutor
    from test_plan import serial_scenario

    closed = make_scenario(workload={"num_requests": 100, "arrival": IMMEDIATE, "max_concurrency": 8,
                                     "think_time_s": {"dist": "fixed", "value": 1.0}})
    open_ = rate_based(closed).workload
    assert (open_.arrival.process, open_.max_concurrency, open_.think_time_s) == ("poisson", None, None)
    assert rate_based(make_scenario()) == make_scenario()  # an open loop stays as it is
    sc = serial_scenario(tmp_path, workload={"seed": 0, "num_requests": 100, "arrival": IMMEDIATE, "max_concurrency": 3,
                                             "prompt_len": {"dist": "fixed", "value": 100},
                                             "output_len": {"dist": "fixed", "value": 10}})
    result = deploy(sc, 4.0, gpus=["H100-SXM"], tensor_parallel=(1,), seeds=1, headroom=False,
                    executor=InlineExecutor())
    poisson = serial_scenario(tmp_path, workload={"seed": 0, "num_requests": 100, "arrival": {"process": "poisson", "rate": 1.0},
                                                  "prompt_len": {"dist": "fixed", "value": 100},
                                                  "output_len": {"dist": "fixed", "value": 10}})
    same = deploy(poisson, 4.0, gpus=["H100-SXM"], tensor_parallel=(1,), seeds=1, headroom=False,
                  executor=InlineExecutor())
    assert result.meta["from_closed_loop"] and not same.meta["from_closed_loop"]
    assert [d.row() for d in result.deployments] == [d.row() for d in same.deployments] and result.deployments
    sessions = make_scenario(workload={"num_requests": 100, "arrival": IMMEDIATE, "max_concurrency": 8,
                                       "sessions": {"turns": {"dist": "fixed", "value": 3}}})
    with pytest.raises(KvsimError, match="multi-turn sessions is planned by its concurrency"):
        deploy(sessions, 4.0, gpus=["H100-SXM"], executor=InlineExecutor())


# ---- scenario keys -----------------------------------------------------------------------------

@pytest.mark.parametrize("workload, message", [
    ({"think_time_s": {"dist": "fixed", "value": 1.0}}, "workload: think_time_s: a think time needs clients"),
    ({"arrival": {"process": "immediate", "rate": 3.0}}, "workload.arrival: process 'immediate' takes no rate"),
    ({"arrival": IMMEDIATE, "num_requests": None, "duration_s": 60.0},
     "workload: arrival.process 'immediate' without max_concurrency sends everything at t = 0: give num_requests"),
    ({"max_concurrency": 0}, "workload.max_concurrency: must be at least 1, got 0"),
    ({"max_concurrency": 4, "think_time_s": {"dist": "exponential"}}, "workload.think_time_s: dist 'exponential' needs mean"),
    ({"max_concurrency": 4, "think_time_s": {"dist": "fixed", "value": 1.0, "mean": 2.0}},
     "workload.think_time_s: dist 'fixed' takes no mean"),
    ({"sessions": {"turns": {"dist": "fixed", "value": 200_000}}}, "workload.sessions: turns: at most 100,000 turns"),
    ({"sessions": {"turns": {"dist": "trace"}}}, "sessions from a dataset: sessions.turns, prompt_len and output_len"),
])
def test_closed_loop_keys_are_checked_in_one_line(workload, message):
    from kvsim.errors import KvsimError
    from kvsim.scenario.config import scenario_from_dict
    from conftest import scenario_dict

    with pytest.raises(KvsimError) as err:
        scenario_from_dict(scenario_dict(workload=workload))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


# ---- sessions from a ShareGPT dataset; same seed, same bytes --------------------------------------

def test_sharegpt_conversations_are_sessions_turn_by_turn(tmp_path, monkeypatch):
    """Two conversations: A with three (human, gpt) pairs, B with one and a trailing question (dropped).
    Tokens are UTF-8 bytes / 4 rounded up; a turn's prompt is the conversation so far and its message."""
    import json

    def turn(who, n):
        return {"from": who, "value": "x" * n}

    data = [{"conversations": [turn("human", 40), turn("gpt", 400), turn("human", 81), turn("gpt", 200),
                               turn("human", 8), turn("gpt", 16)]},
            {"conversations": [turn("human", 4)]},  # no reply: not a session
            {"conversations": [turn("human", 120), turn("gpt", 60), turn("human", 9)]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    sc = make_scenario(workload={"num_requests": None, "arrival": IMMEDIATE, "max_concurrency": 1,
                                 "trace": {"format": "sharegpt", "path": str(path)},
                                 "sessions": {"turns": {"dist": "trace"}},
                                 "prompt_len": {"dist": "trace"}, "output_len": {"dist": "trace"}})
    seen = []
    on_finish = Metrics.on_finish

    def spy(self, seq):
        seen.append((seq.request.prompt_len, seq.request.output_len))
        on_finish(self, seq)

    monkeypatch.setattr(Metrics, "on_finish", spy)
    s = summary(sc)
    assert s["clients"]["sessions"] == 2 and s["requests"]["finished"] == 4
    assert seen == [(10, 100), (10 + 100 + 21, 50), (131 + 50 + 2, 4), (30, 15)]


def test_a_closed_loop_run_gives_the_same_bytes_twice(tmp_path):
    from kvsim.cli import main

    for out in ("a", "b"):
        assert main(["scenarios/multi_turn.toml", "--set", "workload.num_requests=200", "--policy", "paged",
                     "--out", str(tmp_path / out), "--quiet"]) == 0
    for name in ("summary.json", "requests.csv", "timeseries.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_vllm_bench_result_is_checked_for_its_clients(tmp_path):
    """`kvsim validate` against a `vllm bench serve --save-result` JSON: --request-rate inf and
    --max-concurrency must be the scenario's (arrival immediate, max_concurrency)."""
    from kvsim.calibrate.tables import bench_result, check_bench_workload
    from kvsim.errors import KvsimError
    from kvsim.scenario.workload import generate_requests

    sc = make_scenario(workload={"num_requests": 100, "arrival": IMMEDIATE, "max_concurrency": 16})
    reqs = list(generate_requests(sc))
    doc = {"completed": 100, "num_prompts": 100, "output_throughput": 1e3, "request_rate": "inf",
           "max_concurrency": 16, "total_input_tokens": sum(r.prompt_len for r in reqs),
           "total_output_tokens": sum(r.output_len for r in reqs)}
    check_bench_workload(bench_result(doc, tmp_path / "b.json"), sc)  # the same workload: no complaint
    for change, said in (({"max_concurrency": 8}, "max concurrency 8 vs 16"),
                         ({"max_concurrency": None}, "max concurrency None vs 16"),
                         ({"request_rate": 20.0}, "request rate 20 vs inf")):
        with pytest.raises(KvsimError, match=said):
            check_bench_workload(bench_result({**doc, **change}, tmp_path / "b.json"), sc)


def test_a_client_waits_for_the_api_servers_reply_too():
    """With `reply_delay` (the API server's time past the last token, measured pricing) a client's
    next request goes that much later: one client, fixed lengths, so every send is the previous
    request's end plus the delay."""
    from kvsim.engine.arrivals import ClosedLoop
    from test_arrivals import Client, simulate

    owners = {}
    client = Client(0, 6, 0.0, owners)
    source = ClosedLoop(iter([client]), max_concurrency=1, immediate=True, reply_delay=0.03)
    ends = {}
    ended = source.request_ended

    def spy(seq, now):
        ends[owners[seq.request.request_id][1]] = now
        ended(seq, now)

    source.request_ended = spy
    simulate(source, 2)
    assert source.min_gap == 0.03 and len(ends) == 6
    for k in range(1, 6):
        assert client.sent[k] == pytest.approx(ends[k - 1] + 0.03, abs=1e-12)
