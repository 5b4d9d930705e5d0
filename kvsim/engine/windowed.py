"""The decode cohort and the scheduler over a windowed KV cache (`hybrid.HybridBlockManager`).

With sliding-window groups a decoding sequence takes a block in every group each block_size tokens
(`num_groups` blocks where a full-attention cache takes one) and frees one in each sliding group
each block_size tokens once its context is past the window. `WindowedCohort` keeps both exact:

- allocations: members are counted by phase as in `DecodeCohort`, each crossing worth num_groups
  blocks;
- releases: a heap of (clock of its next release, running order) per member. vLLM's scheduler runs
  remove_skipped_blocks for each running request in running order before taking its slots, so a
  step's releases go to the free queue's tail in the members' running order, between the explicitly
  scheduled sequences' (which release in `append`); a fused run's later steps release theirs when
  the run is planned (`plan_releases`), in step order. Releases go to the tail while the step's
  blocks come from the head, and the cohort only runs while its new blocks fit in the blocks free
  before any release, so taking them at once changes no block taken;
- what the windowed layers read (min(context, window) a member): the members not yet past the
  window are counted (number, context sum) until the clock at which each reaches it, and runs end
  there, so that a run's reads stay linear in the step (Batch.decode_window_tokens, _growth).

`WindowedScheduler` is `Scheduler` with that cohort: its cohort step interleaves the releases with
the running sequences' appends, and its fused runs take their releases when planned.
"""

from __future__ import annotations

import heapq
from heapq import heappop, heapreplace

from kvsim.engine.cohort import DecodeCohort
from kvsim.engine.records import DecodeRunPlan
from kvsim.engine.scheduler import KV_CACHE, Scheduler
from kvsim.sequence import Sequence

NEVER = 1 << 62


class WindowedCohort(DecodeCohort):
    def __init__(self, allocator, track_longest: bool = True):
        super().__init__(allocator, track_longest)
        self.groups = allocator.num_groups
        self.window = allocator.window
        self.releases_cached = int(allocator.enable_prefix_caching)
        self._serials: dict[Sequence, int] = {}
        self._releases: list[tuple[int, int, int, Sequence]] = []  # (clock, run order, serial, member)
        self._saturate: list[tuple[int, int, Sequence]] = []  # (clock it reads a whole window, serial, member)
        self._short: dict[Sequence, int] = {}  # members reading less than the window: offset (context - clock)
        self.short_offsets = 0  # their offsets' sum
        self.step_freed = 0  # blocks released at the current clock so far
        self.run_releases: list[tuple[int, int]] = []  # the last planned run's releases: (step index, blocks), in order

    # ---- membership ------------------------------------------------------------------------------
    def count_phase(self, num_computed_tokens: int, n: int) -> None:
        super().count_phase(num_computed_tokens, n * self.groups)

    def join(self, seq: Sequence) -> None:
        super().join(seq)
        clock, c, serial = self.clock, seq.num_computed_tokens, self._serial
        self._serials[seq] = serial
        nxt = max(c, self.allocator.next_release(seq))
        heapq.heappush(self._releases, (clock + nxt - c, seq.run_order, serial, seq))
        if c + 1 < self.window:
            self._short[seq] = c - clock
            self.short_offsets += c - clock
            heapq.heappush(self._saturate, (clock + self.window - 1 - c, serial, seq))

    def _leave(self, seq: Sequence) -> None:
        del self._serials[seq]
        offset = self._short.pop(seq, None)
        if offset is not None:
            self.short_offsets -= offset
        super()._leave(seq)

    # ---- releases --------------------------------------------------------------------------------
    def _releases_before(self, clock: int, run_order: int, counts=None) -> int:
        """Take the releases at clocks below `clock` (and, at clock - 1, of members ahead of run_order in
        the running queue), in order; their blocks, as (steps from the cohort's clock, blocks) of each
        step that frees some, onto `counts`."""
        heap, serials, release, now = self._releases, self._serials, self.allocator.release, self.clock
        freed = 0
        while heap:
            t, order, serial, seq = heap[0]
            if t >= clock or (t == clock - 1 and order >= run_order):
                break
            if serials.get(seq) != serial:
                heappop(heap)
                continue
            c = seq.num_computed_tokens + t - seq.cohort_clock
            n, nxt = release(seq, c)
            if counts is not None and n:
                if counts and counts[-1][0] == t - now:
                    counts[-1] = (t - now, counts[-1][1] + n)
                else:
                    counts.append((t - now, n))
            freed += n
            heapreplace(heap, (t + nxt - c, order, serial, seq))  # its next release: one sift, not two
        return freed

    def releases_due(self) -> bool:
        """Whether some member releases blocks at the current step."""
        return bool(self._releases) and self._releases[0][0] <= self.clock

    def release_until(self, run_order: int) -> None:
        """The current step's releases of members ahead of `run_order` in the running queue."""
        self.step_freed += self._releases_before(self.clock + 1, run_order)

    def plan_releases(self, steps: int) -> None:
        """Release what the run's steps after the first free (clocks clock+1 .. clock+steps-1), in step
        order; `run_releases` then holds (step index, blocks) of each step that frees some, the first
        step's (step_freed) first. Sparse: a run's reads of it cost its releases, not its steps."""
        first = [(0, self.step_freed)] if self.step_freed else []
        heap = self._releases
        if heap and heap[0][0] < self.clock + steps:  # some may be due in the run
            later: list = []
            self._releases_before(self.clock + steps, NEVER, later)
            first += later[1:] if later and not later[0][0] else later
        self.run_releases = first

    def steps_to_next_release(self) -> int:
        """Steps from the current one to the next whose start releases blocks (at least 1)."""
        heap = self._releases
        while heap and self._serials.get(heap[0][3]) != heap[0][2]:
            heapq.heappop(heap)
        return max(1, heap[0][0] - self.clock) if heap else NEVER

    # ---- what the windowed layers read -----------------------------------------------------------
    def begin_step(self) -> None:
        """At a cohort step's start: members whose reads reach the window now count as whole windows."""
        self.step_freed = 0
        heap, clock = self._saturate, self.clock
        while heap and heap[0][0] <= clock:  # (no work when no member is short of its window)
            _, serial, seq = heapq.heappop(heap)
            if self._serials.get(seq) == serial:
                self.short_offsets -= self._short.pop(seq)

    def window_reads(self) -> tuple[int, int]:
        """(tokens the windowed layers read this step over the members, more a step): each member
        reads min(context + 1, window)."""
        short = len(self._short)
        return (self.size - short) * self.window + self.short_offsets + short * (self.clock + 1), short

    def steps_to_next_finish(self) -> int:
        finish = self._finish[0][0] - self.clock if self._finish else NEVER
        heap = self._saturate
        if not heap:
            return finish
        while heap and self._serials.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return min(finish, heap[0][0] - self.clock) if heap else finish

    # ---- a run's blocks, releases netted ---------------------------------------------------------
    def released_after(self, step: int) -> int:
        """Blocks the planned run releases at its steps after `step` (already released)."""
        return sum(n for j, n in self.run_releases if j >= step)

    def net_blocks(self, steps: int) -> int:
        return self.blocks_needed(steps) - sum(n for j, n in self.run_releases if j < steps)

    def crossing_moments(self, steps: int) -> tuple[int, int, int]:
        m0, m1, m2 = super().crossing_moments(steps)
        for j, n in self.run_releases:  # released at step j + 1 of the run
            if j >= steps:
                break
            m0, m1, m2 = m0 - n, m1 - n * (j + 1), m2 - n * (j + 1) * (j + 1)
        return m0, m1, m2

    def peak_net(self, steps: int) -> int:
        """The most of net_blocks(j) over j = 1..steps (releases make it rise and fall): the blocks taken
        only grow, so the most is just before a release or at the end."""
        best, released = None, 0
        for j, n in self.run_releases:
            if j >= steps:
                break
            if j:
                net = self.blocks_needed(j) - released
                best = net if best is None or net > best else best
            released += n
        net = self.blocks_needed(steps) - released
        return net if best is None or net > best else best


