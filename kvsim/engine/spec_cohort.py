"""The decode cohort under speculative decoding: steady decoders advanced together, their futures drawn once.

With speculation a member gains 1 + a tokens a step, a random in [0, k] (kvsim.engine.speculative), so
members no longer move in lockstep and the O(1) counting of `DecodeCohort` does not apply. But a
member's acceptance is a function of its output positions only, so the moment it joins, its whole
future in the cohort is known: the positions its steps start at (a walk p -> p + 1 + a(p)), the drafts
each step verifies, the tokens it gains, the keys it reads, the blocks vLLM's allocate_slots gives it
(context + 1 + drafts + lookahead slots, never fewer than it holds) and the step it finishes at.
Those are computed at once with numpy (`trajectory`) and added into per-step sums over the cohort's
clock (`Timeline`); a member that leaves early (the scheduler dissolves the cohort) takes its remaining
steps back out. A step's figures, and a run's (`SpecRunShape`: rows, keys, the drafter's base), are then
slices of those sums: O(1) numpy calls a step or run, O(its steps) per member once.
Blocks stay exact: each step reserves the blocks the sums say the members take, and a member leaving
claims the blocks it holds (its slots, lookahead included).
"""

from __future__ import annotations

import heapq

import numpy as np

from kvsim.engine.cohort import FinishHeap
from kvsim.perf.speculative import SpecRunShape
from kvsim.sequence import Sequence

_FIELDS = 4  # a step's figures: drafts, keys read, tokens gained, blocks taken
DRAFTS, READS, GAINED, BLOCKS = range(_FIELDS)


class Timeline:
    """Per-step sums over the cohort's clock and their prefix sums, in one array `table` (so that adding
    a member is two numpy calls): row r < _FIELDS, column 1 + t - base, is row r's sum over the step t;
    row _FIELDS + r, column c, the sum of row r over the steps base .. base + c - 1 (column 0: none).
    A run's totals and a search over its steps are then a few lookups. The array grows as members'
    futures reach further and drops the steps that passed."""

    __slots__ = ("base", "table")

    def __init__(self, width: int = 256):
        self.base = 0
        self.table = np.zeros((2 * _FIELDS, width + 1), dtype=np.int64)

    def add(self, start: int, future: np.ndarray) -> None:
        """Add a member's steps from `start` on (`future`: a column a step, its _FIELDS rows over their
        running sums)."""
        lo = 1 + start - self.base
        hi = lo + future.shape[1]
        if hi > self.table.shape[1]:
            self._grow(hi)
        self.table[:, lo:hi] += future
        self.table[_FIELDS:, hi:] += future[_FIELDS:, -1:]

    def remove(self, start: int, future: np.ndarray) -> None:
        """Take back steps added by `add` (`future`: those of its columns from `start` on, their sums
        still counted from its first)."""
        lo = 1 + start - self.base
        hi = lo + future.shape[1]
        future = future.copy()
        future[_FIELDS:] -= self.before(future)
        self.table[:, lo:hi] -= future
        self.table[_FIELDS:, hi:] -= future[_FIELDS:, -1:]

    @staticmethod
    def before(future: np.ndarray) -> np.ndarray:
        """The running sums before future's first column (as a column)."""
        return future[_FIELDS:, :1] - future[:_FIELDS, :1]

    def _grow(self, hi: int) -> None:
        width = self.table.shape[1]
        grow = max(hi, 2 * width) - width
        more = np.zeros((2 * _FIELDS, grow), dtype=np.int64)
        more[_FIELDS:] = self.table[_FIELDS:, -1:]
        self.table = np.concatenate([self.table, more], axis=1)

    def at(self, row: int, clock: int) -> int:
        return int(self.table[row, 1 + clock - self.base])

    def total(self, row: int, clock: int, steps: int) -> int:
        """The sum of `row` over the steps clock .. clock + steps - 1."""
        lo = clock - self.base
        p = self.table[_FIELDS + row]
        return int(p[lo + steps] - p[lo])

    def window(self, row: int, clock: int, steps: int) -> np.ndarray:
        lo = 1 + clock - self.base
        return self.table[row, lo:lo + steps]

    def prefix_from(self, row: int, clock: int, steps: int) -> np.ndarray:
        """prefix sums of `row` from `clock`: entry i is the sum over base .. clock + i - 1 (i <= steps),
        so that entry i less entry 0 is the sum over clock .. clock + i - 1."""
        lo = clock - self.base
        return self.table[_FIELDS + row, lo:lo + steps + 1]

    def moments(self, clock: int, steps: int) -> tuple[int, int, int]:
        """(sum of c_j, of j c_j, of j j c_j) over j = 1..steps, c_j the blocks of step clock + j - 1."""
        c = self.window(BLOCKS, clock, steps)
        if len(c) <= 64:  # a run's usual length: Python's ints beat numpy's calls
            s0 = s1 = s2 = 0
            for j, n in enumerate(c.tolist(), 1):
                if n:
                    s0, s1, s2 = s0 + n, s1 + j * n, s2 + j * j * n
            return s0, s1, s2
        j = np.arange(1, len(c) + 1, dtype=np.int64)
        jc = j * c
        return int(c.sum()), int(jc.sum()), int(np.dot(jc, j))

    def drop_before(self, clock: int) -> None:
        """Forget the steps before `clock` once they are half the array (amortised O(1) a step)."""
        lo = clock - self.base
        width = self.table.shape[1]
        if lo > width // 2:
            table = np.zeros_like(self.table)
            table[:_FIELDS, 1:width - lo] = self.table[:_FIELDS, 1 + lo:]
            table[:_FIELDS, 1:].cumsum(axis=1, out=table[_FIELDS:, 1:])
            self.table, self.base = table, clock


