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

from kvsim.perf.speculative import SpecRunShape
from kvsim.sequence import Sequence

_FIELDS = 4  # a step's figures: drafts, keys read, tokens gained, blocks taken
DRAFTS, READS, GAINED, BLOCKS = range(_FIELDS)
_SUMS = 6  # prefix sums of drafts, keys, tokens gained, blocks, and blocks weighted by t and t * t


class Timeline:
    """Per-step sums over the cohort's clock (`data`: _FIELDS rows, column t - base), and their prefix
    sums (`prefix`, column t - base: the sum of the steps before t), so that a run's totals and a
    search over its steps are a few lookups. The arrays grow as members' futures reach further and drop
    the steps that passed."""

    __slots__ = ("base", "data", "prefix")

    def __init__(self, width: int = 256):
        self.base = 0
        self.data = np.zeros((_FIELDS, width), dtype=np.int64)
        self.prefix = np.zeros((_SUMS, width + 1), dtype=np.int64)

    def _sums(self, values: np.ndarray, lo: int) -> np.ndarray:
        t = np.arange(lo, lo + values.shape[1], dtype=np.int64)
        weighted = t * values[BLOCKS]
        return np.cumsum(np.vstack([values, weighted, t * weighted]), axis=1)

    def add(self, start: int, values: np.ndarray, sign: int = 1) -> None:
        lo = start - self.base
        hi = lo + values.shape[1]
        width = self.data.shape[1]
        if hi > width:
            grow = max(hi, 2 * width) - width
            self.data = np.concatenate([self.data, np.zeros((_FIELDS, grow), dtype=np.int64)], axis=1)
            self.prefix = np.concatenate([self.prefix, np.repeat(self.prefix[:, -1:], grow, axis=1)], axis=1)
        sums = self._sums(values, lo)
        if sign < 0:
            values, sums = -values, -sums
        self.data[:, lo:hi] += values
        self.prefix[:, lo + 1:hi + 1] += sums
        self.prefix[:, hi + 1:] += sums[:, -1:]

    def at(self, row: int, clock: int) -> int:
        return int(self.data[row, clock - self.base])

    def total(self, row: int, clock: int, steps: int) -> int:
        """The sum of `row` over the steps clock .. clock + steps - 1."""
        lo = clock - self.base
        p = self.prefix[row]
        return int(p[lo + steps] - p[lo])

    def window(self, row: int, clock: int, steps: int) -> np.ndarray:
        lo = clock - self.base
        return self.data[row, lo:lo + steps]

    def prefix_from(self, row: int, clock: int, steps: int) -> np.ndarray:
        """prefix sums of `row` from `clock`: entry i is the sum over clock .. clock + i - 1 (i <= steps),
        as a view less its first (so entry 0 is 0 once the first is subtracted)."""
        lo = clock - self.base
        return self.prefix[row, lo:lo + steps + 1]

    def moments(self, clock: int, steps: int) -> tuple[int, int, int]:
        """(sum of c_j, of j c_j, of j j c_j) over j = 1..steps, c_j the blocks of step clock + j - 1."""
        lo = clock - self.base
        p = self.prefix
        s0 = int(p[3, lo + steps] - p[3, lo])
        s1 = int(p[4, lo + steps] - p[4, lo])
        s2 = int(p[5, lo + steps] - p[5, lo])
        shift = lo - 1  # j = t - shift for column t
        return s0, s1 - shift * s0, s2 - 2 * shift * s1 + shift * shift * s0

    def drop_before(self, clock: int) -> None:
        """Forget the steps before `clock` once they are half the array (amortised O(1) a step)."""
        lo = clock - self.base
        if lo > self.data.shape[1] // 2:
            data = np.zeros_like(self.data)
            data[:, :self.data.shape[1] - lo] = self.data[:, lo:]
            self.data, self.base = data, clock
            self.prefix = np.zeros_like(self.prefix)
            self.prefix[:, 1:] = self._sums(data, 0)


