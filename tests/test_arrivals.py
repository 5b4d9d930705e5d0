"""Arrival sources (kvsim.engine.interfaces.ArrivalSource): the open-loop stream, and the seam a
closed-loop workload plugs into (a source told when each request ends releases the next)."""

import pytest

from kvsim.engine.arrivals import RequestStream
from kvsim.engine.replica import make_replica
from kvsim.engine.router import make_router
from kvsim.engine.simulator import Simulation
from kvsim.pipeline import resolve_policy
from kvsim.backends.analytic import AnalyticBackend
from kvsim.results.metrics import Metrics
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.sequence import Request

from conftest import make_scenario


class Clients:
    """A closed loop, as `vllm bench serve --max-concurrency N` with a think time: each of `clients`
    sends its next request `think_s` after its previous one ended, `per_client` requests each."""

    closed_loop = True

    def __init__(self, clients: int, per_client: int, think_s: float):
        self.think_s, self.per_client = think_s, per_client
        self.ready = [Request(c, 0.0, 300 + 50 * c, 40, None) for c in range(clients)]  # all at t = 0
        self.sent, self.ended, self.exhausted = {}, {}, False
        self.in_flight, self.max_in_flight = 0, 0

    def next_request(self):
        if not self.ready:
            self.exhausted = self.in_flight == 0
            return None
        req = min(self.ready, key=lambda r: (r.arrival_time, r.request_id))
        self.ready.remove(req)
        self.sent[req.request_id] = req.arrival_time
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return req

    def request_ended(self, seq, now: float) -> None:
        self.in_flight -= 1
        rid = seq.request.request_id
        self.ended[rid] = now
        client, turn = rid % 1000, rid // 1000
        if turn + 1 < self.per_client:
            self.ready.append(Request((turn + 1) * 1000 + client, now + self.think_s, 300 + 50 * client, 40, None))
        self.exhausted = self.in_flight == 0 and not self.ready


def simulate(source, replicas: int) -> Simulation:
    sc = make_scenario(hardware={"num_replicas": replicas})
    policy, model, gpu = sc.policies[0], model_spec(sc), gpu_spec(sc)
    capacity, settings = resolve_policy(sc, policy, model, gpu)
    reps = [make_replica(i, settings, AnalyticBackend(sc, policy, model, gpu, capacity, settings), 1.0)
            for i in range(replicas)]
    sim = Simulation(reps, Metrics("paged", sc.slo, 1.0), make_router(settings, reps, capacity.num_blocks))
    sim.run(source)
    return sim


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_closed_loop_source_releases_each_request_a_think_time_after_the_last_ended(replicas):
    source = Clients(clients=4, per_client=5, think_s=0.25)
    sim = simulate(source, replicas)
    assert sim.num_received == sim.num_ended == 20 and source.exhausted
    assert source.max_in_flight == 4  # never more than the clients
    for rid, sent in source.sent.items():
        if rid >= 1000:  # every later turn went out think_s after the client's previous one ended
            assert sent == pytest.approx(source.ended[rid - 1000] + 0.25, abs=1e-12)
            assert sent >= source.ended[rid - 1000]


def test_an_open_loop_stream_ignores_ends():
    requests = [Request(i, 0.1 * i, 200, 20, None) for i in range(10)]
    stream = RequestStream(requests)
    assert not stream.closed_loop and not stream.exhausted
    sim = simulate(stream, 1)
    assert sim.num_received == sim.num_ended == 10 and stream.exhausted
