"""The discrete-event simulation of one policy: SimPy processes for arrivals and engine loops.

The arrival process takes requests from an `ArrivalSource` and sends each to the replica its
`Router` picks. A closed-loop source (kvsim/engine/arrivals.py: clients that wait for their
requests) is not pulled ahead: a *wake* at its `next_time` dispatches what is due then, and every
end is told to it and re-arms the wake when an earlier request became due. Wakes go before engine
events of the same instant (SimPy's URGENT priority), so a request released at t is seen by a step
that starts at t, except the step its own engine starts in the same instant it ended. Each replica's engine loop asks its `Replica` to begin a step (schedule and price
it), tells the `EngineObserver` if requests wait while it runs, waits until the step ends,
completes it and tells the observer what it did. A run of identical decode steps (nothing arrives,
finishes or runs out of blocks in between) is one event, priced in closed form by backends that
offer it: the number of events grows with scheduling changes, not with generated tokens. A run
never starts a step after the next arrival; in a closed loop that includes what another replica's
step can release when it ends (`Simulation.arrival_bound`: its end plus the source's least think
time), so per-request results do not depend on fusion.

Each engine loop keeps its own clock and yields a SimPy timeout only when another SimPy event (an
arrival, another replica's step) is due before its step ends: until then nothing could change what
it sees next. Results are those of yielding every step. A lone replica needs no event queue at all:
`OneReplicaClock` replays SimPy's clock and order for it.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Callable, Optional

from kvsim.engine.interfaces import ArrivalSource, EngineObserver, Router
from kvsim.engine.replica import Replica
from kvsim.sequence import Sequence

if TYPE_CHECKING:
    import simpy


class Simulation:
    """One policy's run: `Simulation(...).run(source)` drives every request to an end."""

    ONE_REPLICA_WITHOUT_SIMPY = True  # a lone replica runs on a OneReplicaClock (False: on SimPy, for tests)

    def __init__(self, replicas: list[Replica], observer: EngineObserver, router: Router,
                 on_progress: Optional[Callable[[int], None]] = None):
        self.env: Optional[simpy.Environment] = None  # SimPy's, for several replicas (one runs without)
        self.replicas = replicas
        self.observer = observer
        self.router = router
        self.on_progress = on_progress
        self.source: Optional[ArrivalSource] = None
        self.next_arrival_time = math.inf  # the pending arrival (bounds fused runs)
        self.num_received = 0
        self.last_arrival_time = -math.inf  # the latest arrival dispatched (a watching observer reads it)
        self.num_ended = 0
        self.closed = False  # the source is a closed loop: wakes dispatch its requests
        self.last_dispatch = 0.0  # a closed loop's last dispatch (stale wakes may fire later)
        self._armed: set[float] = set()  # targets of the wakes not yet fired
        self.schedule_wake: Optional[Callable[[float], None]] = None

    @property
    def num_steps(self) -> int:
        """Engine events, a fused decode run counting once."""
        return sum(rep.num_events for rep in self.replicas)

    @property
    def num_decode_steps(self) -> int:
        """Engine steps those events stand for."""
        return sum(rep.num_steps for rep in self.replicas)

    def run(self, source: ArrivalSource) -> float:
        """Simulate until every request has finished or been rejected; returns the end time."""
        self.source, self.closed = source, source.closed_loop
        if len(self.replicas) == 1 and self.ONE_REPLICA_WITHOUT_SIMPY:
            end = self._run_alone(self.replicas[0])
        else:
            import simpy

            env = self.env = simpy.Environment()
            if not self.closed:
                env.process(self._arrivals())
            for rep in self.replicas:
                env.process(self._engine_loop(rep))
            if self.closed:
                self.start_wakes(env)
            env.run()
            end = max(self.last_dispatch if self.closed else env.now, *(rep.clock for rep in self.replicas))
        stuck = sum(rep.scheduler.num_unfinished for rep in self.replicas)
        if stuck or not source.exhausted:
            raise RuntimeError(f"simulation ended with {stuck} requests unaccounted for")
        return end

    # ---- arrivals ------------------------------------------------------------------------
    def _arrivals(self):
        """An open-loop source's arrival process: each request pulled as the previous one is sent."""
        env = self.env
        while True:
            req = self._next_request()
            if req is None:
                break
            self.next_arrival_time = req.arrival_time
            if req.arrival_time > env.now:
                yield env.timeout(req.arrival_time - env.now)
            self.dispatch(Sequence(req), env.now)
        self.next_arrival_time = math.inf

    def _next_request(self):
        """The source's next request (None once it is exhausted); a pool that holds requests back overrides it."""
        return self.source.next_request()

    def dispatch(self, seq: Sequence, now: float) -> None:
        """A request arrives at `now`: to the replica the router picks, or rejected."""
        self.num_received += 1
        self.last_arrival_time = seq.request.arrival_time
        rep = self.replicas[self.router.route(seq)]
        if rep.scheduler.add(seq):
            if rep.idle is not None:
                rep.idle.succeed()
                rep.idle = None
        else:
            seq.finish_time = now
            self.observer.on_reject(seq)
            self._ended([seq], now)

    def _ended(self, seqs: list[Sequence], now: float) -> None:
        self.num_ended += len(seqs)
        if self.closed:
            for seq in seqs:
                self.source.request_ended(seq, now)
            self.arm()
        if self.on_progress is not None:
            self.on_progress(len(seqs))

    # ---- a closed loop's wakes -------------------------------------------------------------------
    def start_wakes(self, env: simpy.Environment) -> None:
        """A closed loop's wakes on `env`, the first armed (after the engine loops' processes)."""
        wake = wake_event_type()
        self.schedule_wake = lambda t: wake(env, max(0.0, t - env.now), t).callbacks.append(self._wake)
        self.arm()

    def arm(self) -> None:
        """A wake at the source's next send, unless one is armed for that instant already."""
        t = self.source.next_time
        self.next_arrival_time = t
        if t < math.inf and t not in self._armed:
            self._armed.add(t)
            self.schedule_wake(t)

    def _wake(self, event) -> None:
        self.send_due(event.value, self.env.now)

    def send_due(self, target: float, now: float) -> None:
        """The wake armed for `target` fires at `now`: every request due by `target` is dispatched."""
        self._armed.discard(target)
        source = self.source
        while source.next_time <= target:
            self.last_dispatch = now
            self.dispatch(Sequence(source.next_request()), now)
        self.arm()

    def arrival_bound(self, rep: Replica, now: float) -> float:
        """No step of a fused run on `rep` (planned at `now`) may start at or after this: the
        closed loop's next send, or the soonest another replica can release one: the end of its
        step in progress (whether or not that step finishes a request, the next one may), plus the
        least think time. An idle replica's next step follows an arrival, which bounds it."""
        t, gap = self.source.next_time, self.source.min_gap
        for other in self.replicas:
            if other is not rep and other.idle is None and other.record.end + gap < t:
                t = other.record.end + gap
        return t

    def run_bound(self, rep: Replica, now: float) -> float:
        """No step of a fused run planned on `rep` at `now` may start at or after this: the next
        arrival (a closed loop: `arrival_bound`). An autoscaled pool bounds it by the arrivals that
        could reach `rep` (kvsim.engine.fleet)."""
        return self.arrival_bound(rep, now) if self.closed else self.next_arrival_time

    # ---- engine --------------------------------------------------------------------------
    def _engine_loop(self, rep: Replica):
        env, observer, peek = self.env, self.observer, self.env.peek
        now = env.now  # this engine's clock: ahead of env.now while it needs no SimPy event
        while True:
            if not rep.scheduler.num_unfinished:
                rep.clock = now
                rep.idle = env.event()
                yield rep.idle
                now = env.now
                continue
            step = rep.begin(now, self.run_bound(rep, now))
            if step.admission_limit:
                observer.on_held_back(step)
            if step.end >= peek():  # a SimPy event is due before the step ends: let it happen first
                yield env.timeout(step.end - env.now)
            finished = rep.complete(step)
            observer.on_step(step)
            if finished:
                self._ended(finished, step.end)
            now = step.end

    # ---- one replica ----------------------------------------------------------------------
    def _run_alone(self, rep: Replica) -> float:
        """The engine loop of a lone replica, with the arrival process replayed by a OneReplicaClock:
        every event happens when, and in the order, SimPy would run it (so the results are the same
        bytes), without an event queue, timeouts or generator switches."""
        observer = self.observer
        clock = WakeClock(self) if self.closed else OneReplicaClock(self)
        now = 0.0
        while True:
            if not rep.scheduler.num_unfinished:
                rep.clock = now
                while not rep.scheduler.num_unfinished and clock.pending is not None:
                    clock.fire_next()  # the engine waits: arrivals come until one is queued
                if not rep.scheduler.num_unfinished:
                    return max(clock.end, rep.clock)
                now = clock.now
                continue
            step = rep.begin(now, self.next_arrival_time)
            if step.admission_limit:
                observer.on_held_back(step)
            if step.end >= clock.fire:  # the engine would yield a timeout: arrivals due by then come first
                clock.engine_waits_until(step.end)
            finished = rep.complete(step)
            observer.on_step(step)
            if finished:
                self._ended(finished, step.end)
            now = step.end


