"""An offload tier with vLLM v0.26.0's LRU policy (vllm/v1/kv_offload/cpu/policies/lru.py), kept in numpy
arrays so that a prompt's hundreds of blocks cost a few array operations, not one dict operation each.

The tier answers exactly as kvsim.engine.offload_tier.OffloadTier does with an ordered dict (the
tests drive both against kvsim.engine.tier_reference): each block held has a slot; `ref[slot]` is
its reference count (-1: store in flight, 0: ready and evictable, n: n loads read it) and
`stamp[slot]` when it was last inserted or touched. The LRU order is the order of the stamps: a
touch gives its keys new stamps, the last key first (so the first is the most recent), an insert
gives the new keys new stamps in order. Only eviction reads the order, from a snapshot sorted by
stamp: an entry of the snapshot whose stamp has changed since (touched, evicted, its slot reused)
is newer than every entry that has not, so the snapshot's unchanged entries, in order, are the
least recent blocks; when they run out the snapshot is taken again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import compress, repeat
from typing import Optional

import numpy as np

NOT_READY, ABSENT = -1, -2  # ref of a block whose store is in flight; of a free slot (and the sentinel)
MASK, FOLD = (1 << 64) - 1, 0xD1B54A32D192ED03  # keys of unique content (above 64 bits) folded into 64 bits


def fold_keys(keys) -> np.ndarray:
    """Keys as uint64: 64-bit identities as they are, keys of unique content (kvsim.engine.offload's,
    which come last) folded (a collision with another key: ~2^-64, as vLLM trusts its hashes)."""
    j = len(keys)
    while j and keys[j - 1] > MASK:
        j -= 1
    try:
        head = np.array(keys[:j], dtype=np.uint64)
    except OverflowError:  # unique keys before shared ones: not kvsim's order, folded one by one
        return np.array([k if k <= MASK else (k & MASK) ^ FOLD for k in keys], dtype=np.uint64)
    if j == len(keys):
        return head
    return np.concatenate([head, np.array([(k & MASK) ^ FOLD for k in keys[j:]], dtype=np.uint64)])
WINDOW = 256  # snapshot entries checked at once
REINDEX = 4096  # blocks inserted after which the sorted index is rebuilt (or an eighth of those held)
INITIAL_SLOTS = 1024  # slots allocated at first; doubled as needed up to the tier's blocks
SORTED_NEEDLES = 64  # keys looked up at once beyond which they are sorted first


def count_lookups(counts: OrderedDict, keys, max_tracker_size: int) -> None:
    """vLLM's reuse gating: every key looked up is counted, in an LRU tracker of `max_tracker_size` keys."""
    for key in keys:
        if key in counts:
            counts.move_to_end(key)
            counts[key] += 1
        else:
            if len(counts) >= max_tracker_size:
                counts.popitem(last=False)
            counts[key] = 1


