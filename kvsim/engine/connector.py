"""A replica with a KV connector (kvsim.engine.interfaces.KVConnector): where its scheduler calls the
connector, and how its engine waits for the connector's transfers.

`ConnectedScheduling` is a mixin over a scheduler class (`connected_scheduler(Scheduler)`, or the
windowed one): its waiting loop is vLLM v0.26.0's (vllm/v1/core/sched/scheduler.py) with the
connector's calls. For a request with nothing computed it takes the local prefix-cache hits, asks
`get_num_new_matched_tokens`, allocates the blocks of the external tokens with the new ones (vLLM's
`allocate_slots(..., num_external_computed_tokens)`) and calls `update_state_after_alloc`. A
synchronous connector's tokens count as computed at once (its load is part of the step); an
asynchronous one's request takes no budget or seat and leaves the queue until `get_finished` hands
it back at a step boundary, to the head of the queue (vLLM keeps such requests, WAITING_FOR_REMOTE_KVS,
at the head and skips them until their KV is in). A request the connector cannot judge yet (None) is
skipped for this step, as vLLM skips it. Requests that reached the engine through the connector
(`connector.waiting`: a decode instance's hand-offs) are admitted after the scheduler's own queue,
and only when nothing waits in it. Finished requests' blocks go to `request_finished` first.

`ConnectedReplica` hands finished loads back before each step, bounds fused decode runs by the
connector's next event, adds a synchronous connector's seconds to the step, and, when nothing can be
scheduled while transfers are in flight, waits until the next one ends (or the next arrival) as one
engine event of no steps: the engine polls (vLLM runs empty steps), a request waits for its own KV.
"""

from __future__ import annotations

import math

from kvsim.engine.records import StepRecord
from kvsim.engine.replica import Replica, make_replica
from kvsim.engine.scheduler import KV_CACHE, MAX_NUM_SEQS, TOKEN_BUDGET, Scheduler
from kvsim.sequence import Sequence, SequenceStatus

WAITING = SequenceStatus.WAITING
NEXT_STEP = "next_step"  # kvsim.engine.scheduler's: the head arrived after the previous step started


class ConnectedScheduling:
    """Mixin: a scheduler whose admissions and frees go through `self.connector` (see the module docstring)."""

    connector = None  # set by connect()

    def connect(self, connector) -> None:
        self.connector = connector
        self.owed: dict = {}  # asynchronously loading requests -> blocks their prompt still needs after the load
        self.owed_blocks = 0

    def free(self, seq: Sequence) -> None:
        if not self.connector.request_finished(seq):
            self.allocator.deallocate(seq)

    def schedule(self):
        batch = super().schedule()
        if self.connector.waiting:
            limit = self.admit_arrivals(self.max_num_batched_tokens - batch.num_tokens, bool(batch.preempted))
            if limit and not self.admission_limit:
                self.admission_limit = limit
        return batch

    def _schedule_waiting(self, batch, budget: int) -> str:
        """The local queue in order; returns what stopped admission ("" if none is left)."""
        waiting, skipped, limit = self.waiting, [], ""
        while waiting:
            if budget <= 0:
                limit = TOKEN_BUDGET
                break
            if self.num_running >= self.max_num_seqs:
                limit = MAX_NUM_SEQS
                break
            seq = waiting[0]
            if seq.request.arrival_time > self.admit_before:
                limit = NEXT_STEP
                break
            got = self._admit_one(seq, budget)
            if isinstance(got, str):
                limit = got
                break
            waiting.popleft()
            if got is None:  # the connector cannot tell yet: skipped this step, as vLLM skips it
                skipped.append(seq)
            elif got >= 0:
                self._enter_running(seq)
                batch.add(seq, got)
                budget -= got
        if skipped:
            waiting.extendleft(reversed(skipped))
        return limit

    def admit_arrivals(self, budget: int, blocked: bool) -> str:
        """Admit the connector's own arrivals in order while the step's `budget` (tokens left) has room,
        fewer than max_num_seqs run and nothing waits before them (`blocked`: the step preempted);
        returns what held the rest back ("" when none is left). Their KV arrives asynchronously."""
        queue = self.connector.waiting
        if not queue:
            return ""
        if blocked or self.waiting or self.swapped:
            return self.admission_limit or KV_CACHE
        while queue:
            if budget <= 0:
                return TOKEN_BUDGET
            if self.num_running >= self.max_num_seqs:
                return MAX_NUM_SEQS
            got = self._admit_one(queue[0], budget)
            if isinstance(got, str) or got is None:
                return got or KV_CACHE
            queue.popleft()
        return ""

    def _admit_one(self, seq: Sequence, budget: int):
        """Allocate the head of a queue if its blocks fit: returns its new tokens this step (-1: its KV
        loads first and the connector holds it), a limit (str) that stops the queue, or None (the
        connector cannot tell yet)."""
        alloc, fresh = self.allocator, seq.num_computed_tokens == 0
        hits = alloc.get_computed_blocks(seq) if fresh else ()
        local = len(hits) * alloc.block_size
        ext, load_async = self.connector.get_num_new_matched_tokens(seq, local) if fresh else (0, False)
        if ext is None:
            return None
        num_new = 0 if load_async else seq.num_tokens - seq.num_computed_tokens - local - ext
        if num_new > budget:
            if not self.enable_chunked_prefill:
                return TOKEN_BUDGET
            num_new = budget
        if not alloc.can_allocate(seq, num_new + ext, hits):
            return KV_CACHE
        owed = self.owed.pop(seq, 0) if not fresh else 0
        if load_async and getattr(self.connector, "reserve_prompt", False):
            # The rest of its prompt must fit after the load, beside what earlier loads still owe: requests
            # holding loaded blocks must not fill the cache so that none can finish (nothing to preempt).
            owed = alloc.blocks_for(seq.num_tokens) - alloc.blocks_for(local + ext)
            if alloc.num_free_blocks - self.owed_blocks < alloc.blocks_for(seq.num_tokens) - len(hits):
                return KV_CACHE
            self.owed[seq] = owed
            owed = -owed
        self.owed_blocks -= owed
        alloc.allocate(seq, num_new + ext, hits)
        if not load_async:
            seq.num_computed_tokens += ext  # loaded within the step
        self.connector.update_state_after_alloc(seq, ext)
        return -1 if load_async else num_new

    def add_ready_all(self, ready: list) -> None:
        """Requests whose KV arrived (in admission order) wait at the head of the queue."""
        for seq in ready:
            seq.status = WAITING
        self.waiting.extendleft(reversed(ready))


