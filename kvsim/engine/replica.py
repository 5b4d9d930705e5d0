"""One engine instance: a scheduler over a KV allocator, a backend that prices its steps, its clock.

`Replica.begin` schedules the next step and prices it: one step through `Backend.execute`, or,
when the batch is the decode cohort alone, a run of identical decode steps that ends at the next
finish, before the next arrival and while blocks last (`Backend.decode_run`,
`Scheduler.plan_decode_run`). Under async scheduling (`EngineSettings.async_scheduling`) a step
admits only requests that arrived before the previous step started, as vLLM's AsyncScheduler, which
plans step n+1 while step n runs; a request it leaves waiting runs in the next step, and a run of
decode steps that an arrival cuts takes one step more (the one already planned when it came). `Replica.complete` applies it (`Scheduler.postprocess`), stamps token
times and fills the replica's `StepRecord` for the observer. Neither knows SimPy: the simulator
decides when the step's end is reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kvsim.batch import Batch
from kvsim.engine.block_manager import BlockManager
from kvsim.engine.contiguous import ContiguousAllocator
from kvsim.engine.fused_run import RunSeries
from kvsim.engine.hybrid import HybridBlockManager
from kvsim.engine.records import StepRecord
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.settings import EngineSettings
from kvsim.engine.speculative import SpecScheduler
from kvsim.engine.windowed import WindowedScheduler
from kvsim.sequence import Sequence

if TYPE_CHECKING:
    import simpy


def paged_allocator(settings: EngineSettings, num_blocks: int) -> BlockManager | HybridBlockManager:
    """vLLM's paged KV cache: one block table per sequence, or one per KV cache group when some
    group's layers keep a sliding window shorter than max_model_len (the hybrid allocator)."""
    if settings.kv_windows:
        return HybridBlockManager(num_blocks, settings.block_size, settings.kv_windows,
                                  settings.enable_prefix_caching, settings.step_budget)
    return BlockManager(num_blocks, settings.block_size, settings.enable_prefix_caching)


def contiguous_allocator(settings: EngineSettings, num_blocks: int) -> ContiguousAllocator:
    return ContiguousAllocator(num_blocks, settings.block_size, settings.max_model_len, settings.contiguous_reserve)


# settings.allocator -> a factory of KVAllocators (kvsim.engine.interfaces)
ALLOCATORS = {"paged": paged_allocator, "contiguous": contiguous_allocator}


def make_replica(index: int, settings: EngineSettings, backend, interval: float, allocator=None,
                 scheduler_class=None, replica_class=None) -> Replica:
    """Replica `index` of a policy: its allocator sized by the backend (or `allocator`), and its scheduler
    (`scheduler_class(base)` makes the class from the allocator's base: kvsim.engine.connector)."""
    if allocator is None:
        allocator = ALLOCATORS[settings.allocator](settings, backend.num_blocks)
    base = (SpecScheduler if settings.speculation is not None else
            WindowedScheduler if getattr(allocator, "window", 0) else Scheduler)
    scheduler = (base if scheduler_class is None else scheduler_class(base))(
        allocator, settings, use_cohort=backend.fuses_decode_runs, track_longest=backend.prices_longest_decode)
    return (replica_class or Replica)(index, scheduler, backend, interval, settings.async_scheduling)