class LRUTier:
    """One tier's blocks with LRU eviction; the interface of kvsim.engine.offload_tier.OffloadTier."""

    __slots__ = ("num_blocks", "name", "store_threshold", "max_tracker_size", "counts", "num_evictable",
                 "num_pending", "evictions", "slot", "key_of", "ref", "stamp", "mark", "folded", "free", "top",
                 "clock", "queue", "queued", "head", "index", "index_slots", "recent")

    def __init__(self, num_blocks: int, store_threshold: int = 0, max_tracker_size: int = 64_000, name: str = "cpu"):
        self.num_blocks, self.name = num_blocks, name
        self.store_threshold, self.max_tracker_size = store_threshold, max_tracker_size
        self.counts: Optional[OrderedDict] = OrderedDict() if store_threshold >= 2 else None
        self.num_evictable = 0  # ready blocks no load reads
        self.num_pending = 0  # blocks whose store is in flight
        self.evictions = 0
        self.slot: dict = {}  # key -> slot
        self.key_of: list = []  # slot -> key
        size = min(num_blocks, INITIAL_SLOTS)
        # one more element than slots: index -1 is a sentinel, so a missing key's slot (-1) reads ABSENT
        self.ref = np.full(size + 1, ABSENT, dtype=np.int64)
        self.stamp = np.full(size + 1, -1, dtype=np.int64)
        self.mark = np.zeros(size + 1, dtype=bool)  # scratch: slots an eviction must not take
        self.folded = np.zeros(size + 1, dtype=np.uint64)  # slot -> its key folded (fold_keys); 0 when free
        self.free: list = []  # slots released by evictions
        self.top = 0  # slots used so far
        self.clock = 0  # the next stamp
        self.queue = np.zeros(0, dtype=np.int64)  # the eviction snapshot: slots, least recent first ...
        self.queued = np.zeros(0, dtype=np.int64)  # ... and their stamps when it was taken
        self.head = 0  # the snapshot's first entry that may still be unchanged
        self.index = np.full(1, MASK, dtype=np.uint64)  # folded keys held at the last _reindex, sorted ...
        self.index_slots = np.full(1, -1, dtype=np.int64)  # ... and their slots then
        self.recent: dict = {}  # folded key -> slot, of the blocks inserted since

    def __len__(self) -> int:
        return len(self.slot)

    def __contains__(self, key) -> bool:
        return key in self.slot

    def resolve(self, keys, folded: Optional[np.ndarray] = None, known: Optional[np.ndarray] = None) -> np.ndarray:
        """The slots of `keys` (-1: not here). Every operation takes them as `slots` too: a caller that
        operates on the same keys again passes them instead of having them resolved again, while they
        cannot have moved (a block being loaded or stored is never evicted). With `folded` (the keys
        by fold_keys) they are found by numpy in a sorted index of the blocks held, and those inserted
        since it was built in a small dict; `known`: slots found for the same keys before, updated in
        place and returned: those still holding their key are kept."""
        get = self.slot.get
        if folded is None:
            return np.fromiter(map(get, keys, repeat(-1)), np.int64, len(keys))
        if known is None:
            known = np.full(len(keys), -1, dtype=np.int64)
        folded_of = self.folded
        stale = np.flatnonzero(folded_of[known] != folded)  # the sentinel (a missing key's -1) holds 0
        if not len(stale):
            return known
        want = folded[stale]
        # whatever slot the index names, the key is there exactly when that slot's folded key is the key
        if len(want) > SORTED_NEEDLES:  # binary searches in key order stay in cache: 2x on ~1,000 keys
            order = np.argsort(want)
            at = np.empty_like(order)
            at[order] = self.index.searchsorted(want[order])
        else:
            at = self.index.searchsorted(want)
        found = self.index_slots[at]  # (the index ends in a sentinel)
        hit = folded_of[found] == want
        known[stale] = np.where(hit, found, -1)
        if self.recent:
            miss = stale[~hit]
            if len(miss):
                want = folded[miss]
                found = np.fromiter(map(self.recent.get, want.tolist(), repeat(-1)), np.int64, len(miss))
                known[miss] = np.where(folded_of[found] == want, found, -1)
        return known

    def _reindex(self) -> None:
        """The sorted index of the folded keys held, ending in a sentinel (blocks inserted later go to
        `recent` until the next)."""
        used = np.flatnonzero(self.ref[:self.top] != ABSENT)
        keys = self.folded[used]
        order = np.argsort(keys)
        self.index = np.append(keys[order], np.uint64(MASK))
        self.index_slots = np.append(used[order], -1)
        self.recent = {}

    def ref_of(self, key) -> Optional[int]:
        s = self.slot.get(key)
        return None if s is None else int(self.ref[s])

    def ready(self, key) -> bool:
        s = self.slot.get(key)
        return s is not None and bool(self.ref[s] >= 0)

    def keys(self) -> list:
        """The blocks held, least recent first."""
        slots = np.fromiter(self.slot.values(), np.int64, len(self.slot))
        return [self.key_of[s] for s in slots[np.argsort(self.stamp[slots])].tolist()]

    def lookup(self, keys, slots=None) -> int:
        """How many leading `keys` are ready here (each key counted first when store gating is on)."""
        if self.counts is not None:
            count_lookups(self.counts, keys, self.max_tracker_size)
        if not len(keys):
            return 0
        missing = np.flatnonzero(self.ref[self.resolve(keys) if slots is None else slots] < 0)
        return int(missing[0]) if len(missing) else len(keys)

    def in_use(self, keys, slots=None) -> bool:
        """Whether a load reads any of `keys`."""
        return bool(len(keys)) and bool((self.ref[self.resolve(keys) if slots is None else slots] > 0).any())

    def touch(self, keys, slots=None) -> None:
        slots = self.resolve(keys) if slots is None else slots
        slots = slots[slots >= 0]
        n = len(slots)
        if n:
            self.stamp[slots[::-1]] = np.arange(self.clock, self.clock + n)
            self.clock += n

    def prepare_store(self, keys, gate: bool = True) -> Optional[list]:
        """The keys to store now, entered not ready (None: no room can be made; nothing changed).
        `gate` False: no reuse gating (a promotion from a lower tier, a cascade into one)."""
        if gate and self.counts is not None:
            counts, threshold = self.counts, self.store_threshold
            keys = [k for k in keys if counts.get(k, 0) >= threshold]
        return self.prepare_store_at(keys, self.resolve(keys))[0]

    def prepare_store_at(self, keys, slots: np.ndarray, held: Optional[np.ndarray] = None,
                         folded: Optional[np.ndarray] = None) -> tuple:
        """prepare_store without gating, of keys whose `slots` are known (`folded`: the keys by fold_keys):
        (the new keys, their slots), or (None, None). `slots` gets the new keys' slots; `held` (slots
        the caller keeps) gets -1 where a block was evicted."""
        absent = slots < 0
        if not absent.any():
            return [], slots[:0]
        new = list(compress(keys, absent.tolist()))
        evict = len(new) - (self.num_blocks - len(self.slot))
        if evict > 0:
            gone = self._evict(evict, slots[~absent]) if evict <= self.num_evictable else None
            if gone is None:
                return None, None
            if held is not None and len(held):
                held[np.isin(held, gone)] = -1
            self.num_evictable -= evict
            self.evictions += evict
        added = slots[absent] = self._insert(new, fold_keys(new) if folded is None else folded[absent])
        self.num_pending += len(new)
        return new, added

    def _insert(self, new: list, folded: np.ndarray) -> np.ndarray:
        n, free = len(new), self.free
        reused = min(n, len(free))
        take = free[len(free) - reused:]
        del free[len(free) - reused:]
        extra = n - reused
        if extra:  # slots never used yet
            take += range(self.top, self.top + extra)
            self.top += extra
            self.key_of.extend(repeat(None, extra))
            if self.top > len(self.ref) - 1:
                self._grow(self.top)
        for s, key in zip(take, new):
            self.key_of[s] = key
        self.slot.update(zip(new, take))
        slots = np.array(take, dtype=np.int64)
        self.ref[slots] = NOT_READY
        self.folded[slots] = folded
        if len(self.recent) + n > max(REINDEX, len(self.slot) // 8):
            self._reindex()
        else:
            self.recent.update(zip(folded.tolist(), take))
        self.stamp[slots] = np.arange(self.clock, self.clock + n)
        self.clock += n
        return slots

    def _grow(self, needed: int) -> None:
        size = min(self.num_blocks, max(needed, 2 * (len(self.ref) - 1)))
        for name, fill in (("ref", ABSENT), ("stamp", -1), ("mark", False), ("folded", 0)):
            old = getattr(self, name)
            arr = np.full(size + 1, fill, dtype=old.dtype)
            arr[:len(old) - 1] = old[:-1]
            setattr(self, name, arr)

    def _evict(self, n: int, protected: np.ndarray) -> Optional[np.ndarray]:
        """Remove the n least recent ready blocks no load reads, other than `protected` (slots), and
        return their slots; None (nothing changed) if there are fewer."""
        mark, ref, stamp = self.mark, self.ref, self.stamp
        mark[protected] = True
        chosen, got, pos, fresh = [], 0, self.head, False
        while got < n:
            if pos >= len(self.queue):
                if fresh:
                    break
                self._snapshot()
                pos, fresh = 0, True
                continue
            window = self.queue[pos:pos + WINDOW]
            ok = (stamp[window] == self.queued[pos:pos + WINDOW]) & (ref[window] == 0) & ~mark[window]
            pick = window[np.flatnonzero(ok)[:n - got]]
            if len(pick):
                mark[pick] = True
                chosen.append(pick)
                got += len(pick)
            pos += WINDOW
        mark[protected] = False
        for pick in chosen:
            mark[pick] = False
        if got < n:
            return None
        slots = np.concatenate(chosen)
        self._drop(slots)
        self._advance()
        return slots

    def _drop(self, slots: np.ndarray) -> None:
        """The blocks in `slots` leave the tier."""
        self.ref[slots] = ABSENT
        self.stamp[slots] = -1
        self.folded[slots] = 0
        gone = slots.tolist()
        deque(map(self.slot.__delitem__, map(self.key_of.__getitem__, gone)), maxlen=0)
        self.free.extend(gone)

    def _snapshot(self) -> None:
        used = np.flatnonzero(self.ref[:self.top] != ABSENT)
        stamps = self.stamp[used]
        order = np.argsort(stamps)
        self.queue, self.queued, self.head = used[order], stamps[order], 0

    def _advance(self) -> None:
        """Move the snapshot's head past entries that have changed (they never come back to the front)."""
        queue, pos = self.queue, self.head
        while pos < len(queue):
            window = queue[pos:pos + WINDOW]
            alive = np.flatnonzero(self.stamp[window] == self.queued[pos:pos + WINDOW])
            if len(alive):
                pos += int(alive[0])
                break
            pos += len(window)
        self.head = pos

    def complete_store(self, keys, slots=None) -> None:
        slots = self.resolve(keys) if slots is None else slots
        slots = slots[self.ref[slots] == NOT_READY]
        self.ref[slots] = 0
        self.num_pending -= len(slots)
        self.num_evictable += len(slots)

    def prepare_load(self, keys, slots=None) -> None:
        slots = self.resolve(keys) if slots is None else slots
        self.num_evictable -= int((self.ref[slots] == 0).sum())
        self.ref[slots] += 1

    def complete_load(self, keys, slots=None) -> None:
        slots = self.resolve(keys) if slots is None else slots
        self.ref[slots] -= 1
        self.num_evictable += int((self.ref[slots] == 0).sum())