class WindowedScheduler(Scheduler):
    """Scheduler over a windowed KV cache (see the module docstring)."""

    cohort_class = WindowedCohort

    def _schedule_cohort(self, batch, budget: int) -> int:
        alloc, cohort = self.allocator, self.cohort
        cohort.begin_step()
        budget = self._cohort_step(batch, budget, alloc, cohort, cohort.size)
        due = cohort.releases_due()
        for seq in self.running:  # running order: the members before each release first
            if due:
                cohort.release_until(seq.run_order)
            n = seq.num_tokens - seq.num_computed_tokens
            alloc.append(seq, n)
            batch.add(seq, n)
            budget -= n
        if due:
            cohort.release_until(NEVER)
        batch.cohort_step_releases = cohort.step_freed
        batch.decode_window_tokens, batch.decode_window_growth = cohort.window_reads()
        return budget

    def plan_decode_run(self, batch, max_steps: int) -> DecodeRunPlan:
        """As Scheduler's, but a run also ends before a release while the KV cache holds a request
        back: the blocks released could admit it (in a full-attention cache nothing frees blocks
        before a sequence finishes); and after one step when that request would revive free cached
        blocks (a preempted sequence's own), which the run's new blocks may evict: an admission
        that needs fewer blocks without them (a chunk within the budget) could then go through."""
        # A run's releases are taken when it is planned, its blocks when it is committed: a block taken
        # within the run must not leave a window within it (that takes window + block_size steps)
        max_steps = min(max_steps, self.cohort.window)
        if self.waiting and self.admission_limit == KV_CACHE:
            max_steps = min(max_steps, self.cohort.steps_to_next_release())
            head = self.waiting[0]
            if self.allocator.free_hits(self.allocator.get_computed_blocks(head)):
                max_steps = 1  # the run's blocks would evict its cached blocks, which changes what it needs
        plan = super().plan_decode_run(batch, max_steps)
        if plan.steps > 1:
            self.cohort.plan_releases(plan.steps)
        return plan
