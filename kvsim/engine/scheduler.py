"""The engine's scheduler, with vLLM V1 semantics.

Each step has a budget of `max_num_batched_tokens` new tokens. Running sequences go first (decodes
and unfinished prefill chunks, oldest first); if the allocator has no room for one, the newest
running sequence is preempted (recompute: its KV is dropped and it waits again at the front of the
queue; swap: its KV is copied to host memory) until the sequence fits or is itself the victim. Then,
if nothing was preempted, waiting sequences are admitted in arrival order while the budget,
`max_num_seqs` and the allocator allow, taking prefix-cache hits first. With chunked prefill a prompt
may be split over steps to fit the budget; without it a prompt is admitted only whole. Under async
scheduling the replica sets `admit_before`: vLLM's AsyncScheduler plans step n+1 while step n runs, so
a request that arrived after step n started is left for the step after (`holds_next`).

With `use_cohort`, steady decoders are handed to a `DecodeCohort` and advanced together in O(1)
per step. That is exactly V1 whenever every running sequence gets all its tokens and blocks this
step (then V1's order among them does not matter); when the budget or the free blocks are short,
the cohort is dissolved back into the running queue, in V1's order, and the step is scheduled
sequence by sequence, with preemption as above.

The scheduler knows no time: the simulator stamps times, the backend prices the `Batch`.
"""

from __future__ import annotations

import math
from collections import deque
from operator import attrgetter

from kvsim.batch import Batch
from kvsim.engine.cohort import DecodeCohort
from kvsim.engine.records import DecodeRunPlan
from kvsim.engine.settings import EngineSettings
from kvsim.sequence import Sequence, SequenceStatus

RUNNING, WAITING, SWAPPED, FINISHED, REJECTED = (
    SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED,
    SequenceStatus.FINISHED, SequenceStatus.REJECTED)
_run_order = attrgetter("run_order")
_new = tuple.__new__  # builds a named tuple without its Python-level __new__ (once per fused decode run)
# What can hold a waiting sequence back (Scheduler.admission_limit).
KV_CACHE, MAX_NUM_SEQS, TOKEN_BUDGET = "kv_cache", "max_num_seqs", "token_budget"
_NEXT_STEP = "next_step"  # the head of the queue arrived after the previous step started (async scheduling)


