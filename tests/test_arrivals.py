"""Arrival sources (kvsim.engine.interfaces.ArrivalSource): the open-loop stream, and the seam a
closed-loop workload plugs into (a source told when each request ends releases the next)."""

import pytest

from kvsim.engine.arrivals import ClosedLoop, RequestStream
from kvsim.engine.replica import make_replica
from kvsim.engine.router import make_router
from kvsim.engine.simulator import Simulation
from kvsim.pipeline import resolve_policy
from kvsim.backends.analytic import AnalyticBackend
from kvsim.results.metrics import Metrics
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.sequence import Request

from conftest import make_scenario


class Client:
    """A session of `turns` requests of fixed lengths, all ready at t = 0, `think_s` apart."""

    def __init__(self, c: int, turns: int, think_s: float, owners: dict):
        self.c, self.num_turns, self.think_s, self.arrival_time, self.turn = c, turns, think_s, 0.0, 0
        self.sent, self.ended, self.owners = {}, {}, owners

    def think(self, k: int) -> float:
        return self.think_s

    def request(self, k: int, request_id: int, t: float) -> Request:
        self.sent[k] = t
        self.owners[request_id] = (self, k)
        return Request(request_id, t, 300 + 50 * self.c, 40, None)


class Clients(ClosedLoop):
    """`clients` clients sending `per_client` requests each, as `vllm bench serve --max-concurrency`
    with a think time (kvsim.engine.arrivals.ClosedLoop), remembering when each ended."""

    def __init__(self, clients: int, per_client: int, think_s: float):
        self.owners = {}
        self.sessions = [Client(c, per_client, think_s, self.owners) for c in range(clients)]
        super().__init__(iter(self.sessions), max_concurrency=clients, min_gap=think_s, immediate=True)

    def request_ended(self, seq, now: float) -> None:
        client, k = self.owners[seq.request.request_id]
        client.ended[k] = now
        super().request_ended(seq, now)


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
    assert source.peak_in_flight == 4  # never more than the clients
    for client in source.sessions:
        for k in range(1, 5):  # every later request went out think_s after the client's previous one ended
            assert client.sent[k] == pytest.approx(client.ended[k - 1] + 0.25, abs=1e-12)
            assert client.sent[k] >= client.ended[k - 1]


def test_an_open_loop_stream_ignores_ends():
    requests = [Request(i, 0.1 * i, 200, 20, None) for i in range(10)]
    stream = RequestStream(requests)
    assert not stream.closed_loop and not stream.exhausted
    sim = simulate(stream, 1)
    assert sim.num_received == sim.num_ended == 10 and stream.exhausted
