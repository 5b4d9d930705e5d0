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
advancing the clock by k needs, for each member, the block boundaries its token count crosses;
members are counted by their token count modulo block_size, which makes that sum O(block_size).
The blocks are reserved from the allocator (taken off its free queue in LRU order, evicting as it
would) at once, and handed to each member's block table when it leaves.
"""

from __future__ import annotations

import heapq
from operator import mul

from kvsim.sequence import Sequence


_T1 = {bs: list(range(bs)) for bs in (1, 8, 16, 32, 64, 128, 4, 2)}
_T2 = {bs: [t * t for t in range(bs)] for bs in _T1}
_J1 = {bs: list(range(1, bs + 1)) for bs in _T1}
_J2 = {bs: [j * j for j in range(1, bs + 1)] for bs in _T1}


class DecodeCohort:
    def __init__(self, allocator, track_longest: bool = True):
        self.allocator = allocator
        self.block_size = allocator.block_size
        self.grows = not getattr(allocator, "fixed_slabs", False)  # contiguous slabs never grow
        self.clock = 0  # decode steps given to every member so far
        self.size = 0
        self.context = 0  # sum of the members' num_computed_tokens, kept exact
        self.residues = [0] * self.block_size  # members by (num_computed_tokens - clock) mod block_size
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
        self.residues[(seq.num_computed_tokens - self.clock) % self.block_size] += 1
        if self.offsets is not None:
            self.offsets.add(seq.num_computed_tokens - self.clock)
        self.size += 1
        self.context += seq.num_computed_tokens
        left = seq.request.output_len - seq.num_output_tokens
        heapq.heappush(self._finish, (self.clock + left, self._serial, seq))

    def _leave(self, seq: Sequence) -> None:
        """Bring the member's counters and block table up to date and release it."""
        steps = self.clock - seq.cohort_clock
        self.residues[(seq.num_computed_tokens - seq.cohort_clock) % self.block_size] -= 1
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

    # ---- blocks ----------------------------------------------------------------------------
    def blocks_needed(self, steps: int) -> int:
        """New blocks the members need to write `steps` more tokens each.

        A member whose last block holds q tokens (q = 0: full) needs ceil((q + steps) / bs) - [q > 0]
        blocks. With steps = a*bs + b that is a, plus one if q is 0 or q > bs - b (b > 0): every
        member's `a`, and one more for the members in a cyclic range of b residues.
        """
        if steps == 1:  # the every-step case: members whose last block is full
            return self.residues[-self.clock % self.block_size] if self.grows else 0
        if not self.grows or steps <= 0:
            return 0
        bs = self.block_size
        a, b = divmod(steps, bs)
        total = a * self.size
        if b:
            res = self.residues
            r0 = (bs - b + 1 - self.clock) % bs  # residue of members with q = bs - b + 1 (q = 0 when b = 1)
            if r0 + b <= bs:
                total += sum(res[r0:r0 + b])
            else:
                total += sum(res[r0:]) + sum(res[:r0 + b - bs])
        return total

    def crossing_moments(self, steps: int) -> tuple[int, int, int]:
        """(sum of c_j, of j * c_j, of j * j * c_j) over the next steps j = 1..`steps`, c_j the
        members whose token count crosses into a new block at step j (the blocks step j takes; the
        first sum is blocks_needed(steps)). With the step times in closed form they give the
        block-seconds a run holds, without a loop over steps."""
        bs = self.block_size
        res = self.residues[::-1]  # step j takes residues[-(clock + j - 1) % bs]: a rotation of this
        s = (bs - 1 - (-self.clock % bs)) % bs
        w = res[s:] + res[:s]  # w[t]: members crossing at steps j with (j - 1) % bs == t
        if steps <= bs:  # the usual run: within one period
            part = w[:steps]
            return sum(part), sum(map(mul, part, _J1[bs])), sum(map(mul, part, _J2[bs]))
        q, rem = divmod(steps, bs)
        s0, s1, s2 = sum(w), sum(map(mul, w, _T1[bs])), sum(map(mul, w, _T2[bs]))
        lin = bs * q * (q - 1) // 2 + q  # sum over full periods p < q of (p * bs + 1)
        sq = bs * bs * (q - 1) * q * (2 * q - 1) // 6 + bs * q * (q - 1) + q  # ... of (p * bs + 1)^2
        m0, m1 = q * s0, s0 * lin + q * s1
        m2 = s0 * sq + 2 * s1 * lin + q * s2
        if rem:
            part = w[:rem]
            r0, r1, r2 = sum(part), sum(map(mul, part, _T1[bs])), sum(map(mul, part, _T2[bs]))
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