class SpecCohort(FinishHeap):
    """The decode cohort of a SpecScheduler (module docstring)."""

    groups = 1
    releases_cached = 0
    offsets = None  # the longest member is not tracked (speculative steps are priced at the mean context)
    grows = True

    def __init__(self, allocator, speculator, counters, max_model_len: int):
        self.allocator, self.speculator, self.counters = allocator, speculator, counters
        self.block_size = allocator.block_size
        self.max_model_len = max_model_len
        self.clock = 0
        self.size = 0
        self.timeline = Timeline()
        self._members: dict[Sequence, tuple] = {}  # seq -> (clock at joining, its future, accepted, held blocks)
        self._finish: list[tuple[int, int, Sequence]] = []
        self._serial = 0

    # ---- a member's future -------------------------------------------------------------------------
    def trajectory(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """(rows of the Timeline over its steps, accepted drafts per step, blocks held after each step's
        allocation, whether every step verifies k drafts) from its state now (its next step a decode)."""
        req, spec, mml = seq.request, self.speculator, self.max_model_len
        o0, out, prompt, k = seq.num_output_tokens, req.output_len, req.prompt_len, spec.k
        accepted, proposes = spec.draws(req.request_id, o0, out)
        drafts = self._drafts(proposes, prompt, o0, out) if proposes is not None or prompt + out + k + 1 > mml else None
        if drafts is not None:
            accepted = np.minimum(accepted, drafts)
        nxt = accepted.tolist()
        walk, p, n = [], 0, len(nxt)
        while p < n:  # the positions its steps start at: each moves on by 1 + the drafts it accepted
            walk.append(p)
            p += 1 + nxt[p]
        at = np.array(walk)
        a = accepted[at]
        future = np.empty((2 * _FIELDS, len(walk)), dtype=np.int64)
        if drafts is None:
            future[DRAFTS] = k
            np.add(at, prompt + o0 + k, out=future[READS])  # context (num_tokens - 1) and the step's 1 + d rows
        else:
            drafts.take(at, out=future[DRAFTS])
            np.add(at, prompt + o0, out=future[READS])
            future[READS] += future[DRAFTS]
        np.add(a, 1, out=future[GAINED])
        future[GAINED, -1] = min(nxt[walk[-1]] + 1, out - o0 - walk[-1])
        held = self._held(seq, future[READS] + spec.lookahead, drafts is not None, future[BLOCKS])
        future[:_FIELDS].cumsum(axis=1, out=future[_FIELDS:])  # methods: numpy's wrappers cost a us
        return future, a, held, drafts is None

    def _drafts(self, proposes, prompt: int, o0: int, out: int) -> np.ndarray:
        """Drafts per output position when they vary: none where an n-gram lookup misses, fewer near
        max_model_len (a step's positions stay below it)."""
        k, mml = self.speculator.k, self.max_model_len
        drafts = np.full(out - o0, k) if proposes is None else np.where(proposes, k, 0)
        if prompt + out + k + 1 > mml:
            drafts = np.minimum(drafts, np.maximum(0, mml - prompt - o0 - 1 - np.arange(out - o0)))
        return drafts

    def _held(self, seq: Sequence, slots: np.ndarray, varies: bool, taken: np.ndarray) -> np.ndarray:
        """Blocks held after each step's allocation (writing the blocks each step takes into `taken`)."""
        bs, mml = self.block_size, self.max_model_len
        if varies or slots[-1] > mml:
            np.minimum(slots, mml, out=slots)
        slots += bs - 1
        held = np.floor_divide(slots, bs, out=slots)
        h0 = len(seq.block_table)
        if varies:  # rows vary: never fewer blocks than already held
            np.maximum.accumulate(held, out=held)
        if held[0] < h0:
            np.maximum(held, h0, out=held)
        taken[0] = held[0] - h0
        np.subtract(held[1:], held[:-1], out=taken[1:])
        return held

    # ---- membership ----------------------------------------------------------------------------
    def join(self, seq: Sequence) -> None:
        future, accepted, held, uniform = self.trajectory(seq)
        self._serial += 1
        seq.cohort_clock = self.clock
        self._members[seq] = (self.clock, future, accepted, held, uniform)
        self.timeline.add(self.clock, future)
        heapq.heappush(self._finish, (self.clock + future.shape[1], self._serial, seq))
        self.size += 1

    def _leave(self, seq: Sequence) -> None:
        """Bring the member up to date (tokens, blocks claimed) and take its remaining steps back out."""
        start, future, accepted, held, uniform = self._members.pop(seq)
        done = self.clock - start
        if done < future.shape[1]:
            self.timeline.remove(self.clock, future[:, done:])
        gained = int(future[_FIELDS + GAINED, done - 1]) if done else 0
        seq.num_computed_tokens += gained
        seq.num_output_tokens += gained
        seq.num_tokens += gained
        seq.cohort_clock = -1
        self.size -= 1
        self.counters.add_many(None if uniform else future[DRAFTS, :done], accepted[:done])
        if done:
            self.allocator.claim(seq, int(held[done - 1]) * self.block_size)

    def dissolve(self) -> list[Sequence]:
        members = [seq for _, _, seq in sorted(self._finish, key=lambda entry: entry[1])]
        self._finish.clear()
        for seq in members:
            self._leave(seq)
        return members

    def longest(self) -> int:
        return 0

    # ---- a step's and a run's figures ------------------------------------------------------------
    def step_drafts(self) -> int:
        return self.timeline.at(DRAFTS, self.clock)

    def step_rows(self) -> int:
        return self.size + self.step_drafts()

    def step_reads(self) -> int:
        return self.timeline.at(READS, self.clock)

    def run_shape(self, steps: int, shared_tokens: int = 0) -> SpecRunShape:
        """The next `steps` steps (at most until the next finish) as the pricer reads them; blocks that
        members share are read once (kvsim.batch.Batch.decode_read_tokens)."""
        tl, clock = self.timeline, self.clock
        steps = min(steps, self.steps_to_next_finish())
        full = tl.total(DRAFTS, clock, steps) == self.size * self.speculator.k * steps  # every member k drafts a step
        return SpecRunShape(self.size, tl.window(DRAFTS, clock, steps), tl.window(READS, clock, steps),
                            tl.prefix_from(READS, clock, steps), shared_tokens, self.speculator.k if full else -1)

    def gained_within(self, steps: int) -> int:
        """Tokens the members gain in the next `steps` steps."""
        return self.timeline.total(GAINED, self.clock, steps)

    # ---- blocks ----------------------------------------------------------------------------------
    def blocks_needed(self, steps: int) -> int:
        return self.timeline.total(BLOCKS, self.clock, steps) if steps > 0 else 0

    def affordable_steps(self, want: int, free_blocks: int) -> tuple[int, int]:
        prefix = self.timeline.prefix_from(BLOCKS, self.clock, want)
        k = int(prefix[1:].searchsorted(prefix[0] + free_blocks, side="right"))
        return (k, int(prefix[k] - prefix[0])) if k else (0, 0)

    def crossing_moments(self, steps: int) -> tuple[int, int, int]:
        """(sum of c_j, of j * c_j, of j * j * c_j) over the next steps j = 1..`steps` (the current one
        first), c_j the blocks step j takes (DecodeCohort.crossing_moments)."""
        return self.timeline.moments(self.clock, steps)

    def taken_times(self, steps: int, ends: list) -> float:
        """DecodeCohort.taken_times, over the Timeline's blocks at once."""
        blocks = self.timeline.window(BLOCKS, self.clock, steps)
        return float(np.dot(blocks, np.asarray(ends, dtype=np.float64)))

    def released_after(self, step: int) -> int:
        return 0

    net_blocks = blocks_needed

    def peak_net(self, steps: int) -> int:
        return self.blocks_needed(steps)

    def written_after(self, steps: int) -> int:
        """Tokens the members write in the next `steps` steps (their computed tokens' growth)."""
        return self.gained_within(steps)

    def advance(self, steps: int) -> None:
        self.allocator.note_written(self.gained_within(steps))
        self.clock += steps
        self.timeline.drop_before(self.clock)
