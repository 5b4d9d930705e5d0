"""Replicas that come and go (kvsim.engine.fleet): a load step worked out by hand, startup and
drain, the gateway's queue, the router seeing only ready replicas, and the fused runs' bound."""

import math

import pytest

from kvsim.engine.arrivals import RequestStream
from kvsim.engine.autoscalers import FixedPool, FleetView
from kvsim.engine.fleet import FleetSimulation
from kvsim.engine.hpa import SCALE_DOWN, SCALE_UP, Hpa
from kvsim.engine.observe import Scrapes
from kvsim.engine.replica import make_replica
from kvsim.engine.router import make_router
from kvsim.perf.startup import StartupDelay
from kvsim.pipeline import resolve_policy
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.sequence import Request

from conftest import make_scenario

STEP_S = 0.1  # every engine step of the fake backend


class Steps:
    """A backend whose every step takes STEP_S: a request of one prompt token and L output tokens
    alone on a replica takes L steps (its prefill emits the first token)."""

    name, fuses_decode_runs, prices_longest_decode, holds_device = "steps", False, False, False

    def __init__(self, num_blocks: int = 4096):
        self.num_blocks = num_blocks

    def execute(self, batch) -> float:
        return STEP_S

    def free(self, seq) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:
        pass


class Recorder:
    """An observer keeping every finished request's (id, replica, first scheduled, finish)."""

    interval = 1e9

    def __init__(self):
        self.done, self.rejected = {}, []

    def on_reject(self, seq):
        self.rejected.append(seq.request.request_id)

    def on_held_back(self, step):
        pass

    def on_step(self, step):
        for seq in step.finished:
            self.done[seq.request.request_id] = (step.replica, seq.first_scheduled_time, seq.finish_time)


def engine_settings(max_num_seqs: int = 1):
    sc = make_scenario(engine={"max_num_seqs": max_num_seqs, "async_scheduling": False, "enable_prefix_caching": False})
    return resolve_policy(sc, sc.policies[0], model_spec(sc), gpu_spec(sc))[1]


class Schedule:
    """A test autoscaler: the replica count `counts[t]` from time t on (checked every `period_s`)."""

    name = "schedule"

    def __init__(self, counts: dict, period_s: float = 1.0):
        self.counts, self.period_s = counts, period_s
        self.views: list[FleetView] = []

    def desired(self, view: FleetView) -> int:
        self.views.append(view)
        return [n for t, n in sorted(self.counts.items()) if t <= view.now + 1e-9][-1]

    def describe(self) -> dict:
        return {"policy": self.name}


def fleet(autoscaler, requests, startup_s: float, initial: int = 1, max_num_seqs: int = 1, scrape_s: float = 15.0):
    settings = engine_settings(max_num_seqs)
    recorder = Recorder()
    sim = FleetSimulation(lambda i: make_replica(i, settings, Steps(), 1e9), autoscaler,
                          StartupDelay((("container_start", startup_s, "test"),)), initial, recorder,
                          lambda ready: make_router(settings, ready, 4096, fixed=False), Scrapes(scrape_s))
    end = sim.run(RequestStream(requests))
    return sim, recorder, end


def deterministic(times, output_len: int = 10) -> list[Request]:
    return [Request(i, t, 1, output_len, None) for i, t in enumerate(times)]


def step_load(rate1: float, rate2: float, t0: float, end: float) -> list[float]:
    """Arrivals every 1/rate1 s until t0, then every 1/rate2 s (the first after t0 one gap later)."""
    times, t = [], 0.0
    while t + 1 / rate1 <= t0:
        t += 1 / rate1
        times.append(t)
    t = t0
    while t + 1 / rate2 <= end:
        t += 1 / rate2
        times.append(t)
    return times


def test_a_load_step_with_a_known_startup_delay_by_hand():
    """One replica serves one request at a time, each 1 s (10 steps of 0.1 s). Arrivals every 1.25 s
    (0.8/s) until t = 60, then every 0.625 s (1.6/s) until t = 180. A second replica is asked for at
    t = 75 and starts 30 s later, ready at t = 105.

    By hand: until 60 nothing waits (a request leaves 0.25 s before the next comes). The 48th request
    arrives at 60.0 and runs 60-61; the k-th arrival after it (at 60 + 0.625 k) has always arrived
    by the time the replica frees, so it runs from 61 + (k - 1) to 62 + (k - 1): the lone replica
    serves 1/s while 1.6/s arrive. At t = 75, 24 have arrived after 60 and 15 started: 9 wait. From
    105 the new replica, the less loaded, takes the next arrival."""
    times = step_load(0.8, 1.6, 60.0, 180.0)
    sim, rec, end = fleet(Schedule({0.0: 1, 75.0: 2}, period_s=15.0), deterministic(times), startup_s=30.0)
    # replica 1 was created at the first tick at or after 75, ready 30 s later
    created = {m.index: (m.created, m.ready) for m in sim.members}
    assert created == {0: (0.0, 0.0), 1: (75.0, 105.0)}
    # requests before the step wait for nothing: first scheduled at their arrival, done 1 s later
    for i, t in enumerate(times):
        if t <= 60.0:
            replica, start, finish = rec.done[i]
            assert (replica, start, finish) == (0, pytest.approx(t), pytest.approx(t + 1.0))
    # after the step, until the new replica is ready, every request runs on replica 0 back to back
    after = [i for i, t in enumerate(times) if 60.0 < t < 105.0]
    first = after[0]
    assert rec.done[first][1] == pytest.approx(61.0)  # behind the request that arrived at 60.0
    for k, i in enumerate(after):
        replica, start, finish = rec.done[i]
        assert replica == 0 and start == pytest.approx(61.0 + k) and finish == pytest.approx(62.0 + k)
    # the queue at t = 75 (what the scrape at 75 saw): arrived after 60 and not started by 75
    waiting_75 = sum(1 for i in after if times[i] <= 75.0) - sum(1 for i in after if rec.done[i][1] <= 75.0)
    assert waiting_75 == 24 - 15 == 9
    # the new replica's first request is the first arrival after it became ready
    first_on_1 = min(i for i, (r, _, _) in rec.done.items() if r == 1)
    assert times[first_on_1] == min(t for t in times if t >= 105.0)
    assert not rec.rejected and len(rec.done) == len(times)