class Scheduler:
    """One replica's scheduler over `allocator` (a KVAllocator), with the policy's `settings`."""

    cohort_class = DecodeCohort  # a windowed KV cache has its own (kvsim.engine.windowed)

    def __init__(self, allocator, settings: EngineSettings, *, use_cohort: bool = False, track_longest: bool = True):
        self.allocator = allocator
        # track_longest: the cohort keeps its longest member (Batch.decode_max_context), for step prices that read it
        self.cohort = self.cohort_class(allocator, track_longest) if use_cohort else None
        self.max_num_seqs = settings.max_num_seqs
        self.max_model_len = settings.max_model_len
        self.enable_chunked_prefill = settings.enable_chunked_prefill
        self.max_num_batched_tokens = settings.step_budget  # tokens a step may schedule
        self.preemption_mode = settings.preemption_mode
        self.num_host_blocks = settings.num_host_blocks
        self.num_swapped_blocks = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.num_running = 0  # running sequences, cohort members included
        self.num_unfinished = 0  # sequences added and not yet finished: waiting, running, swapped (or remote: add_remote)
        self._order = 0
        self._cohort_step_blocks = 0
        # Why the last schedule() left sequences waiting: KV_CACHE, MAX_NUM_SEQS or TOKEN_BUDGET
        # ("" when none waits). The metrics add up how long each limit held admission back.
        self.admission_limit = ""
        self.admit_before = math.inf  # async scheduling: only requests that arrived by then may be admitted
        self.holds_next = False  # the last schedule() left an admissible request for the next step

    # ---- admission -----------------------------------------------------------------------
    def reject_reason(self, seq: Sequence) -> str:
        """Why a request can never be served, or '' if it can."""
        req, alloc = seq.request, self.allocator
        total = req.prompt_len + req.output_len
        if total > self.max_model_len:
            return f"prompt + output = {total} tokens exceeds max_model_len {self.max_model_len}"
        need = alloc.peak_blocks(seq)
        if need > alloc.num_blocks:
            return f"needs {need} KV blocks, the cache holds {alloc.num_blocks}"
        return ""

    def add(self, seq: Sequence) -> bool:
        """Queue a new sequence; False (with seq.reject_reason set) if it can never run."""
        reason = self.reject_reason(seq)
        if reason:
            seq.status, seq.reject_reason = REJECTED, reason
            return False
        seq.status = WAITING
        self.waiting.append(seq)
        self.num_unfinished += 1
        return True

    def add_remote(self, seq: Sequence) -> None:
        """A request whose prompt KV another engine computes (disaggregated prefill): unfinished here
        from now on, though only `add_ready` hands it to the queues (kvsim.engine.kv_transfer)."""
        self.num_unfinished += 1

    def add_ready(self, seq: Sequence) -> None:
        """A remote-prefilled sequence whose KV has arrived into the blocks it holds: it waits at the head
        of the queue for its last prompt token, as vLLM keeps requests leaving WAITING_FOR_REMOTE_KVS."""
        seq.status = WAITING
        self.waiting.appendleft(seq)

    @property
    def has_work(self) -> bool:
        return self.num_unfinished > 0

    def free(self, seq: Sequence) -> None:
        """A finished sequence's blocks (kvsim.engine.connector: a KV connector may free them later)."""
        self.allocator.deallocate(seq)

    def _enter_running(self, seq: Sequence) -> None:
        seq.status = RUNNING
        self.num_running += 1
        self._order += 1
        seq.run_order = self._order
        self.running.append(seq)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> Batch:
        batch = Batch()
        budget = self.max_num_batched_tokens
        cohort = self.cohort
        if cohort is not None and cohort.size:
            if self._cohort_fits(budget):
                budget = self._schedule_cohort(batch, budget)
            else:
                self._dissolve_cohort(batch)
                budget = self._schedule_running(batch, budget)
        else:
            budget = self._schedule_running(batch, budget)
        limit = ""
        if not batch.preempted:
            if self.swapped:
                budget = self._schedule_swapped(batch, budget)
            if self.waiting and not self.swapped:
                limit = self._schedule_waiting(batch, budget)
        self.holds_next = limit == _NEXT_STEP
        if self.holds_next:
            limit = ""  # not held back by capacity: the request runs in the next step
        elif self.waiting and not limit:
            limit = KV_CACHE  # a preemption this step, or swapped sequences waiting for blocks
        self.admission_limit = limit
        if self.allocator.num_shared_refs and batch.num_decode_seqs and not batch.num_prefill_seqs:
            batch.decode_shared_tokens = self.allocator.num_shared_refs * self.allocator.block_size
        return batch

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        alloc, running = self.allocator, self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not alloc.can_append(seq, num_new):
                victim = running.pop()  # the newest
                self._preempt(victim, batch)
                if victim is seq:
                    return budget
            alloc.append(seq, num_new)
            batch.add(seq, num_new)
            budget -= num_new
            i += 1
        return budget

    def _cohort_fits(self, budget: int) -> bool:
        """Would every running sequence get all its tokens and blocks this step?"""
        alloc, cohort = self.allocator, self.cohort
        self._cohort_step_blocks = blocks = cohort.blocks_needed(1)
        tokens = cohort.size
        for seq in self.running:
            n = seq.num_tokens - seq.num_computed_tokens
            tokens += n
            blocks += alloc.num_blocks_needed(seq, n)
        return tokens <= budget and blocks <= alloc.num_free_blocks

    def _schedule_cohort(self, batch: Batch, budget: int) -> int:
        """The cohort first (the batch is empty), then the running sequences, whole."""
        alloc = self.allocator
        budget = self._cohort_step(batch, budget, alloc, self.cohort, self.cohort.size)
        for seq in self.running:
            n = seq.num_tokens - seq.num_computed_tokens
            alloc.append(seq, n)
            batch.add(seq, n)
            budget -= n
        return budget

    def _cohort_step(self, batch: Batch, budget: int, alloc, cohort, size: int) -> int:
        """The cohort's part of the step: its blocks (counted by _cohort_fits) and aggregates."""
        if self._cohort_step_blocks:  # counted by _cohort_fits for this very step
            alloc.reserve(self._cohort_step_blocks)
        batch.cohort_step_blocks = self._cohort_step_blocks
        batch.cohort_size = batch.num_decode_seqs = size
        batch.decode_context_tokens = cohort.context + size
        if cohort.offsets is not None:
            batch.decode_max_context = cohort.offsets.top + cohort.clock + 1
        batch.min_output_left = cohort.steps_to_next_finish()
        return budget - size

    def _dissolve_cohort(self, batch: Batch) -> None:
        members = self.cohort.dissolve()
        batch.dissolved = members
        self.running = sorted(self.running + members, key=lambda s: s.run_order)

    def _schedule_swapped(self, batch: Batch, budget: int) -> int:
        alloc = self.allocator
        while self.swapped and budget > 0 and self.num_running < self.max_num_seqs:
            seq = self.swapped[0]
            num_new = seq.num_tokens - seq.num_computed_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget  # a sequence swapped out mid-prompt resumes in chunks
            if not alloc.can_allocate(seq, num_new):
                break
            self.swapped.popleft()
            blocks = alloc.blocks_for(seq.num_computed_tokens)  # the KV that comes back, not the new slots
            alloc.allocate(seq, num_new)
            batch.swap_in_blocks += blocks
            self.num_swapped_blocks -= blocks
            self._enter_running(seq)
            batch.add(seq, num_new)
            budget -= num_new
        return budget

    def _schedule_waiting(self, batch: Batch, budget: int) -> str:
        """Admit waiting sequences in order; returns what stopped admission ("" if none is left)."""
        alloc = self.allocator
        while self.waiting:
            if budget <= 0:
                return TOKEN_BUDGET
            if self.num_running >= self.max_num_seqs:
                return MAX_NUM_SEQS
            seq = self.waiting[0]
            if seq.request.arrival_time > self.admit_before:
                return _NEXT_STEP
            hits = alloc.get_computed_blocks(seq) if seq.num_computed_tokens == 0 else []
            num_new = seq.num_tokens - seq.num_computed_tokens - len(hits) * alloc.block_size
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    return TOKEN_BUDGET
                num_new = budget
            if not alloc.can_allocate(seq, num_new, hits):
                return KV_CACHE
            self.waiting.popleft()
            alloc.allocate(seq, num_new, hits)
            self._enter_running(seq)
            batch.add(seq, num_new)
            budget -= num_new
        return ""

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.num_running -= 1
        batch.preempted = [*batch.preempted, seq]
        blocks = self.allocator.blocks_for(seq.num_computed_tokens)  # the KV written so far, not a whole slab
        if self.preemption_mode == "swap" and self.num_swapped_blocks + blocks <= self.num_host_blocks:
            computed = seq.num_computed_tokens
            self.allocator.deallocate(seq)
            seq.num_computed_tokens = computed  # its KV now lives in host memory
            self.num_swapped_blocks += blocks
            batch.swap_out_blocks += blocks
            seq.status = SWAPPED
            self.swapped.append(seq)
        else:  # recompute (also when host swap space is full)
            self.allocator.deallocate(seq)
            seq.status = WAITING
            self.waiting.appendleft(seq)

    # ---- after the step ------------------------------------------------------------------
    def postprocess(self, batch: Batch, num_steps: int = 1) -> tuple[list[Sequence], list[Sequence]]:
        """Advance the scheduled sequences by the step (or, for a cohort-only batch, a run of
        `num_steps` decode steps).

        Returns (emitted, finished): the explicitly scheduled sequences that produced a token, and
        every sequence that is done (cohort members included); finished sequences' blocks are freed
        in running order (vLLM frees them in schedule order: the running queue's), so the LRU queue
        and later prefix hits are the same whether or not the cohort ran them.
        Cohort members' tokens are counted by `batch.cohort_size`, not listed.
        """
        emitted, finished = [], []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens == seq.num_tokens:
                seq.num_output_tokens += 1
                seq.num_tokens += 1
                emitted.append(seq)
                if seq.num_output_tokens >= seq.request.output_len:
                    seq.status = FINISHED
                    finished.append(seq)
        left_running = bool(finished)  # explicitly scheduled sequences that leave the running list
        cohort = self.cohort
        if cohort is not None:
            if batch.cohort_size:
                cohort.advance(num_steps)
                done = cohort.pop_finished()
                if done:
                    for seq in done:
                        seq.status = FINISHED
                    finished += done
            for seq in emitted:  # the next step of each is a decode: into the cohort
                if seq.status is RUNNING:
                    cohort.join(seq)
                    left_running = True
        if left_running:
            self.running = [s for s in self.running if s.status is RUNNING and s.cohort_clock < 0]
        if finished:
            if len(finished) > 1:  # freed in running order, as vLLM frees them in schedule order
                finished.sort(key=_run_order)
            self.num_running -= len(finished)
            self.num_unfinished -= len(finished)
            free = self.free
            for seq in finished:
                free(seq)
        return emitted, finished

    # ---- runs of identical decode steps ----------------------------------------------------
    def plan_decode_run(self, batch: Batch, max_steps: int) -> DecodeRunPlan:
        """How many identical decode steps (>= 1) the cohort-only `batch` can run before the
        schedule could change, at most `max_steps`, and the blocks its steps after the first need
        (`commit_decode_run` reserves them; schedule() reserved the first step's).

        The schedule changes when a sequence finishes or when the blocks would run out (a
        preemption); arrivals are the caller's bound. Nothing else can change it: the waiting
        queue stays blocked while no sequence finishes.
        """
        cohort = self.cohort
        if cohort is None or batch.seqs or not batch.cohort_size:
            return DecodeRunPlan(1, 0)
        k = min(max_steps, batch.min_output_left)
        if k > 1:
            first = batch.cohort_step_blocks  # reserved by schedule()
            k, need = cohort.affordable_steps(k, self.allocator.num_free_blocks + first)
            if k > 1:
                return _new(DecodeRunPlan, (k, need - first))
        return DecodeRunPlan(1, 0)

    def commit_decode_run(self, plan: DecodeRunPlan) -> None:
        """The run goes ahead: its later steps' blocks are taken now (postprocess advances the cohort)."""
        if plan.reserve_blocks:
            self.allocator.reserve(plan.reserve_blocks)
