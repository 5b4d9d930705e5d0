"""Speculative decoding in the scheduler, as vLLM V1 schedules it (kvsim.perf.speculative names the release).

A decoding sequence's step verifies the drafts proposed for it after its last step: it schedules
1 + d tokens (d = k drafts; an n-gram lookup proposes none when it finds no match; fewer when the
token budget or max_model_len - 1 would be passed), its slots are allocated for them and for
`num_lookahead_tokens` more (`KVCacheManager.allocate_slots`), and after the step `num_computed_tokens`
is rolled back past the rejected drafts: the sequence keeps its blocks (they are written over later),
gains 1 + a tokens (a accepted drafts and the bonus or corrected token) and streams them as one chunk.
Prompt chunks are allocated with the lookahead too, as vLLM's running loop does; a new request's first
allocation is not (its num_computed_tokens is 0).

Acceptance is random but a function of (seed, request, output position) only (`Speculator`): a
counter-based draw (splitmix64), the same whether a step is scheduled on its own, by the decode cohort,
or in a fused run (kvsim.engine.spec_cohort), so results do not depend on fusion. Draft i is accepted
at a position when its uniform draw u < p_i (p_i the unconditional per-position rate, non-increasing:
the accepted drafts are a prefix); an n-gram step proposes when a second draw is below the proposal rate.

`SpecScheduler` is the Scheduler with these rules and a `SpecCohort`; `SpecCounters` are the figures
vLLM's spec-decode metrics report (drafts, draft tokens, accepted tokens, per position).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvsim.batch import Batch
from kvsim.engine.scheduler import FINISHED, RUNNING, Scheduler, _run_order
from kvsim.sequence import Sequence

MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_UNIT = 2.0 ** -53


def _mix(x: int) -> int:
    """splitmix64's finalizer on a Python int (kvsim.sequence.mix64's, to the bit)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix_array(x: np.ndarray) -> np.ndarray:
    """kvsim.sequence.mix64 in place on a fresh array (uint64 arithmetic wraps silently on arrays)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


class Speculator:
    """The draws of one policy's speculative decoding (`plan`: kvsim.perf.speculative.SpecPlan)."""

    def __init__(self, plan, max_model_len: int):
        self.k, self.lookahead, self.max_model_len = plan.k, plan.lookahead, max_model_len
        self.rate_list = list(plan.rates)
        # u = (x >> 11) 2^-53 < p  <=>  x < ceil(p 2^53) 2^11 for the 64-bit draw x: thresholds on x, ascending,
        # for searchsorted (rates of 1, always accepted, counted apart: their threshold would be 2^64)
        self.sure = sum(1 for p in self.rate_list if p >= 1.0)
        self.thresholds = np.array(sorted(math.ceil(p * 2.0 ** 53) << 11 for p in self.rate_list if p < 1.0),
                                   dtype=np.uint64)
        self.proposal_rate = plan.proposal_rate
        self.propose_below = np.uint64(math.ceil(self.proposal_rate * 2.0 ** 53) << 11 if self.proposal_rate < 1.0 else 0)
        self.seed = _mix((plan.seed * _GOLDEN + 1) & MASK)
        self.strides = np.zeros(0, dtype=np.uint64)

    def _key(self, request_id: int) -> int:
        return _mix((self.seed + (request_id + 1) * _GOLDEN) & MASK)

    def accepted_at(self, request_id: int, position: int) -> int:
        """Drafts accepted (of k) for the step at output position `position`."""
        u = (_mix((self._key(request_id) + 2 * position * _GOLDEN) & MASK) >> 11) * _UNIT
        a = 0
        for p in self.rate_list:
            if u >= p:
                break
            a += 1
        return a

    def proposes_at(self, request_id: int, position: int) -> bool:
        if self.proposal_rate >= 1.0:
            return True
        u = (_mix((self._key(request_id) + (2 * position + 1) * _GOLDEN) & MASK) >> 11) * _UNIT
        return u < self.proposal_rate

    def draws(self, request_id: int, first: int, last: int) -> tuple[np.ndarray, np.ndarray | None]:
        """accepted_at and proposes_at for the positions first..last - 1 at once (numpy, the same bits;
        proposes None: every step proposes)."""
        key = self._key(request_id)
        if last > len(self.strides):  # positions x 2 x golden, computed once for every request
            self.strides = np.arange(0, 2 * max(last, 2 * len(self.strides)), 2, dtype=np.uint64) * np.uint64(_GOLDEN)
        steps = self.strides[first:last]
        x = _mix_array(steps + np.uint64(key))
        # the first `accepted` rates exceed u (they do not rise): a count of the thresholds above x
        accepted = (len(self.thresholds) + self.sure) - self.thresholds.searchsorted(x, side="right")
        if self.proposal_rate >= 1.0:
            return accepted, None
        return accepted, _mix_array(steps + np.uint64((key + _GOLDEN) & MASK)) < self.propose_below

    def drafts(self, seq: Sequence) -> int:
        """Drafts proposed for the sequence's next step (before the budget's cut): k, none when an n-gram
        lookup misses, fewer near max_model_len (a step's last position stays below it)."""
        d = self.k if self.proposes_at(seq.request.request_id, seq.num_output_tokens) else 0
        return min(d, max(0, self.max_model_len - seq.num_tokens - 1))


