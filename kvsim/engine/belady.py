"""The offline-optimal bound on an offload tier's hits (Belady's MIN, with bypass) for the lookups a run made.

A run records, per admission, the offloaded blocks of its prompt in order and how many of them the GPU
prefix cache held (kvsim.engine.offload_stats). Every block of an admission is one that the tier
could hold afterwards (it is in GPU memory: computed, loaded or hit there), so each admission is a
chance to insert any of its blocks; a block past the GPU hits that the tier holds at that moment is
a hit. The most hits any eviction policy with `capacity` blocks can get on that sequence is Belady's:
keep the blocks whose next counted use comes soonest, drop (or do not insert) the one whose next use
is farthest; a block whose next appearance is not a counted use is worth nothing until then (it can
be inserted again at that appearance for free). The run's own hits are never more: its tier holds
only blocks of earlier admissions, and counts a hit only when a block's whole prefix hit too.
`brute_force` tries every policy on small sequences (the tests compare the two).
"""

from __future__ import annotations

import heapq
from itertools import product

import numpy as np

NEVER = np.iinfo(np.int64).max


def next_counted_use(ids: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Per reference, the index of the next reference to the same block if that one counts, else NEVER."""
    n = len(ids)
    order = np.lexsort((np.arange(n), ids))
    nxt = np.full(n, NEVER, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    follower = order[1:][same]
    nxt[order[:-1][same]] = np.where(counted[follower], follower, NEVER)
    return nxt


def belady_hits(ids: np.ndarray, counted: np.ndarray, capacity: int) -> int:
    """Belady's hits on references `ids` (block ids; `counted`: which are lookups whose hit counts)."""
    if capacity <= 0 or not len(ids):
        return 0
    nxt = next_counted_use(ids, counted).tolist()
    cache: dict = {}  # id -> its next counted use
    heap: list = []  # (-next use, id), stale entries skipped
    hits = 0
    push, pop = heapq.heappush, heapq.heappop
    for x, c, n in zip(ids.tolist(), counted.tolist(), nxt):
        if x in cache:
            hits += c
            if n == NEVER:
                del cache[x]
            else:
                cache[x] = n
                push(heap, (-n, x))
            continue
        if n == NEVER:
            continue  # never useful again: bypass
        if len(cache) >= capacity:
            while True:  # the cached block used farthest ahead
                far, y = heap[0]
                if cache.get(y) == -far:
                    break
                pop(heap)
            if -far <= n:
                continue  # the newcomer is used later than any cached block: bypass
            pop(heap)
            del cache[y]
        cache[x] = n
        push(heap, (-n, x))
    return hits


def brute_force(ids: list, counted: list, capacity: int) -> int:
    """The most hits over every choice, at every reference, of which blocks to keep (tiny inputs only)."""
    best = 0
    states = {frozenset(): 0}
    for x, c in zip(ids, counted):
        nxt: dict = {}
        for cache, hits in states.items():
            hits += c if x in cache else 0
            pool = cache | {x}
            for keep in _subsets(pool, capacity):
                if nxt.get(keep, -1) < hits:
                    nxt[keep] = hits
        states = nxt
    best = max(states.values(), default=0)
    return best


def _subsets(pool: frozenset, capacity: int):
    items = sorted(pool)
    for mask in product((0, 1), repeat=len(items)):
        if sum(mask) <= capacity:
            yield frozenset(i for i, m in zip(items, mask) if m)
