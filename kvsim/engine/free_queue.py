"""The LRU queue of free KV blocks, as vLLM's FreeKVCacheBlockQueue: blocks are taken from the head
and freed blocks join the tail, so the least recently freed block is reused (and its cached content
evicted) first; a prefix hit takes a free block out of the middle.

vLLM threads a doubly linked list through its block objects. Here the queue is an append-only log of
block ids (`array('i')`) read from an index, so taking or freeing a run of blocks is one slice, not
a Python operation per block:

- Every entry has a log position (0, 1, 2, ... in append order, never reused). `pop` takes the live
  entries at the lowest positions; `head` is the position it has reached. An entry at or past
  `head` has not been taken yet, which lets a caller that knows where its blocks went (the
  allocator records the position of each freed run) tell which of them are still free without
  asking the queue about each block.
- Blocks never used yet are not in the log: they stand before it, as the range [`high_water`,
  num_blocks), handed out in id order as vLLM's initial queue is. Nothing is allocated per block up
  front, so a replica that never runs costs a few hundred bytes, whatever its cache size.
- Taking an entry out of the middle (`remove_range`, `remove_positions`) leaves it in the log,
  marked stale by position range; `pop` skips stale ranges. The caller knows where its blocks are:
  `append` returns the position of the first of the run.
- `num_cached` counts the free blocks that hold cached content. Freed runs are mostly cached (every
  full block is, with prefix caching on), so the queue keeps the positions of the few entries that
  are not (a table's partly filled last block), and an eviction count is a subtraction.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque

import numpy as np

COMPACT_AFTER = 4096  # taken entries the log may keep at its front before they are deleted


class FreeBlockQueue:
    """Free block ids of a pool of `num_blocks`, in eviction order."""

    def __init__(self, num_blocks: int, caching: bool = True):
        self.num_blocks = num_blocks
        self.caching = caching  # False: nothing is cached, nothing is counted
        self.high_water = 0  # blocks [high_water, num_blocks) were never used: the front of the queue
        self.num_free = num_blocks
        self.num_cached = 0  # free blocks holding cached content
        self._ids = array("i")  # the log: the entry at position p is _ids[p - _base]
        self._base = 0
        self._compact_at = COMPACT_AFTER  # compact when the head is past this position (and half the log)
        self.head = 0  # log position of the next entry to take
        self._uncached: deque[int] = deque()  # positions >= head of entries holding nothing reusable
        self._stale: list[tuple[int, int]] = []  # heap of disjoint [lo, hi) position ranges taken out early

    @property
    def tail(self) -> int:
        """The log position the next appended entry gets."""
        return self._base + len(self._ids)

    # ---- taking from the head -------------------------------------------------------------
    def pop(self, n: int) -> array:
        """Take the n blocks at the head (n <= num_free), never-used blocks first."""
        self.num_free -= n
        start = self.high_water
        if start == self.num_blocks:  # every block has been used: the log
            return self._take(n)
        if start + n <= self.num_blocks:  # the common case until then
            self.high_water = start + n
            return array("i", range(start, start + n))
        out = array("i", range(start, self.num_blocks))
        self.high_water = self.num_blocks
        out.extend(self._take(n - len(out)))
        return out

    def _take(self, n: int) -> array:
        h, base, stale = self.head, self._base, self._stale
        if not stale or stale[0][0] >= h + n:  # no stale entry in the way: one slice
            out = self._ids[h - base:h + n - base]
            h += n
            if stale and stale[0][0] == h:
                h = self._skip_stale(h)
        else:
            out, left = array("i"), n
            while left:
                end = min(h + left, stale[0][0]) if stale else h + left
                out.extend(self._ids[h - base:end - base])
                left -= end - h
                h = self._skip_stale(end)
        self.head = h
        if self.caching:  # every live entry taken held cached content, but the uncached ones
            uncached = self._uncached
            if uncached and uncached[0] < h:
                cached = len(out)
                while uncached and uncached[0] < h:
                    uncached.popleft()
                    cached -= 1
                self.num_cached -= cached
            else:
                self.num_cached -= n
        if h > self._compact_at and 2 * (h - base) > len(self._ids):  # drop the taken front now and then
            del self._ids[:h - base]
            self._base = h
            self._compact_at = h + COMPACT_AFTER
        return out

    def _skip_stale(self, h: int) -> int:
        """The first live position from h on (stale ranges starting at h are passed)."""
        stale = self._stale
        while stale and stale[0][0] == h:
            h = heapq.heappop(stale)[1]
        return h

    def cached_ahead(self, counts) -> list[int]:
        """For each n in `counts` (ascending), how many of the next n blocks `pop` would take hold
        cached content (the evictions a run of pops would make, for figures between its steps)."""
        if not self.caching:
            return [0] * len(counts)
        out, fresh = [], self.num_blocks - self.high_water
        stale = sorted(self._stale)
        uncached = iter(self._uncached)
        u, seen = next(uncached, None), 0
        for n in counts:
            k = n - fresh  # live log entries among the n
            if k <= 0:
                out.append(0)
                continue
            last = self.head + k - 1  # position of the k-th live entry: stale ranges push it on
            for lo, hi in stale:
                if lo > last:
                    break
                last += hi - lo
            while u is not None and u <= last:
                seen += 1
                u = next(uncached, None)
            out.append(k - seen)
        return out

    def block_at(self, position: int) -> int:
        """The block at a log position at or past the head (a caller that knows where its block went)."""
        return self._ids[position - self._base]

    # ---- freeing to the tail ----------------------------------------------------------------
    def append(self, blocks: array, num_uncached: int = 0) -> int:
        """Queue `blocks` (eviction order: the first is taken first); the first `num_uncached`
        hold no cached content, the rest do. Returns the log position of the first."""
        n = len(blocks)
        g = self._base + len(self._ids)
        self._ids.extend(blocks)
        self.num_free += n
        self.num_cached += n - num_uncached
        if num_uncached:
            self._uncached.extend(range(g, g + num_uncached))
        return g

    def append_one(self, block: int) -> int:
        """Queue one block that holds cached content (nothing reusable in a queue that does not
        cache); its log position."""
        ids = self._ids
        ids.append(block)
        self.num_free += 1
        if self.caching:
            self.num_cached += 1
        return self._base + len(ids) - 1

    def append_uncached(self, blocks: array) -> None:
        """Queue blocks that hold nothing reusable, in a queue that does not cache."""
        self._ids.extend(blocks)
        self.num_free += len(blocks)

    # ---- taking from the middle (prefix hits) -----------------------------------------------
    def remove_range(self, lo: int, hi: int) -> None:
        """Take the live entries at log positions [lo, hi) out of the queue (a revived run of
        cached blocks)."""
        if hi <= lo:
            return
        self.num_free -= hi - lo
        self.num_cached -= hi - lo
        if lo == self.head:
            self.head = hi
            while self._stale and self._stale[0][0] == self.head:
                self.head = heapq.heappop(self._stale)[1]
        else:
            heapq.heappush(self._stale, (lo, hi))

    def remove_positions(self, positions) -> None:
        """Take the live entries at these log positions (a list, or a numpy array when there are
        many) out of the queue, wherever they are."""
        if isinstance(positions, list):
            positions.sort()
            lo = prev = positions[0]
            for p in positions:
                if p > prev + 1:
                    self.remove_range(lo, prev + 1)
                    lo = p
                prev = p
            self.remove_range(lo, prev + 1)
            return
        pos = np.sort(positions)
        breaks = np.flatnonzero(np.diff(pos) != 1) + 1
        for run in np.split(pos, breaks) if len(breaks) else (pos,):
            self.remove_range(int(run[0]), int(run[-1]) + 1)

    # ---- checks -----------------------------------------------------------------------------
    def block_ids(self) -> list[int]:
        """Every free block, head first. For tests and checks, not for hot paths."""
        out = list(range(self.high_water, self.num_blocks))
        h, base = self.head, self._base
        for lo, hi in sorted(self._stale) + [(self.tail, self.tail)]:
            out += self._ids[h - base:lo - base].tolist()
            h = max(h, hi)
        return out