@dataclass(slots=True)
class SpecCounters:
    """vLLM's spec-decode figures (vllm/v1/spec_decode/metrics.py): steps that proposed drafts, draft
    tokens verified, and the proposing steps by how many drafts they accepted (`hist[a]`), from which
    the accepted tokens and the acceptance per position follow."""

    k: int
    num_draft_tokens: int = 0
    num_steps: int = 0  # decoding sequence-steps, proposing or not (an n-gram miss verifies one token)
    hist: np.ndarray = field(default=None)

    def __post_init__(self):
        self.hist = np.zeros(self.k + 1, dtype=np.int64)

    def add(self, drafts: int, accepted: int) -> None:
        self.num_steps += 1
        if drafts:
            self.num_draft_tokens += drafts
            self.hist[accepted] += 1

    def add_many(self, drafts: np.ndarray | None, accepted: np.ndarray) -> None:
        """Steps verifying drafts[i] drafts (None: k each) that accepted accepted[i]."""
        if len(accepted):
            self.num_steps += len(accepted)
            if drafts is None:
                self.num_draft_tokens += self.k * len(accepted)
                self.hist += np.bincount(accepted, minlength=self.k + 1)
                return
            proposing = drafts > 0
            self.num_draft_tokens += int(drafts.sum())
            self.hist += np.bincount(accepted[proposing], minlength=self.k + 1)

    @property
    def num_drafts(self) -> int:
        return int(self.hist.sum())

    @property
    def accepted_per_pos(self) -> list[int]:
        """Proposing steps that accepted at least i drafts, i = 1..k."""
        return np.cumsum(self.hist[::-1])[::-1][1:].tolist()

    @property
    def num_accepted_tokens(self) -> int:
        return int(np.dot(self.hist, np.arange(self.k + 1)))

    def merge(self, other: "SpecCounters") -> None:
        self.num_draft_tokens += other.num_draft_tokens
        self.num_steps += other.num_steps
        self.hist += other.hist