class SpecCohort:
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
    def trajectory(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows of the Timeline over its steps, accepted drafts per step, blocks held after each step's
        allocation) from its state now (its next step a decode)."""
        req, spec, mml = seq.request, self.speculator, self.max_model_len
        o0, out, prompt, k = seq.num_output_tokens, req.output_len, req.prompt_len, spec.k
        accepted, proposes = spec.draws(req.request_id, o0, out)
        capped = prompt + out + k + 1 > mml  # drafts cut near max_model_len (a step's positions stay below it)
        drafts = None
        if proposes is not None or capped:
            drafts = np.full(out - o0, k) if proposes is None else np.where(proposes, k, 0)
            if capped:
                drafts = np.minimum(drafts, np.maximum(0, mml - prompt - o0 - 1 - np.arange(out - o0)))
            accepted = np.minimum(accepted, drafts)
        nxt = accepted.tolist()
        walk, p, n = [], 0, len(nxt)
        while p < n:  # the positions its steps start at: each moves on by 1 + the drafts it accepted
            walk.append(p)
            p += 1 + nxt[p]
        at = np.asarray(walk)
        a = accepted[at]
        future = np.empty((4, len(at)), dtype=np.int64)
        future[DRAFTS] = k if drafts is None else drafts[at]
        future[READS] = at + (prompt + o0) + future[DRAFTS]  # context (num_tokens - 1) and the step's 1 + d rows
        future[GAINED] = 1 + a
        future[GAINED, -1] = min(future[GAINED, -1], out - o0 - walk[-1])
        slots = future[READS] + spec.lookahead
        if slots[-1] > mml or drafts is not None:
            slots = np.minimum(slots, mml)
        h0 = len(seq.block_table)
        held = np.maximum(-(-slots // self.block_size), h0)
        if drafts is not None:  # rows vary: never fewer blocks than already held
            held = np.maximum.accumulate(held)
        future[BLOCKS, 0] = held[0] - h0
        future[BLOCKS, 1:] = held[1:] - held[:-1]
        return future, a, held

    # ---- membership ----------------------------------------------------------------------------
    def join(self, seq: Sequence) -> None:
        future, accepted, held = self.trajectory(seq)
        self._serial += 1
        seq.cohort_clock = self.clock
        self._members[seq] = (self.clock, future, accepted, held)
        self.timeline.add(self.clock, future)
        heapq.heappush(self._finish, (self.clock + future.shape[1], self._serial, seq))
        self.size += 1

    def _leave(self, seq: Sequence) -> None:
        """Bring the member up to date (tokens, blocks claimed) and take its remaining steps back out."""
        start, future, accepted, held = self._members.pop(seq)
        done = self.clock - start
        if done < future.shape[1]:
            self.timeline.add(self.clock, future[:, done:], -1)
        gained = int(future[GAINED, :done].sum())
        seq.num_computed_tokens += gained
        seq.num_output_tokens += gained
        seq.num_tokens += gained
        seq.cohort_clock = -1
        self.size -= 1
        self.counters.add_many(future[DRAFTS, :done], accepted[:done])
        if done:
            self.allocator.claim(seq, int(held[done - 1]) * self.block_size)

    def dissolve(self) -> list[Sequence]:
        members = [seq for _, _, seq in sorted(self._finish, key=lambda entry: entry[1])]
        self._finish.clear()
        for seq in members:
            self._leave(seq)
        return members

    def pop_finished(self) -> list[Sequence]:
        heap = self._finish
        if not heap or heap[0][0] > self.clock:
            return []
        done = []
        while heap and heap[0][0] <= self.clock:
            seq = heapq.heappop(heap)[2]
            self._leave(seq)
            done.append(seq)
        return done

    def steps_to_next_finish(self) -> int:
        return self._finish[0][0] - self.clock if self._finish else 1 << 62

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
        k = int(np.searchsorted(prefix[1:], prefix[0] + free_blocks, side="right"))
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