_CONNECTED: dict[type, type] = {}


def connected_scheduler(base: type = Scheduler) -> type:
    """`base` (a Scheduler class) with ConnectedScheduling mixed in (one class per base)."""
    cls = _CONNECTED.get(base)
    if cls is None:
        cls = _CONNECTED[base] = type(f"Connected{base.__name__}", (ConnectedScheduling, base), {})
    return cls


def make_connected_replica(index: int, settings, backend, interval: float, connector_factory,
                           allocator=None) -> ConnectedReplica:
    """Replica `index` (kvsim.engine.replica.make_replica) with the KV connector `connector_factory(scheduler)`."""
    rep = make_replica(index, settings, backend, interval, allocator, connected_scheduler, ConnectedReplica)
    rep.scheduler.connect(connector_factory(rep.scheduler))
    rep.connector = rep.scheduler.connector
    return rep


class ConnectedReplica(Replica):
    """A Replica whose engine also waits for its connector's transfers (see the module docstring)."""

    __slots__ = ("connector",)

    def __init__(self, index: int, scheduler, backend, interval: float, async_scheduling: bool = False):
        super().__init__(index, scheduler, backend, interval, async_scheduling)
        self.connector = scheduler.connector  # None until make_connected_replica connects the scheduler

    def begin(self, now: float, next_arrival: float) -> StepRecord:
        connector = self.connector
        ready = connector.get_finished(now)
        if ready:
            self.scheduler.add_ready_all(ready)
        step = super().begin(now, min(next_arrival, connector.next_event))
        if step.num_steps:
            extra = connector.build_connector_meta(step.batch, now, step.end)
            if extra:  # a synchronous connector's load and store time is part of the step
                step.duration += extra
                step.first_s += extra
                step.end += extra
        return step

    def _decode_run(self, batch, now: float, budget_s: float) -> tuple[int, float, float]:
        """A fused run also ends before the connector's next event (a load admitted this step)."""
        return super()._decode_run(batch, now, min(budget_s, self.connector.next_event - now))

    def wait_for(self, batch, now: float, next_arrival: float) -> StepRecord:
        """Nothing can run: the transfers admitted start, and the engine waits for the connector's next
        event (or the next arrival), as one engine event of no steps."""
        self.connector.build_connector_meta(batch, now, now)
        until = min(next_arrival, self.connector.next_event)
        if not now < until < math.inf:
            raise RuntimeError("scheduler made no progress with work queued")
        step = self.record
        step.batch, step.num_steps, step.start, step.duration, step.first_s = batch, 0, now, until - now, until - now
        step.end, step.peak_used = until, -1
        step.admission_limit = self.scheduler.admission_limit
        return step

    def complete(self, step: StepRecord) -> list[Sequence]:
        finished = super().complete(step)
        if not step.num_steps:
            self.busy = False  # no step in flight: the next one admits what arrived meanwhile
        return finished