class OneReplicaClock:
    """SimPy's clock and event order for one engine and the arrival process, replayed.

    SimPy's `now` is the time of the event it last ran; a timeout of `d` scheduled at `now` fires at
    `now + d`, the arrival process's at `a` thus at now + (a - now), which rounding may put an ulp
    away from `a`; equal times fire in the order they were scheduled. The engine yields a timeout
    only when its step ends at or after the pending arrival's firing time (`Simulation._engine_loop`),
    so that arrival was scheduled first: it fires before the engine resumes if it is due by then,
    and arrivals scheduled while the engine waits fire before it only if strictly earlier."""

    __slots__ = ("sim", "now", "pending", "fire")

    def __init__(self, sim: Simulation):
        self.sim, self.now = sim, 0.0
        self.pending, self.fire = None, math.inf  # the arrival whose timeout is scheduled, and when it fires
        self._release()

    def _release(self) -> None:
        """The arrival process runs at `now`: requests already due are dispatched, the next scheduled."""
        sim, source, now = self.sim, self.sim.source, self.now
        while True:
            req = source.next_request()
            if req is None:
                self.pending, self.fire = None, math.inf
                sim.next_arrival_time = math.inf
                return
            sim.next_arrival_time = req.arrival_time
            if req.arrival_time > now:
                self.pending, self.fire = req, now + (req.arrival_time - now)
                return
            sim.dispatch(Sequence(req), now)

    def fire_next(self) -> None:
        """The pending arrival's timeout fires."""
        self.now, req = self.fire, self.pending
        self.sim.dispatch(Sequence(req), self.now)
        self._release()

    def engine_waits_until(self, end: float) -> None:
        """The engine yields a timeout until its step's `end`: arrivals fire first as SimPy orders them."""
        resume = self.now + (end - self.now)
        if self.fire <= resume:
            self.fire_next()
            while self.fire < resume:
                self.fire_next()
        self.now = resume

    @property
    def end(self) -> float:
        return self.now