class SpecScheduler(Scheduler):
    """Scheduler with speculative decoding (module docstring). `speculator`: a Speculator."""

    def __init__(self, allocator, settings, *, use_cohort: bool = False, track_longest: bool = True):
        from kvsim.engine.spec_cohort import SpecCohort

        self.speculator = Speculator(settings.speculation, settings.max_model_len)
        self.counters = SpecCounters(settings.speculation.k)
        self.cohort_class = lambda alloc, _track: SpecCohort(alloc, self.speculator, self.counters,
                                                             settings.max_model_len)
        super().__init__(allocator, settings, use_cohort=use_cohort, track_longest=False)
        self.admitted: set = set()  # sequences whose allocation this step was a first one (no lookahead)

    def _enter_running(self, seq: Sequence) -> None:
        """Admitted from the waiting (or swapped) queue: vLLM allocates a request whose num_computed_tokens
        is 0 without lookahead slots."""
        self.admitted.add(seq)
        super()._enter_running(seq)

    def slots(self, seq: Sequence, num_new: int) -> int:
        """Slots the step allocates: the new tokens and the lookahead, within max_model_len."""
        return max(num_new, min(num_new + self.speculator.lookahead, self.max_model_len - seq.num_computed_tokens))

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        alloc, running = self.allocator, self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            decoding = seq.num_output_tokens and seq.num_computed_tokens == seq.num_tokens - 1
            drafts = min(self.speculator.drafts(seq), budget - 1) if decoding else 0
            num_new = 1 + drafts if decoding else min(seq.num_tokens - seq.num_computed_tokens, budget)
            slots = self.slots(seq, num_new)
            while not alloc.can_append(seq, slots):
                victim = running.pop()  # the newest
                self._preempt(victim, batch)
                if victim is seq:
                    return budget
            alloc.append(seq, slots)
            batch.add_decode(seq, drafts) if decoding else batch.add(seq, num_new)
            budget -= num_new
            i += 1
        return budget

    def _cohort_fits(self, budget: int) -> bool:
        alloc, cohort = self.allocator, self.cohort
        self._cohort_step_blocks = blocks = cohort.blocks_needed(1)
        tokens = cohort.step_rows()
        for seq in self.running:
            n = seq.num_tokens - seq.num_computed_tokens
            tokens += n
            blocks += alloc.num_blocks_needed(seq, self.slots(seq, n))
        return tokens <= budget and blocks <= alloc.num_free_blocks

    def _schedule_cohort(self, batch: Batch, budget: int) -> int:
        alloc, cohort = self.allocator, self.cohort
        budget = self._cohort_step(batch, budget, alloc, cohort, cohort.size)
        for seq in self.running:  # prompt chunks, whole
            n = seq.num_tokens - seq.num_computed_tokens
            alloc.append(seq, self.slots(seq, n))
            batch.add(seq, n)
            budget -= n
        return budget

    def _cohort_step(self, batch: Batch, budget: int, alloc, cohort, size: int) -> int:
        if self._cohort_step_blocks:
            alloc.reserve(self._cohort_step_blocks)
        batch.cohort_step_blocks = self._cohort_step_blocks
        batch.cohort_size = batch.num_decode_seqs = size
        batch.num_spec_tokens = drafts = cohort.step_drafts()
        batch.decode_context_tokens = cohort.step_reads()
        batch.min_output_left = cohort.steps_to_next_finish()
        return budget - size - drafts

    def schedule(self) -> Batch:
        batch = super().schedule()
        if batch.cohort_size and not batch.seqs and not batch.preempted:  # the cohort alone: a run's figures
            batch.run_shape = self.cohort.run_shape(batch.min_output_left, batch.decode_shared_tokens)
        return batch

    # ---- after the step ------------------------------------------------------------------
    def postprocess(self, batch: Batch, num_steps: int = 1) -> tuple[list[Sequence], list[Sequence]]:
        """Scheduler.postprocess with each verify step's accepted drafts: the sequence gains 1 + a tokens
        (at most what it has left), its computed tokens roll back past the rejected drafts, and the
        slots it holds beyond its tokens are counted unwritten again."""
        emitted, finished = [], []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            self._advance(seq, num_new, emitted, finished)
        self.admitted.clear()
        left_running = bool(finished)
        cohort = self.cohort
        if cohort is not None:
            if batch.cohort_size:
                cohort.advance(num_steps)
                done = cohort.pop_finished()
                for seq in done:
                    seq.status = FINISHED
                finished += done
            for seq in emitted:  # the next step of each is a decode: into the cohort
                if seq.status is RUNNING:
                    cohort.join(seq)
                    left_running = True
        if left_running:
            self.running = [s for s in self.running if s.status is RUNNING and s.cohort_clock < 0]
        self._free(finished)
        return emitted, finished

    def _advance(self, seq: Sequence, num_new: int, emitted: list, finished: list) -> None:
        ctx = seq.num_computed_tokens
        slots = num_new if seq in self.admitted else self.slots(seq, num_new)
        drafts = ctx + num_new - seq.num_tokens  # > 0: a verify step's drafts
        if drafts < 0:  # a prompt chunk short of the last prompt token
            seq.num_computed_tokens = ctx + num_new
            self.allocator.note_written(num_new - slots)
            return
        accepted = min(self.speculator.accepted_at(seq.request.request_id, seq.num_output_tokens), drafts)
        self.counters.add(drafts, accepted)
        gained = min(1 + accepted, seq.request.output_len - seq.num_output_tokens)
        seq.num_computed_tokens = seq.num_tokens - 1 + gained
        seq.num_output_tokens += gained
        seq.num_tokens += gained
        self.allocator.note_written(seq.num_computed_tokens - ctx - slots)  # slots held past its tokens
        emitted.append(seq)
        if seq.num_output_tokens >= seq.request.output_len:
            seq.status = FINISHED
            finished.append(seq)

    def _free(self, finished: list) -> None:
        if finished:
            if len(finished) > 1:  # freed in running order, as vLLM frees them in schedule order
                finished.sort(key=_run_order)
            self.num_running -= len(finished)
            self.num_unfinished -= len(finished)
            for seq in finished:
                self.allocator.deallocate(seq)
