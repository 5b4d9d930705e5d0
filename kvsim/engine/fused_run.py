"""A fused decode run seen step by step: the figures step-by-step scheduling would have sampled.

The simulator advances a run of k identical decode steps as one event. The time series and the KV
integral must still be those of k separate steps, so before the run's later blocks are taken
`RunSeries.plan` works them out in closed form (no loop over steps):

- the KV block-seconds the run holds: step j holds the blocks taken by the end of step j - 1, and
  with step ends T(j) = a*j + b*j(j-1)/2 (a run within one regime of the step-time model) the sum is
  a closed form in the cohort's crossing moments (`DecodeCohort.crossing_moments`);
- the blocks held after the run's next-to-last step (the most a sample inside the run shows: the
  last step may free finished sequences), for the peak;
- the rows of every time-series bucket the run crosses but its last (the last step of the run in
  each such bucket, with the evictions its pops would make read off the free queue), only when the
  run reaches past the replica's open bucket.

The results stay on the object (`marks`, `block_s`, `peak`) until the next run: nothing is allocated
for a run that crosses no bucket. It reads the scheduler's cohort and queues and the allocator's
public figures (`KVAllocator.evictions_ahead` for the evictions), and the backend's run price.
"""

from __future__ import annotations

import math


class RunSeries:
    """One replica's fused-run figures (see the module docstring)."""

    __slots__ = ("scheduler", "allocator", "backend", "interval", "marks", "block_s", "peak")

    def __init__(self, scheduler, backend, interval: float):
        self.scheduler, self.allocator, self.backend, self.interval = scheduler, scheduler.allocator, backend, interval
        self.marks: list | tuple = ()  # StepRecord.marks: (sample, batch tokens) of each crossed bucket's last step
        self.block_s = 0.0  # KV block-seconds the run holds
        self.peak = 0  # blocks held after its next-to-last step

    def plan(self, batch, shape, k: int, now: float, first: float, tk: float, bucket_end: float) -> None:
        """A run of k > 1 decode steps of the cohort-only `batch` (of `shape`) starting at `now`: its
        first step takes `first` seconds, all k take `tk`. `bucket_end`: where the replica's open
        time-series bucket ends (a run ending before it crosses none). Called before the run's later
        blocks are taken (its first step's are)."""
        cohort = self.scheduler.cohort
        # before the run's first step (a windowed cache has released the run's blocks already)
        u0 = self.allocator.num_used_blocks - batch.cohort_step_blocks + cohort.released_after(0)
        grows = cohort.grows
        last, m1, m2 = cohort.crossing_moments(k - 1) if grows else (0, 0, 0)
        crosses = now + tk >= bucket_end
        if not (last or m1 or m2 or crosses):  # no block taken or released inside the run, no bucket crossed
            self.marks, self.block_s, self.peak = (), u0 * tk, u0
            return
        # Step j ends T(j) = a*j + b*j(j-1)/2 after `now` while the run stays in one regime of the
        # step-time model (checked at k); otherwise T comes from the backend step by step.
        b = (self.backend.decode_run_time(shape, 2) - 2 * first) if k > 2 else 0.0
        quadratic = k <= 2 or abs(first * k + b * k * (k - 1) / 2 - tk) <= 1e-9 * tk
        interval = self.interval
        self.marks = (self._marks(batch, shape, k, now, first, b if quadratic else None, tk)
                      if crosses and int((now + first) // interval) != int((now + tk) // interval) else ())
        if not grows:
            self.block_s, self.peak = u0 * tk, u0
            return
        # Block-seconds: sum over steps j of U(j-1) * dt_j, U(j) = U0 + B(j) the blocks held after
        # step j. By parts: (U0 + B(k-1)) * T(k) - sum_{j<k} (B(j) - B(j-1)) * T(j), and with T
        # quadratic the last sum is a*M1 + b*(M2 - M1)/2 (the cohort's crossing moments).
        if quadratic:
            held = first * m1 + b * (m2 - m1) / 2
        else:
            run_time = self.backend.decode_run_time
            held = cohort.taken_times(k - 1, [run_time(shape, j) for j in range(1, k)])
        self.block_s, self.peak = (u0 + last) * tk - held, u0 + cohort.peak_net(k - 1)

    def _marks(self, batch, shape, k: int, now: float, a: float, b, tk: float) -> list:
        """The samples of the last step ending in each bucket the run crosses, but the end's."""
        interval, steps, last = self.interval, [], 0  # steps: (j, now + T(j)) of each bucket's last step
        for bucket in range(int((now + a) // interval), int((now + tk) // interval)):
            limit = (bucket + 1) * interval - now  # the last step ending before this
            j, t = (self._last_before_by_backend(shape, k, now, a, limit) if b is None
                    else _last_before(k, now, a, b, limit))
            if last < j < k and int(t // interval) == bucket:
                steps.append((j, t))
                last = j
        return self._samples(batch, steps) if steps else steps

    def _last_before_by_backend(self, shape, k: int, now: float, a: float, limit: float) -> tuple[int, float]:
        """The largest j < k whose run ends before `limit` after `now`, and its end (a run across
        regimes of the step-time model: T from the backend)."""
        run_time = self.backend.decode_run_time
        j = int(limit // a)
        while j > 1 and now + run_time(shape, j) - now >= limit:
            j -= 1
        while j + 1 < k and now + run_time(shape, j + 1) - now < limit:
            j += 1
        return j, now + run_time(shape, j)

    def _samples(self, batch, steps: list) -> list:
        """(sample, batch tokens) after each of `steps` ((j, end time)), with the blocks the run has
        taken by then and the evictions their pops make, read off the free queue beforehand."""
        sched, alloc, cohort = self.scheduler, self.allocator, self.scheduler.cohort
        first_blocks, size, bs = batch.cohort_step_blocks, batch.cohort_size, alloc.block_size
        more = [cohort.blocks_needed(j) - first_blocks for j, _ in steps]
        evicted = alloc.evictions_ahead(more)
        used, free, cached = alloc.num_used_blocks, alloc.num_free_blocks, alloc.num_cached_blocks
        reserved, frag = alloc.reserved_unused_tokens, alloc.external_fragmentation
        running, waiting, swapped = sched.num_running, len(sched.waiting), len(sched.swapped)
        # a windowed cache released the run's blocks at once: those of steps after j are not free yet
        later = [cohort.released_after(j) for j, _ in steps]
        cf = cohort.releases_cached
        return [((t, running, waiting, swapped, used + m + r, cached - e - r * cf,
                  free - m - (cached - e) - r * (1 - cf), reserved + m * bs - cohort.written_after(j), frag), size)
                for (j, t), m, e, r in zip(steps, more, evicted, later)]


    def with_arrivals(self, start: float) -> list | tuple:
        """The marks with the requests that arrived during the run counted as waiting from their arrival
        (async scheduling lets a run take the step after an arrival: its second-to-last step's sample
        sees the newcomer waiting)."""
        late = []
        for seq in reversed(self.scheduler.waiting):  # newcomers queue at the back
            t = seq.request.arrival_time
            if t <= start:
                break
            late.append(t)
        if not late:
            return self.marks
        return [((s[0], s[1], s[2] + sum(t <= s[0] for t in late), *s[3:]), n) for s, n in self.marks]


def _last_before(k: int, now: float, a: float, b: float, limit: float) -> tuple[int, float]:
    """The largest j < k with a*j + b*j(j-1)/2 < limit, checked against rounding, and now + that."""
    if b:
        c = a - b / 2
        j = int((-c + math.sqrt(c * c + 2 * b * limit)) / b)
    else:
        j = int(limit // a)
    while j > 1 and now + a * j + b * j * (j - 1) / 2 - now >= limit:
        j -= 1
    while j + 1 < k and now + a * (j + 1) + b * (j + 1) * j / 2 - now < limit:
        j += 1
    return j, now + a * j + b * j * (j - 1) / 2