class WakeClock:
    """SimPy's clock and event order for one engine and a closed loop's wakes, replayed: a wake for
    target t armed at `now` fires at now + (t - now) (not before now), wakes fire in time order and
    among equal times in the order armed, all before the engine resumes at the same instant (they
    are URGENT, the engine's timeout and idle wake-up are not). `end`: the last dispatch (a wake
    whose requests an earlier one sent fires for nothing)."""

    __slots__ = ("sim", "now", "wakes", "armed")

    def __init__(self, sim: Simulation):
        self.sim, self.now, self.wakes, self.armed = sim, 0.0, [], 0
        sim.schedule_wake = self.push  # the simulation arms its wakes here
        sim.arm()

    @property
    def pending(self) -> Optional[bool]:
        return True if self.wakes else None

    @property
    def fire(self) -> float:
        return self.wakes[0][0] if self.wakes else math.inf

    @property
    def end(self) -> float:
        return self.sim.last_dispatch

    def push(self, target: float) -> None:
        self.armed += 1
        heapq.heappush(self.wakes, (self.now + max(0.0, target - self.now), self.armed, target))

    def _fire_one(self) -> None:
        self.now, _, target = heapq.heappop(self.wakes)
        self.sim.send_due(target, self.now)

    def fire_next(self) -> None:
        """The earliest wakes fire, with every one due at that instant (armed meanwhile too)."""
        first = self.wakes[0][0]
        while self.wakes and self.wakes[0][0] <= first:
            self._fire_one()

    def engine_waits_until(self, end: float) -> None:
        """The engine's timeout until `end`: the wakes due by then fire first."""
        resume = self.now + (end - self.now)
        while self.wakes and self.wakes[0][0] <= resume:
            self._fire_one()
        self.now = resume


_WAKE = None


def wake_event_type():
    """SimPy's Timeout scheduled URGENT, carrying its target (simpy is imported only when needed)."""
    global _WAKE
    if _WAKE is None:
        from simpy.events import URGENT, Timeout

        class Wake(Timeout):
            def __init__(self, env, delay: float, target: float):
                self.env, self.callbacks = env, []
                self._value, self._delay, self._ok = target, delay, True
                env.schedule(self, URGENT, delay)

        _WAKE = Wake
    return _WAKE
