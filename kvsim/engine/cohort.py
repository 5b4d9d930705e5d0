"""The decode cohort: running sequences in steady decode, advanced together in O(1) per step.

Between a request's first token and its last, every engine step gives it one more token. Touching
every such sequence at every step makes a simulation cost O(batch) per step; instead the scheduler
hands steady decoders to this cohort, which keeps their sums (count, context tokens) and a clock of
decode steps. A member's counters are brought up to date only when it leaves: when it finishes
(a heap ordered by the clock at which it will), or when the scheduler needs every sequence
explicitly (memory is tight, a preemption may follow; see Scheduler). The longest member's context,
which the decode kernel's slowest program walks, is the clock plus the largest of the members'
offsets (context less the clock at joining), kept in a `LongestOffset` when the step price reads it.

Blocks are still exact: a member that has written `v` tokens holds ceil(v / block_size) blocks, so
advancing the clock by k needs, for each member, the block boundaries its token count crosses. A
member crosses into a new block at the steps whose clock value is congruent to its *phase*
((clock - v) mod block_size at any moment), so members are counted by phase (`crossings`), and the
blocks a run of steps takes, and their moments in the step index, are sums over a window of that
count: O(block_size), with no per-member work. The blocks are reserved from the allocator (taken off
its free queue in LRU order, evicting as it would) at once, and handed to each member's block table
when it leaves.
"""

from __future__ import annotations

import heapq
from operator import mul

from kvsim.sequence import Sequence


class FinishHeap:
    """A cohort's members by the step they finish at (`_finish`: a heap of (step, tiebreak, sequence)),
    released as the cohort's `clock` reaches them; shared by DecodeCohort and the speculative SpecCohort."""

    def pop_finished(self) -> list[Sequence]:
        """Members whose last token the clock has reached, released."""
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