class Replica:
    """One engine. `interval`: the observer's sampling interval (for the samples inside fused runs)."""

    __slots__ = ("index", "scheduler", "allocator", "backend", "record", "runs", "idle", "clock",
                 "cohort_last_token", "num_events", "num_steps", "async_scheduling", "busy", "last_start")

    def __init__(self, index: int, scheduler: Scheduler, backend, interval: float, async_scheduling: bool = False):
        self.index, self.scheduler, self.allocator, self.backend = index, scheduler, scheduler.allocator, backend
        self.record = StepRecord(index)
        self.runs = RunSeries(scheduler, backend, interval) if backend.fuses_decode_runs else None
        self.idle: Optional[simpy.Event] = None  # set while the engine waits for work
        self.clock = 0.0  # when the engine last went idle (its steps may run ahead of the SimPy clock)
        self.cohort_last_token = 0.0  # when the scheduler's decode cohort last produced tokens
        self.num_events = 0  # engine events (a fused decode run counts once)
        self.num_steps = 0  # engine steps they stand for
        self.async_scheduling = async_scheduling
        self.busy = False  # work was left after the last event: the next begins at its end
        self.last_start = 0.0  # when the last event's last step started (async scheduling's cut-off)

    def begin(self, now: float, next_arrival: float) -> StepRecord:
        """Schedule and price the next step (or run) starting at `now`; the record's plan and price."""
        step, sched = self.record, self.scheduler
        if self.async_scheduling:
            sched.admit_before = self.last_start if self.busy else now
        batch = sched.schedule()
        if sched.holds_next and not batch.seqs and not batch.cohort_size:  # no step in flight to wait for
            sched.admit_before = now
            batch = sched.schedule()
        seqs = batch.seqs
        if seqs:
            if batch.dissolved:
                for seq in batch.dissolved:
                    seq.last_token_time = self.cohort_last_token
            for seq in seqs:
                if seq.first_scheduled_time < 0:
                    seq.first_scheduled_time = now
                elif seq.preempted_at >= 0:  # back after a preemption
                    seq.preempted_s += now - seq.preempted_at
                    seq.preempted_at = -1.0
        elif not batch.cohort_size:
            return self.wait_for(batch, now, next_arrival)
        if batch.preempted:
            for seq in batch.preempted:
                seq.preempted_at = now
        step.peak_used = -1
        self.last_start = now
        if self.runs is not None and not seqs and not batch.preempted:  # the cohort alone: a run
            # a request left for the next step ends the run after one step
            k, duration, first = self._decode_run(batch, now, 0.0 if sched.holds_next else next_arrival - now)
        else:
            k, duration = 1, self.backend.execute(batch)
            first = duration
        step.batch = batch
        step.num_steps = k
        step.start = now
        step.duration = duration
        step.first_s = first
        step.end = now + duration
        step.admission_limit = sched.admission_limit  # "" when nothing waits for capacity
        return step

    def wait_for(self, batch: Batch, now: float, next_arrival: float) -> StepRecord:
        """Nothing could be scheduled with work queued: an engine without a KV connector never gets here
        (kvsim.engine.connector.ConnectedReplica waits for its transfers)."""
        raise RuntimeError("scheduler made no progress with work queued")

    def _decode_run(self, batch: Batch, now: float, budget_s: float) -> tuple[int, float, float]:
        """As many identical steps as start before the next arrival and end by the next finish,
        while blocks last; a run of k > 1 steps takes its later blocks now, after its figures step
        by step were read (RunSeries)."""
        shape, backend, sched = batch.decode_shape(), self.backend, self.scheduler
        most = batch.min_output_left
        k, duration, first = backend.decode_run(shape, most, budget_s)
        if k < most and budget_s > 0 and self.async_scheduling:  # the step planned when the arrival came
            k += 1
            duration = backend.decode_run_time(shape, k)
        if k > 1:
            plan = sched.plan_decode_run(batch, k)
            if plan.steps < k:
                k, duration, first = backend.decode_run(shape, plan.steps)
            if k > 1:
                self.last_start = now + backend.decode_run_time(shape, k - 1)
                runs = self.runs
                runs.plan(batch, shape, k, now, first, duration, self.record.sample_boundary)
                sched.commit_decode_run(plan)
                self.record.peak_used = runs.peak
        return k, duration, first

    def complete(self, step: StepRecord) -> list[Sequence]:
        """Apply the step now that its end is reached: tokens, finished sequences, the replica's
        state after it (and a fused run's figures step by step) in the record; returns the finished."""
        sched, alloc, batch, end, k = self.scheduler, self.allocator, step.batch, step.end, step.num_steps
        self.num_events += 1
        self.num_steps += k
        emitted, finished = sched.postprocess(batch, k)
        first_token = step.start + step.first_s  # when the (first) step's tokens come
        step.itl_gaps = _stamp_tokens(emitted, first_token, end) if emitted else ()
        size = step.cohort_size = batch.cohort_size
        if size:  # a run's later steps differ by far less than a histogram bin: their mean
            step.cohort_first_gap = first_token - self.cohort_last_token
            step.cohort_later_gap = (step.duration - step.first_s) / (k - 1) if k > 1 else 0.0
        self.cohort_last_token = end
        if finished:
            free = self.backend.free
            for seq in finished:
                seq.last_token_time = seq.finish_time = end
                free(seq)
        step.finished = finished
        self.busy = sched.num_unfinished > 0
        if step.peak_used >= 0:
            runs = self.runs
            step.marks, step.used_block_s = runs.marks, runs.block_s
            if runs.marks and self.async_scheduling:
                step.marks = runs.with_arrivals(step.start)
        else:
            step.used_block_s = -1.0
        used, cached, free = alloc.block_counts()
        step.sample = (end, sched.num_running, len(sched.waiting), len(sched.swapped), used, cached, free - cached,
                       alloc.reserved_unused_tokens, alloc.external_fragmentation)
        step.batch_tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        return finished


def _stamp_tokens(emitted: list[Sequence], t_token: float, t_end: float) -> list[float]:
    """Token times of the explicitly scheduled sequences (one token each, at t_token); their gaps."""
    gaps = []
    for seq in emitted:
        if seq.first_token_time < 0:
            seq.first_token_time = t_token
        else:
            gaps.append(t_token - seq.last_token_time)
        seq.last_token_time = t_end
    return gaps
