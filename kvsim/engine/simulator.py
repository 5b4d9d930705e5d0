"""The discrete-event simulation of one policy: SimPy processes for arrivals and engine loops.

The arrival process pulls requests from the workload stream and routes each to a replica. Each
replica's engine loop asks its scheduler for a batch, asks the backend how long the step takes, and
advances the clock by it. A run of identical decode steps (nothing arrives, finishes or runs out of
blocks in between) is one event, priced in closed form by backends that offer it: the number of
events grows with scheduling changes, not with generated tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Optional

import simpy

from kvsim.engine.block_manager import BlockManager
from kvsim.engine.contiguous import ContiguousAllocator
from kvsim.engine.fused_run import RunSeries
from kvsim.engine.scheduler import Scheduler
from kvsim.sequence import Request, Sequence

if TYPE_CHECKING:  # the engine only calls the Metrics it is given
    from kvsim.results.metrics import Metrics


# prefix_affinity (cache-aware routing, as SGLang's router): follow the longest cached prefix
# unless that replica holds more than FACTOR x the least loaded one's requests + SLACK.
AFFINITY_LOAD_FACTOR, AFFINITY_LOAD_SLACK = 2, 8


def _load(rep) -> int:
    return rep.scheduler.num_unfinished


@dataclass(slots=True)
class Replica:
    index: int
    scheduler: Scheduler
    backend: object
    idle: Optional[simpy.Event] = None
    clock: float = 0.0  # when the engine last went idle (its steps may run ahead of env.now)


def make_allocator(scenario, policy, num_blocks: int, max_model_len: int):
    engine = scenario.engine
    if policy.allocator == "contiguous":
        return ContiguousAllocator(num_blocks, engine.block_size, max_model_len, policy.contiguous_reserve)
    return BlockManager(num_blocks, engine.block_size, scenario.prefix_caching(policy))


def make_scheduler(scenario, limits, allocator, num_host_blocks: int, use_cohort: bool = False,
                   track_longest: bool = True) -> Scheduler:
    """A scheduler with the policy's resolved engine limits (kvsim.scenario.defaults.engine_limits)."""
    return Scheduler(allocator, use_cohort=use_cohort, track_longest=track_longest,
                     max_num_seqs=limits.max_num_seqs,
                     max_num_batched_tokens=limits.max_num_batched_tokens, max_model_len=limits.max_model_len,
                     enable_chunked_prefill=limits.enable_chunked_prefill,
                     preemption_mode=scenario.engine.preemption_mode, num_host_blocks=num_host_blocks)