class DecodeCohort(FinishHeap):
    groups = 1  # blocks a member takes at a crossing (one per KV cache group)
    releases_cached = 0  # whether blocks members release stay cached (a windowed cache, prefix caching on)

    def __init__(self, allocator, track_longest: bool = True):
        self.allocator = allocator
        self.block_size = allocator.block_size
        self.grows = allocator.grows  # contiguous slabs never grow
        self.clock = 0  # decode steps given to every member so far
        self.size = 0
        self.context = 0  # sum of the members' num_computed_tokens, kept exact
        # crossings[p]: members of phase p, i.e. that take a new block at the step whose clock value
        # before it is congruent to p (their last block is full then). Kept twice over (p and p + bs),
        # so that any window of up to bs phases from clock % bs is one slice.
        bs = self.block_size
        self.crossings = [0] * (2 * bs)
        self._w1 = list(range(1, bs + 1))  # weights j and j*j of the window's steps j = 1..bs
        self._w2 = [j * j for j in self._w1]
        self._t1 = list(range(bs))  # ... and t, t*t (t = j - 1) for whole periods
        self._t2 = [t * t for t in self._t1]
        # Every member, as (clock at its last token, serial, seq); serials are unique and give the
        # join order. Members leave only through pop_finished and dissolve, so no entry is stale.
        self._finish: list[tuple[int, int, Sequence]] = []
        self._serial = 0
        self.offsets = LongestOffset() if track_longest else None  # None: longest() is not kept

    # ---- membership ------------------------------------------------------------------------
    def join(self, seq: Sequence) -> None:
        """Take a sequence whose next step is a decode (its KV covers all but its newest token)."""
        self._serial += 1
        seq.cohort_clock = self.clock
        self.count_phase(seq.num_computed_tokens, 1)
        if self.offsets is not None:
            self.offsets.add(seq.num_computed_tokens - self.clock)
        self.size += 1
        self.context += seq.num_computed_tokens
        left = seq.request.output_len - seq.num_output_tokens
        heapq.heappush(self._finish, (self.clock + left, self._serial, seq))

    def _leave(self, seq: Sequence) -> None:
        """Bring the member's counters and block table up to date and release it."""
        steps = self.clock - seq.cohort_clock
        self.count_phase(seq.num_computed_tokens + steps, -1)
        if self.offsets is not None:
            self.offsets.remove(seq.num_computed_tokens - seq.cohort_clock)
        seq.num_computed_tokens += steps
        seq.num_output_tokens += steps
        seq.num_tokens += steps
        seq.cohort_clock = -1
        self.size -= 1
        self.context -= seq.num_computed_tokens
        if self.grows:
            self.allocator.claim(seq)

    def dissolve(self) -> list[Sequence]:
        """Release every member (up to date), in the order they joined."""
        members = [seq for _, _, seq in sorted(self._finish, key=lambda entry: entry[1])]
        self._finish.clear()
        for seq in members:
            self._leave(seq)
        return members

    def longest(self) -> int:
        """The largest num_computed_tokens of any member (0 when there is none, or it is not kept)."""
        return self.offsets.top + self.clock if self.size and self.offsets is not None else 0

    # ---- blocks ----------------------------------------------------------------------------
    def count_phase(self, num_computed_tokens: int, n: int) -> None:
        """Add n members (n < 0: remove) that have written `num_computed_tokens` tokens by now."""
        p = (self.clock - num_computed_tokens) % self.block_size
        c = self.crossings
        c[p] += n
        c[p + self.block_size] += n

    def blocks_needed(self, steps: int) -> int:
        """New blocks the members need to write `steps` more tokens each: over a whole period
        of block_size steps every member takes one, then those whose phase lies in the rest."""
        bs = self.block_size
        if steps == 1:  # the every-step case
            return self.crossings[self.clock % bs] if self.grows else 0
        if not self.grows or steps <= 0:
            return 0
        if steps < bs:
            c0 = self.clock % bs
            return sum(self.crossings[c0:c0 + steps])
        a, b = divmod(steps, bs)
        c0 = self.clock % bs
        whole = a * self.size * self.groups  # every member crosses once a period, taking a block a group
        return whole + sum(self.crossings[c0:c0 + b]) if b else whole

    def crossing_moments(self, steps: int) -> tuple[int, int, int]:
        """(sum of c_j, of j * c_j, of j * j * c_j) over the next steps j = 1..`steps`, c_j the
        members whose token count crosses into a new block at step j (the blocks step j takes; the
        first sum is blocks_needed(steps)). With the step times in closed form they give the
        block-seconds a run holds, without a loop over steps."""
        bs = self.block_size
        c0 = self.clock % bs
        if steps <= bs:  # the usual run: within one period
            part = self.crossings[c0:c0 + steps]  # part[j - 1] = c_j
            m0 = sum(part)
            return (m0, sum(map(mul, part, self._w1)), sum(map(mul, part, self._w2))) if m0 else (0, 0, 0)
        w = self.crossings[c0:c0 + bs]  # w[t]: members crossing at steps j with (j - 1) % bs == t
        q, rem = divmod(steps, bs)
        s0, s1, s2 = sum(w), sum(map(mul, w, self._t1)), sum(map(mul, w, self._t2))
        lin = bs * q * (q - 1) // 2 + q  # sum over full periods p < q of (p * bs + 1)
        sq = bs * bs * (q - 1) * q * (2 * q - 1) // 6 + bs * q * (q - 1) + q  # ... of (p * bs + 1)^2
        m0, m1 = q * s0, s0 * lin + q * s1
        m2 = s0 * sq + 2 * s1 * lin + q * s2
        if rem:
            part = w[:rem]
            r0, r1, r2 = sum(part), sum(map(mul, part, self._t1)), sum(map(mul, part, self._t2))
            base = q * bs + 1
            m0 += r0
            m1 += base * r0 + r1
            m2 += base * base * r0 + 2 * base * r1 + r2
        return m0, m1, m2

    def affordable_steps(self, want: int, free_blocks: int) -> tuple[int, int]:
        """The most steps k <= want whose new blocks fit in `free_blocks`, and those blocks."""
        need = self.blocks_needed(want)
        if need <= free_blocks:
            return want, need
        lo, hi, lo_need = 0, want, 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mid_need = self.blocks_needed(mid)
            if mid_need <= free_blocks:
                lo, lo_need = mid, mid_need
            else:
                hi = mid
        return lo, lo_need

    def released_after(self, step: int) -> int:
        """Blocks a planned run releases at its steps after `step` (none here: nothing leaves a window)."""
        return 0

    def net_blocks(self, steps: int) -> int:
        """Blocks the next `steps` steps take, less those they release."""
        return self.blocks_needed(steps)

    def peak_net(self, steps: int) -> int:
        """The most of net_blocks(j) over j = 1..steps."""
        return self.blocks_needed(steps)

    def taken_times(self, steps: int, ends: list) -> float:
        """sum over the next steps j = 1..`steps` of the blocks step j takes, net of releases, times
        ends[j - 1] (when step j ends): what a run's block-seconds subtract (kvsim.engine.fused_run)."""
        return sum((self.net_blocks(j) - self.net_blocks(j - 1)) * ends[j - 1] for j in range(1, steps + 1))

    def written_after(self, steps: int) -> int:
        """Token slots the members write in the next `steps` steps (one a member and group a step)."""
        return steps * self.size * self.groups

    def advance(self, steps: int) -> None:
        """Every member decoded `steps` tokens (their blocks were reserved when scheduled)."""
        self.clock += steps
        written = self.size * steps
        self.context += written
        self.allocator.note_written(written)


class LongestOffset:
    """A multiset of integers whose largest, `top`, is kept up to date: counts by value, and a heap of
    the values (negated) whose entries for removed values are dropped when they reach the top, or all
    at once when they outnumber the live ones. Amortized O(log n) per add and remove."""

    __slots__ = ("_count", "_heap", "top")

    def __init__(self):
        self._count: dict[int, int] = {}
        self._heap: list[int] = []
        self.top = -(1 << 62)  # empty

    def add(self, value: int) -> None:
        n = self._count.get(value, 0)
        self._count[value] = n + 1
        if n:
            return
        if value > self.top:
            self.top = value
        if len(self._heap) > 2 * len(self._count) + 64:  # mostly stale: rebuild from the live values
            self._heap = [-v for v in self._count]
            heapq.heapify(self._heap)
        else:
            heapq.heappush(self._heap, -value)

    def remove(self, value: int) -> None:
        n = self._count[value]
        if n > 1:
            self._count[value] = n - 1
            return
        del self._count[value]
        if value == self.top:
            heap, count = self._heap, self._count
            while heap and -heap[0] not in count:
                heapq.heappop(heap)
            self.top = -heap[0] if heap else -(1 << 62)