def test_scale_down_drains_before_removal_and_the_router_skips_a_draining_replica():
    """Two replicas, each serving one 1-s request at a time; at t = 10 the pool goes to one. The
    ready replica that became ready last (index 1) drains: it finishes what it holds, gets nothing
    new, and is removed when it runs out of work."""
    times = [0.5 * k for k in range(1, 60)]  # 2/s: both replicas busy
    sim, rec, end = fleet(Schedule({0.0: 2, 10.0: 1}), deterministic(times), startup_s=0.0, initial=2)
    drain = sim.members[1]
    assert drain.drain == 10.0
    on_1 = [i for i, (r, _, _) in rec.done.items() if r == 1]
    assert max(times[i] for i in on_1) < 10.0  # nothing routed to it from its drain on
    assert drain.removed == pytest.approx(max(rec.done[i][2] for i in on_1))  # gone when its last finished
    assert drain.removed > 10.0
    assert len(rec.done) == len(times)


def test_requests_wait_at_the_gateway_while_no_replica_is_ready():
    """A pool that scales from zero (min 0): requests held at the gateway go to the first replica
    that becomes ready, in arrival order, and their wait counts in their TTFT."""
    times = [1.0, 2.0, 3.0]
    sim, rec, end = fleet(Schedule({0.0: 0, 1.5: 1}), deterministic(times), startup_s=10.0, initial=1)
    # t = 0: the pool goes to zero (the initial replica drains at once); t = 2 (first tick after 1.5) a
    # replica is created, ready at 12: every request starts then, one after the other
    assert sim.members[0].removed == 0.0
    assert sim.members[1].created == 2.0 and sim.members[1].ready == 12.0
    starts = sorted(rec.done[i][1] for i in range(3))
    assert starts == [pytest.approx(12.0), pytest.approx(13.0), pytest.approx(14.0)]


def test_a_replica_scaled_away_while_starting_never_serves_and_is_billed_until_then():
    times = [0.5 * k for k in range(1, 20)]
    sim, rec, end = fleet(Schedule({0.0: 1, 2.0: 2, 4.0: 1}), deterministic(times), startup_s=30.0)
    late = sim.members[1]
    assert (late.created, late.ready, late.removed) == (2.0, -1.0, 4.0)
    assert {r for r, _, _ in rec.done.values()} == {0}


def test_the_routing_bound_leaves_every_request_as_cutting_runs_at_every_arrival(monkeypatch):
    """The fused runs' bound (a run stops only before an arrival the least-loaded router could send
    it): per-request times equal those of runs cut at every arrival (Simulation's rule), up to the
    rounding of split closed-form sums, with fewer engine events."""
    from kvsim.pipeline import run_scenario

    from conftest import per_request

    sc = make_scenario(workload={"num_requests": 600, "arrival": {"process": "poisson", "rate": 30.0},
                                 "prompt_len": {"dist": "lognormal", "mean": 500, "sigma": 0.6, "max": 4000},
                                 "output_len": {"dist": "lognormal", "mean": 120, "sigma": 0.6, "max": 1000}},
                       autoscaling={"policy": "hpa", "min_replicas": 3, "max_replicas": 3,
                                    "hpa": {"metric": "num_requests_running", "target": 1000}})
    bounded, _ = per_request(monkeypatch, sc)
    monkeypatch.setattr(FleetSimulation, "run_bound", lambda self, rep, now: self.next_arrival_time)
    cut, _ = per_request(monkeypatch, sc)
    assert bounded.keys() == cut.keys() and len(bounded) == 600
    for key, (ttft, e2e, n, pre, cached) in cut.items():
        b = bounded[key]
        assert b[2:] == (n, pre, cached)
        assert b[0] == pytest.approx(ttft, rel=1e-9, abs=1e-9) and b[1] == pytest.approx(e2e, rel=1e-9, abs=1e-9)
    assert run_scenario  # (the events fewer: benchmarks/results/autoscale.md)


def test_fixed_pool_view_counts():
    """A FleetView counts Pending pods (node, container) apart from Running ones without metrics."""
    sim, _, _ = fleet(FixedPool(1), deterministic([1.0]), startup_s=5.0)
    assert isinstance(sim.autoscaler, FixedPool) and math.isinf(sim.autoscaler.period_s)
    assert Hpa(1, 4, SCALE_UP, SCALE_DOWN).reconcile(0.0, 1, None) == 1
