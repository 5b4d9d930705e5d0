"""Stop a run as soon as its verdict is certain to be "unsustainable" (kvsim plan's fast search).

`VerdictWatch` is an `EngineObserver` around a run's own observer (its `Metrics`, with an energy meter
beside them when the scenario has [energy]): it hands every event on unchanged
and, every so often, counts what the run can no longer undo. When that count alone makes the verdict
of kvsim/results/verdict.py `judge` certain, it raises `VerdictKnown` and the simulation ends there.
Only what is certain counts, so a run the watch stops would have been judged unsustainable had it run
to its end (the plan's searches only read a point's verdict; a record they keep for its figures is
simulated whole). Of N requests and the SLO's percentile P, the figure at P (nearest rank, a rejected
request infinitely late) is over a bound once more than N - k requests are over it, k =
ceil(P N / 100) (kvsim.results.distributions.nearest_rank):

- TTFT, E2E: a request counts once it finished over the bound, was rejected, or still waits for its
  first token (TTFT) or its end (E2E, waiting requests only) at a time already past its arrival plus
  the bound (the API server's overhead included): its figure can only be later still;
- served: more than N - k rejected requests miss the SLO's served share by themselves;
- stable: once every request has arrived, a request still never scheduled after the last arrival
  is in the backlog at the last arrival (kvsim.results.metrics `_arrivals_summary`); more than the
  stability tolerance of them make the run unstable.

Nothing short of the whole run can prove a run sustainable (its last requests may still miss), so the
watch never stops one that way. It watches open-loop runs of a known number of requests only (a
closed loop's arrivals depend on the engine); each check scans the waiting queues from their oldest
requests (the replica that just stepped at its clock, the others at SimPy's, which none of their steps
precedes) and stops scanning a queue at its first request not yet late.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from kvsim.results.verdict import STABILITY_TOLERANCE

if TYPE_CHECKING:
    from kvsim.engine.records import StepRecord
    from kvsim.results.metrics import Metrics
    from kvsim.sequence import Sequence

MARGIN_S = 1e-6  # a waiting request counts as late only this far past its bound (rounding)
CHECK_EVERY = 16  # engine events between two checks (a check scans a queue's late head)


class VerdictKnown(Exception):
    """Raised out of the simulation: the run is certain to be unsustainable. `kind` names what made it
    certain (`ttft_ms`, `e2e_ms`, `served`, `stable`); `reason` says it in one line."""

    def __init__(self, kind: str, reason: str, at_s: float):
        super().__init__(kind, reason, at_s)  # all of them: SimPy re-raises a process's exception as type(e)(*e.args)
        self.kind, self.reason, self.at_s = kind, reason, at_s

    def __str__(self) -> str:
        return self.reason


def allowed_misses(total: int, percentile: float) -> int:
    """N - k: how many of `total` requests may be over a bound with the figure at the percentile still
    within it (k as kvsim.results.distributions.nearest_rank ranks)."""
    k = max(1, math.ceil(round(percentile * total / 100.0, 9)))
    return total - k


class VerdictWatch:
    """The run's observer while it is watched (module docstring); `sim` is the Simulation (its observer,
    which the watch wraps, its replicas' waiting queues, its arrivals so far), `metrics` the run's (the
    SLO), `total` the requests the run will receive."""

    __slots__ = ("inner", "metrics", "sim", "total", "interval", "allowed", "backlog_allowed", "ttft_ms", "e2e_ms",
                 "overhead_s", "late_ttft", "late_e2e", "rejected", "events", "backlog")

    def __init__(self, metrics: Metrics, sim, total: int):
        self.inner = sim.observer  # what the run reports to (the metrics, with an energy meter beside them)
        self.metrics, self.sim, self.total, self.interval = metrics, sim, total, self.inner.interval
        slo = metrics.slo
        self.allowed = allowed_misses(total, slo.percentile)
        self.backlog_allowed = math.floor(STABILITY_TOLERANCE * total + 1e-9)  # more than this: unstable
        self.ttft_ms, self.e2e_ms = (math.inf if v is None else v for v in (slo.ttft_ms, slo.e2e_ms))
        self.overhead_s = metrics.request_overhead_s
        self.late_ttft = self.late_e2e = self.rejected = self.events = 0
        self.backlog: dict[int, int] = {}  # replica -> never-scheduled requests at its first check after the last arrival

    # ---- EngineObserver: the run's own observer first, then the count
    def on_reject(self, seq: Sequence) -> None:
        self.inner.on_reject(seq)
        self.rejected += 1

    def on_held_back(self, step: StepRecord) -> None:
        self.inner.on_held_back(step)

    def on_step(self, step: StepRecord) -> None:
        self.inner.on_step(step)
        overhead = self.overhead_s
        for seq in step.finished:  # as Metrics.on_finish computes them, compared as judge compares
            arrival = seq.request.arrival_time
            if (seq.first_token_time - arrival + overhead) * 1e3 > self.ttft_ms:
                self.late_ttft += 1
            if (seq.finish_time - arrival + overhead) * 1e3 > self.e2e_ms:
                self.late_e2e += 1
        self.events += 1
        if self.events % CHECK_EVERY == 0 or (step.replica not in self.backlog
                                              and self.sim.num_received == self.total):
            self.check(step.replica, step.end)

    # ---- the check
    def check(self, replica: int, now: float) -> None:
        if self.rejected > self.allowed:
            self.stop("served", f"{self.rejected:,} of {self.total:,} requests rejected", now)
        sim = self.sim
        waiting = sim.replicas[replica].scheduler.waiting
        # other replicas' queues at SimPy's clock: no step of theirs starts before it
        others = [(rep.scheduler.waiting, sim.env.now) for rep in sim.replicas
                  if rep.index != replica] if sim.env is not None else []
        for key, bound, done in (("ttft_ms", self.ttft_ms, self.late_ttft), ("e2e_ms", self.e2e_ms, self.late_e2e)):
            if bound == math.inf:
                continue
            need = self.allowed + 1 - done - self.rejected  # late waiting requests that settle it
            late = 0
            for queue, clock in [(waiting, now)] + others:
                late += late_waiting(queue, clock - bound / 1e3 - self.overhead_s - MARGIN_S, need - late,
                                     key == "ttft_ms")
                if late >= need:
                    break
            if late >= need:
                self.stop(key, f"more than {self.allowed:,} of {self.total:,} requests over the "
                               f"{key[:-3].upper()} bound already", now)
        if replica not in self.backlog and sim.num_received == self.total and now > sim.last_arrival_time:
            # never scheduled by now, so first scheduled after the last arrival: this replica's backlog is
            # at least this (it only shrinks from here: nothing arrives any more)
            self.backlog[replica] = sum(1 for seq in waiting if seq.first_scheduled_time < 0)
            if sum(self.backlog.values()) > self.backlog_allowed:
                self.stop("stable", f"{sum(self.backlog.values()):,} of {self.total:,} requests still unscheduled "
                                    "after the last arrival", now)

    def stop(self, kind: str, reason: str, now: float) -> None:
        raise VerdictKnown(kind, f"stopped at {now:.3f} s: {reason}", now)


def late_waiting(waiting, arrived_before: float, need: int, first_token: bool) -> int:
    """Waiting requests that arrived before `arrived_before` (strictly) and have not had their first
    token (`first_token`) or have not ended, counted from the queue's head up to `need`. Requests
    that come back to the queue (preempted, ready again) go to its head; new ones join its tail in
    arrival order, so the scan ends at the first new one that is not late."""
    count = 0
    for seq in waiting:
        if seq.request.arrival_time < arrived_before:
            if not first_token or seq.first_token_time < 0:
                count += 1
                if count >= need:
                    return count
        elif seq.first_scheduled_time < 0:
            return count
    return count


def watched_total(scenario) -> Optional[int]:
    """How many requests a run of the scenario will receive, when the watch can judge it: an open loop
    of a known count (no duration cut, no sessions, no closed loop, not disaggregated); else None."""
    from kvsim.scenario.workload import expected_count

    wl = scenario.workload
    if (wl.duration_s is not None or wl.sessions is not None or wl.max_concurrency is not None
            or wl.arrival.process == "immediate" or scenario.disaggregation is not None):
        return None
    return expected_count(scenario)
