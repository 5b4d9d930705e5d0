"""A pool of replicas that come and go under an autoscaler (`FleetSimulation`, a `Simulation`).

Besides the arrival process and one engine loop per replica, two SimPy processes run: a Prometheus
scrape every `scrapes.interval` seconds (kvsim/engine/observe.py) and the autoscaler's loop every
`autoscaler.period_s` seconds (kvsim/engine/autoscalers.py), which scales the pool to the count it
returns. A replica's life, each moment recorded in its `Member`:

- created at a scale-up (billed from then): Pending for the startup's `pending_s` (node, container),
  then Running without metrics; ready `startup.total_s` after its creation, when the router starts
  sending it requests and Prometheus scraping it;
- at a scale-down, as a ReplicaSet picks pods: starting replicas first (the newest first), then the
  ready ones that became ready last. A starting replica is gone at once; a ready one drains: the
  router sends it nothing new, it finishes what it holds and is removed when it runs out of work
  (its clock then), as vLLM's graceful shutdown under a termination grace period long enough to finish.

The router sees only ready replicas (`ready`, kept in index order: least loaded breaks ties by
index). Requests that arrive while none is ready wait at the gateway (`held`, first come first
served) and are routed when one becomes ready; the gateway's queue is a metric (KEDA scales from zero
on it).

Fused decode runs with the least-loaded router: a run on replica R need only stop before an arrival
that R could get. Between two arrivals the other replicas' unfinished counts only fall (they finish
requests) and R's holds (its run ends at its next finish), so R is not the least loaded (ties to the
lower index) until every other replica o has at least R's count (one more when o's index is lower):
the next K = Σ_o max(0, c_R - c_o + [o.index < R.index]) arrivals all go elsewhere, and R's run is
bounded by the (K + 1)-th, and by the next autoscaler tick (a scale-down can take a replica out of
the way). A draining replica gets no arrivals at all. Per-request results are those of cutting every
run at every arrival (`Simulation`'s rule) up to the rounding of split closed-form sums; events fall
from one per arrival per busy replica to about one per arrival.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from kvsim.engine.autoscalers import FleetView
from kvsim.engine.interfaces import Autoscaler, EngineObserver
from kvsim.engine.observe import Latencies, Scrapes
from kvsim.engine.replica import Replica
from kvsim.engine.router import LeastLoaded
from kvsim.engine.simulator import Simulation
from kvsim.sequence import Sequence


@dataclass(slots=True)
class Member:
    """One replica's life (simulated seconds; -1: not (yet) reached). Billed from `created` to
    `removed` (or the end of the day)."""

    index: int
    created: float
    running: float  # its container runs (Pending before)
    ready: float = -1.0
    drain: float = -1.0
    removed: float = -1.0


class FleetSimulation(Simulation):
    """One policy's run on an autoscaled pool (module docstring). `factory(index)` builds a replica;
    `startup` is a kvsim.perf.startup.StartupDelay; `make_router(ready)` the router over the list of
    ready replicas; `latencies` collects finished requests' TTFT and TPOT for an SLO-driven
    autoscaler (None: none reads them); `overhead_s` is the API server's time added to each TTFT."""

    def __init__(self, factory: Callable[[int], Replica], autoscaler: Autoscaler, startup, initial: int,
                 observer: EngineObserver, make_router: Callable[[list], object], scrapes: Scrapes,
                 latencies: Optional[Latencies] = None, overhead_s: float = 0.0,
                 on_progress: Optional[Callable[[int], None]] = None):
        ready = [factory(i) for i in range(initial)]
        super().__init__(list(ready), observer, make_router(ready), on_progress)
        self.factory, self.autoscaler, self.startup = factory, autoscaler, startup
        self.ready, self.scrapes, self.latencies, self.overhead_s = ready, scrapes, latencies, overhead_s
        self.members = [Member(i, 0.0, 0.0, 0.0) for i in range(initial)]
        self.starting: list[int] = []  # indices, creation order
        self.draining: set[int] = set()
        self.held: deque[Sequence] = deque()
        self.upcoming: deque = deque()  # requests pulled ahead of the pending arrival
        self.bounded = isinstance(self.router, LeastLoaded)
        self.next_tick = math.inf  # the next autoscaler tick (a scale-down may reorder the routing)
        self.changes: list[tuple[float, int, int, int]] = [(0.0, initial, initial, 0)]  # (t, spec, ready, draining)
        self.decisions: list[tuple[float, int]] = []  # (t, desired) whenever it differs from spec

    # ---- the pool ----------------------------------------------------------------------------
    @property
    def spec(self) -> int:
        return len(self.ready) + len(self.starting)

    def _record(self, now: float) -> None:
        self.changes.append((now, self.spec, len(self.ready), len(self.draining)))

    def scale_to(self, desired: int, now: float) -> None:
        """Create or remove replicas until `spec` is `desired`."""
        while self.spec < desired:
            self._create(now)
        while self.spec > desired:
            if self.starting:
                member = self.members[self.starting.pop()]
                member.removed = now
            else:
                self._drain(max(self.ready, key=lambda r: (self.members[r.index].ready, r.index)), now)
        self._record(now)

    def _create(self, now: float) -> None:
        index = len(self.replicas)
        rep = self.factory(index)
        self.replicas.append(rep)
        member = Member(index, now, now + self.startup.pending_s)
        self.members.append(member)
        self.starting.append(index)
        view = getattr(self.router, "view", None)
        if view is not None:
            view.add_replica()
        self.env.timeout(self.startup.total_s).callbacks.append(lambda _: self._became_ready(member))

    def _became_ready(self, member: Member) -> None:
        if member.removed >= 0:  # scaled away while starting
            return
        now = self.env.now
        member.ready = now
        self.starting.remove(member.index)
        rep = self.replicas[member.index]
        rep.clock = now
        insort(self.ready, rep, key=lambda r: r.index)
        self.env.process(self._engine_loop(rep))
        self._record(now)
        while self.held:
            seq = self.held.popleft()
            self.num_received -= 1  # counted when it first arrived
            Simulation.dispatch(self, seq, now)

    def _drain(self, rep: Replica, now: float) -> None:
        self.ready.remove(rep)
        self.draining.add(rep.index)
        self.members[rep.index].drain = now

    def _retire_drained(self) -> None:
        """Replicas that finished draining are removed (at the moment they ran out of work)."""
        for index in [i for i in self.draining if not self.replicas[i].scheduler.num_unfinished]:
            member = self.members[index]
            member.removed = max(member.drain, self.replicas[index].clock)
            self.draining.discard(index)
            self._record(member.removed)

    # ---- arrivals ------------------------------------------------------------------------------
    def _next_request(self):
        """The next request: one already read ahead by arrival_after first."""
        return self.upcoming.popleft() if self.upcoming else self.source.next_request()

    def arrival_after(self, k: int) -> float:
        """When the (k + 1)-th arrival from now comes (the pending one is the first)."""
        while len(self.upcoming) < k:
            req = self.source.next_request()
            if req is None:
                return math.inf
            self.upcoming.append(req)
        return self.upcoming[k - 1].arrival_time

    def dispatch(self, seq: Sequence, now: float) -> None:
        if self.ready:
            super().dispatch(seq, now)
        else:  # no replica is ready: the gateway holds it
            self.num_received += 1
            self.held.append(seq)

    def _ended(self, seqs: list[Sequence], now: float) -> None:
        super()._ended(seqs, now)
        lat = self.latencies
        if lat is not None:
            for seq in seqs:
                if seq.first_token_time >= 0:
                    n = seq.num_output_tokens
                    tpot = (seq.finish_time - seq.first_token_time) / (n - 1) if n > 1 else None
                    lat.add(now, seq.first_token_time - seq.request.arrival_time + self.overhead_s, tpot)

    def run_bound(self, rep: Replica, now: float) -> float:
        """No step of a fused run on `rep` starts at or after this (module docstring)."""
        t = self.next_arrival_time
        if not self.bounded:
            return t
        if rep.index in self.draining:
            return math.inf
        if t == math.inf:
            return t
        c, idx, k = rep.scheduler.num_unfinished, rep.index, 0
        for o in self.ready:
            d = c - o.scheduler.num_unfinished + (o.index < idx)  # rep itself adds 0
            if d > 0:
                k += d
        if k == 0:
            return t
        return min(self.arrival_after(k), self.next_tick)

    # ---- scrapes and the autoscaler --------------------------------------------------------------
    def view(self, now: float) -> FleetView:
        pending = sum(1 for i in self.starting if now < self.members[i].running)
        live = frozenset(r.index for r in self.ready) | frozenset(self.starting)
        return FleetView(now, self.spec, len(self.ready), pending, len(self.starting) - pending, live,
                         self.scrapes, self.latencies)

    def _done(self) -> bool:
        return (self.next_arrival_time == math.inf and not self.upcoming and not self.held
                and not any(r.scheduler.num_unfinished for r in self.replicas))

    def _scrape_loop(self):
        env, scrapes = self.env, self.scrapes
        while not self._done():
            reporting = self.ready + [self.replicas[i] for i in sorted(self.draining)]
            scrapes.scrape(env.now, reporting, len(self.held), self.spec, len(self.ready))
            yield env.timeout(scrapes.interval)

    def _control_loop(self):
        env, period = self.env, self.autoscaler.period_s
        while not self._done():
            now = env.now
            self.next_tick = now + period
            self._retire_drained()
            desired = self.autoscaler.desired(self.view(now))
            if desired != self.spec:
                self.decisions.append((now, desired))
                self.scale_to(desired, now)
            yield env.timeout(period)
        self.next_tick = math.inf

    def run(self, source) -> float:
        """Simulate until every request has finished; returns the end time."""
        import simpy

        self.source, self.closed = source, False
        env = self.env = simpy.Environment()
        env.process(self._arrivals())
        for rep in self.replicas:
            env.process(self._engine_loop(rep))
        env.process(self._scrape_loop())
        self.next_tick = math.inf
        if math.isfinite(self.autoscaler.period_s):
            self.next_tick = 0.0
            env.process(self._control_loop())
        env.run()
        self._retire_drained()
        stuck = sum(rep.scheduler.num_unfinished for rep in self.replicas) + len(self.held)
        if stuck or not source.exhausted:
            raise RuntimeError(f"simulation ended with {stuck} requests unaccounted for")
        return max((rep.clock for rep in self.replicas), default=0.0)
