"""An oracle CPU tier for the optimal bound's TTFT: eviction by Belady's MIN (drop the block whose next
use is farthest), knowing the lookups a first run of the same policy made (kvsim.engine.offload_stats
records them, per replica and admission).

`Future` holds one replica's recorded admissions: admission a used the offloaded blocks of its prompt
past its GPU prefix hits. Re-running the policy with this tier, the replica's admissions are counted
as they happen; a block's next use is the first recorded admission at or after the current count that
uses it (never: first to go). The re-run's own timing differs from the first run's, so the future is
the first run's, read by admission count: an oracle for that trace, not a proof of optimality for the
re-run. Ties (blocks never used again, or next used at the same admission) go least recently used
first. The tier is LRUTier (kvsim.engine.lru_tier) in every other respect.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kvsim.engine.lru_tier import LRUTier

NEVER = np.iinfo(np.int64).max


class Future:
    """One replica's recorded admissions: `refs` [(folded keys (uint64), GPU-hit blocks)] in order."""

    __slots__ = ("keys", "uses", "span")

    def __init__(self, refs: list):
        used = [k[held:] for k, held in refs]
        flat = np.concatenate(used) if used else np.zeros(0, np.uint64)
        when = np.repeat(np.arange(len(used), dtype=np.int64), [len(u) for u in used])
        self.keys, ids = np.unique(flat, return_inverse=True)
        self.span = len(used) + 1
        self.uses = np.sort(ids.astype(np.int64) * self.span + when)  # (key id, admission), in order

    def next_use(self, folded: np.ndarray, now: int) -> np.ndarray:
        """Per key, the first recorded admission at or after `now` that uses it (NEVER: none)."""
        if not len(self.keys):
            return np.full(len(folded), NEVER, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.keys, folded), len(self.keys) - 1)
        known = self.keys[at] == folded
        code = at * self.span + min(now, self.span - 1)
        pos = np.minimum(np.searchsorted(self.uses, code), len(self.uses) - 1)
        found = self.uses[pos]
        ahead = (found // self.span == at) & (found >= code)  # (past the last use: the clamped position)
        return np.where(known & ahead, found % self.span, NEVER)


class BeladyTier(LRUTier):
    """LRUTier whose eviction takes the blocks used farthest ahead (see the module docstring); `clock()`
    is the replica's admissions so far."""

    __slots__ = ("future", "clock_of")

    def __init__(self, num_blocks: int, future: Future, clock: Callable[[], int], store_threshold: int = 0,
                 max_tracker_size: int = 64_000):
        super().__init__(num_blocks, store_threshold, max_tracker_size)
        self.future, self.clock_of = future, clock

    def _evict(self, n: int, protected: np.ndarray):
        ref, mark = self.ref, self.mark
        mark[protected] = True
        cand = np.flatnonzero((ref[:self.top] == 0) & ~mark[:self.top])
        mark[protected] = False
        if len(cand) < n:
            return None
        nxt = self.future.next_use(self.folded[cand], self.clock_of())
        order = np.lexsort((self.stamp[cand], -nxt))  # farthest next use first, then least recent
        slots = cand[order[:n]]
        self._drop(slots)
        return slots