class Simulation:
    """One policy's run: `Simulation(...).run(requests)` drives every request to an end."""

    def __init__(self, replicas: list[Replica], metrics: Metrics, router: str = "least_loaded",
                 on_progress: Optional[Callable[[int], None]] = None):
        self.env = simpy.Environment()
        self.replicas = replicas
        self.metrics = metrics
        self.router = router
        self.on_progress = on_progress
        self.next_arrival_time = math.inf
        self.num_received = 0
        self.num_ended = 0
        self.num_steps = 0  # engine events (a fused decode run counts once)
        self.num_decode_steps = 0  # engine steps those events stand for
        self._rr = 0

    def run(self, requests: Iterable[Request]) -> float:
        """Simulate until every request has finished or been rejected; returns the end time."""
        self.env.process(self._arrivals(iter(requests)))
        for rep in self.replicas:
            self.env.process(self._engine_loop(rep))
        self.env.run()
        stuck = sum(r.scheduler.num_unfinished for r in self.replicas)
        if stuck:
            raise RuntimeError(f"simulation ended with {stuck} requests unaccounted for")
        return max(self.env.now, *(rep.clock for rep in self.replicas))

    # ---- arrivals ------------------------------------------------------------------------
    def _arrivals(self, requests):
        env = self.env
        req = next(requests, None)
        while req is not None:
            self.next_arrival_time = req.arrival_time
            if req.arrival_time > env.now:
                yield env.timeout(req.arrival_time - env.now)
            self._dispatch(Sequence(req))
            req = next(requests, None)
        self.next_arrival_time = math.inf

    def _route(self, seq: Sequence) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.router == "round_robin":
            self._rr = (self._rr + 1) % len(self.replicas)
            return self.replicas[self._rr]
        least = min(self.replicas, key=_load)
        if self.router == "prefix_affinity" and seq.request.token_ids is not None:
            # The replica caching the longest prefix of the prompt, unless it is much busier.
            best = max(self.replicas, key=lambda r: (r.scheduler.allocator.cached_prefix_blocks(seq), -_load(r)))
            if _load(best) <= AFFINITY_LOAD_FACTOR * _load(least) + AFFINITY_LOAD_SLACK:
                return best
        return least

    def _dispatch(self, seq: Sequence) -> None:
        self.num_received += 1
        rep = self._route(seq)
        if rep.scheduler.add(seq):
            if rep.idle is not None:
                rep.idle.succeed()
                rep.idle = None
        else:
            seq.finish_time = self.env.now
            self.metrics.on_reject(seq)
            self._ended(1)

    def _ended(self, n: int) -> None:
        self.num_ended += n
        if self.on_progress is not None:
            self.on_progress(n)

    # ---- engine --------------------------------------------------------------------------
    def _engine_loop(self, rep: Replica):
        env, sched, backend, metrics = self.env, rep.scheduler, rep.backend, self.metrics
        alloc = sched.allocator
        series = metrics.series(rep.index)
        fuse = getattr(backend, "fuses_decode_runs", False)
        runs = RunSeries(sched, backend, metrics.interval) if fuse else None
        # bound once: this loop runs once per engine event
        schedule, postprocess, sample, peek = sched.schedule, sched.postprocess, metrics.sample, env.peek
        waiting, swapped = sched.waiting, sched.swapped  # the scheduler's queues (never replaced)
        now = env.now  # this engine's clock: ahead of env.now while it needs no SimPy event (below)
        cohort_last_token = 0.0  # when the scheduler's decode cohort last produced tokens
        while True:
            if not sched.num_unfinished:
                rep.clock = now
                rep.idle = env.event()
                yield rep.idle
                now = env.now
                continue
            batch = schedule()
            seqs, cohort_size = batch.seqs, batch.cohort_size
            if not seqs and not cohort_size:
                raise RuntimeError("scheduler made no progress with work queued")
            for seq in batch.dissolved:
                seq.last_token_time = cohort_last_token
            for seq in seqs:
                if seq.first_scheduled_time < 0:
                    seq.first_scheduled_time = now
                elif seq.preempted_at >= 0:  # back after a preemption
                    seq.preempted_s += now - seq.preempted_at
                    seq.preempted_at = -1.0
            for seq in batch.preempted:
                seq.preempted_at = now
            fused = False
            if fuse and not seqs and not batch.preempted:  # cohort only: a decode run
                # as many identical steps as start before the next arrival and end by the next finish
                k, duration, first = backend.decode_run(batch, batch.min_output_left, self.next_arrival_time - now)
                if k > 1:
                    fits, more = sched.plan_decode_run(batch, k)
                    if fits < k:
                        k, duration, first = backend.decode_run(batch, fits)
                    if k > 1:  # its figures step by step, read before its later blocks are taken
                        runs.plan(batch, k, now, first, duration, series.bucket_end)
                        if more:
                            alloc.reserve(more)
                        fused = True
            else:
                k, duration = 1, backend.execute(batch)
                first = duration
            end = now + duration
            if waiting:
                metrics.held_back(sched.admission_limit, duration)
            # Only SimPy events due before the step ends (arrivals, other replicas' steps) can
            # change what this engine sees next; while there are none, skip the timeout and go on.
            if end >= peek():
                yield env.timeout(end - env.now)
            self.num_steps += 1
            self.num_decode_steps += k
            emitted, finished = postprocess(batch, k)
            if emitted:
                self._stamp_tokens(emitted, now + first, end)
            if cohort_size:  # a run's later steps differ by far less than a histogram bin: their mean
                metrics.record_run_itl(now + first - cohort_last_token, cohort_size,
                                       (duration - first) / (k - 1) if k > 1 else 0.0, cohort_size * (k - 1))
            cohort_last_token = end
            if finished:
                for seq in finished:
                    seq.last_token_time = seq.finish_time = end
                    backend.free(seq)
                    metrics.on_finish(seq)
                self._ended(len(finished))
            block_s = -1.0  # KV block-seconds since the last sample; -1: the last sample's use held throughout
            if fused:
                for mark in runs.marks:  # the rows of the buckets the run crossed, as step by step
                    sample(mark[0], series, *mark[1:], 0.0)
                metrics.note_used(series, runs.peak)  # the use after the run's next-to-last step
                block_s = runs.block_s
            used, cached, free = alloc.block_counts()
            sample(end, series, sched.num_running, len(waiting), len(swapped), used, cached, free - cached,
                   alloc.reserved_unused_tokens, batch.num_prefill_tokens + batch.num_decode_seqs,
                   alloc.external_fragmentation, block_s)
            now = end

    def _stamp_tokens(self, emitted: list[Sequence], t_token: float, t_end: float) -> None:
        """Token times of the explicitly scheduled sequences (one token each, at t_token)."""
        gaps = []
        for seq in emitted:
            if seq.first_token_time < 0:
                seq.first_token_time = t_token
            else:
                gaps.append(t_token - seq.last_token_time)
            seq.last_token_time = t_end
        if gaps:
            self.metrics.record_itls(gaps)
