"""One offload tier's blocks as vLLM v0.26.0's CPUOffloadingManager keeps them
(vllm/v1/kv_offload/cpu/manager.py, cpu/policies/lru.py and arc.py).

A tier holds up to `num_blocks` offloaded blocks, each named by a key (the chained identity of its
last GPU block: kvsim.engine.offload). A block's `ref` is -1 while its store is in flight (not
ready: it can be neither loaded nor evicted), 0 when ready and evictable, and the number of loads
reading it otherwise. The manager's operations:

- `lookup(keys)`: how many leading keys are ready in the tier; with `store_threshold` >= 2 every key
  looked up is counted first in an LRU tracker of `max_tracker_size` keys (vLLM's reuse gating);
- `touch(keys)`: the policy's recency update, last key first (so the prefix is the most recent);
- `prepare_store(keys)`: the keys to store: those counted `store_threshold` times (when gating),
  not in the tier already; room is made by evicting ready blocks not among `keys`, as the policy
  orders them; None when it cannot (nothing is changed), else they enter the tier not ready;
- `complete_store(keys)`, `prepare_load(keys)`, `complete_load(keys)`.

Policies: `LRUPolicy` (one ordered dict, least recent first; kvsim.engine.lru_tier keeps the same in numpy
arrays, the oracle tier's base) and `ARCPolicy` (vLLM's ARC: T1 for
blocks touched once, T2 for those touched again, ghost lists B1/B2 that move the target size of T1;
new blocks enter T1; eviction takes from T1 while it is at least its target, else from T2, skipping
blocks in use). kvsim.engine.tier_reference holds plain executable specifications of both, which
the tests drive against these (Hypothesis).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import islice, repeat
from operator import add
from typing import Optional

from kvsim.engine.lru_tier import LRUTier, count_lookups

NOT_READY = -1


class LRUPolicy:
    """Least recently used: `blocks` key -> ref, least recent first."""

    __slots__ = ("blocks",)

    def __init__(self, capacity: int):
        self.blocks: OrderedDict = OrderedDict()

    def get(self, key) -> Optional[int]:
        return self.blocks.get(key)

    def set_ref(self, key, ref: int) -> None:
        self.blocks[key] = ref  # an existing key keeps its place

    def insert(self, key, ref: int) -> None:
        self.blocks[key] = ref

    def remove(self, key) -> None:
        del self.blocks[key]

    def refs(self, keys, missing: int) -> list:
        return list(map(self.blocks.get, keys, repeat(missing)))

    def set_refs(self, keys, refs) -> None:
        self.blocks.update(zip(keys, refs))  # existing keys keep their places

    def touch(self, keys) -> None:
        blocks = self.blocks  # C-level loops: a prompt's hundreds of keys at every lookup
        try:  # usually all are here; a key that is not ends it, and the rest is redone as the same order
            deque(map(blocks.move_to_end, reversed(keys)), maxlen=0)
        except KeyError:
            deque(map(blocks.move_to_end, filter(blocks.__contains__, reversed(keys))), maxlen=0)

    def evict(self, n: int, protected) -> Optional[list]:
        """The n least recent evictable blocks, removed (None, nothing removed: fewer than n)."""
        blocks = self.blocks
        head = list(islice(blocks, n))  # usually the n least recent are all evictable: C-level checks
        if len(head) == n and list(map(blocks.get, head)).count(0) == n and protected.isdisjoint(head):
            deque(map(blocks.pop, head), maxlen=0)
            return head
        out = []
        for key, ref in self.blocks.items():
            if ref == 0 and key not in protected:
                out.append(key)
                if len(out) == n:
                    break
        if len(out) < n:
            return None
        for key in out:
            del self.blocks[key]
        return out

    def keys(self) -> list:
        return list(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)


class ARCPolicy:
    """vLLM's ARCCachePolicy: see the module docstring."""

    __slots__ = ("capacity", "target_t1", "t1", "t2", "b1", "b2")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()

    def get(self, key) -> Optional[int]:
        ref = self.t1.get(key)
        return self.t2.get(key) if ref is None else ref

    def set_ref(self, key, ref: int) -> None:
        (self.t1 if key in self.t1 else self.t2)[key] = ref

    def refs(self, keys, missing: int) -> list:
        get = self.get
        return [missing if (ref := get(key)) is None else ref for key in keys]

    def set_refs(self, keys, refs) -> None:
        for key, ref in zip(keys, refs):
            self.set_ref(key, ref)

    def keys(self) -> list:
        return [*self.t1, *self.t2]

    def insert(self, key, ref: int) -> None:
        self.t1[key] = ref
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def touch(self, keys) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for key in reversed(keys):
            if key in t1:
                ref = t1.pop(key)
                if ref == NOT_READY:  # just prepared to be stored, not touched twice: stays in T1, most recent
                    t1[key] = ref
                else:
                    t2[key] = ref
            elif key in t2:
                t2.move_to_end(key)
            elif key in b1:
                self.target_t1 = min(self.target_t1 + max(1, len(b2) / len(b1)), self.capacity)
                b1.move_to_end(key)
            elif key in b2:
                self.target_t1 = max(self.target_t1 - max(1, len(b1) / len(b2)), 0)
                b2.move_to_end(key)

    def evict(self, n: int, protected) -> Optional[list]:
        """n evictable blocks in ARC's order, removed and remembered in the ghost lists (None: fewer)."""
        if n == 0:
            return []
        chosen, virtual_t1 = [], len(self.t1)
        t1_iter, t2_iter = iter(self.t1.items()), iter(self.t2.items())
        while len(chosen) < n:
            key = None
            if virtual_t1 >= int(self.target_t1):
                key = _next_free(t1_iter, protected)
                if key is not None:
                    chosen.append((key, True))
                    virtual_t1 -= 1
            if key is None:
                key = _next_free(t2_iter, protected)
                if key is None:
                    return None
                chosen.append((key, False))
        for key, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return [key for key, _ in chosen]

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)


def _next_free(entries, protected):
    for key, ref in entries:
        if ref == 0 and key not in protected:
            return key
    return None


POLICIES = {"lru": LRUPolicy, "arc": ARCPolicy}


def make_tier(num_blocks: int, eviction_policy: str = "lru", store_threshold: int = 0, max_tracker_size: int = 64_000,
              name: str = "cpu", arrays: bool = False):
    """A tier of `num_blocks` blocks with `eviction_policy`; `arrays`: LRU in numpy arrays
    (kvsim.engine.lru_tier: fewer operations per key, more per call; the oracle tier's base)."""
    if arrays and eviction_policy == "lru":
        return LRUTier(num_blocks, store_threshold, max_tracker_size, name)
    return OffloadTier(num_blocks, eviction_policy, store_threshold, max_tracker_size, name)


class OffloadTier:
    """One tier's blocks under an ordered-dict policy (LRU or ARC; see the module docstring); `evictions`
    counts the blocks it evicted."""

    __slots__ = ("num_blocks", "policy", "store_threshold", "max_tracker_size", "counts", "num_evictable",
                 "num_pending", "evictions", "name", "lru")

    def __init__(self, num_blocks: int, eviction_policy: str = "lru", store_threshold: int = 0,
                 max_tracker_size: int = 64_000, name: str = "cpu"):
        self.num_blocks, self.name = num_blocks, name
        self.policy = POLICIES[eviction_policy](num_blocks)
        self.store_threshold, self.max_tracker_size = store_threshold, max_tracker_size
        self.counts: Optional[OrderedDict] = OrderedDict() if store_threshold >= 2 else None
        self.num_evictable = 0  # ready blocks no load reads
        self.num_pending = 0  # blocks whose store is in flight
        self.evictions = 0
        self.lru = self.policy.blocks if eviction_policy == "lru" else None  # LRU's dict: C-level bulk updates

    def __len__(self) -> int:
        return len(self.policy)

    def __contains__(self, key) -> bool:
        return self.policy.get(key) is not None

    def ref_of(self, key) -> Optional[int]:
        return self.policy.get(key)

    def ready(self, key) -> bool:
        ref = self.policy.get(key)
        return ref is not None and ref >= 0

    def keys(self) -> list:
        """The blocks held, in the policy's order (ARC: T1 then T2, least recent first)."""
        return self.policy.keys()

    def resolve(self, keys, folded=None, known=None) -> None:
        """No slots here (kvsim.engine.lru_tier's `resolve`): every operation's `slots` is ignored."""
        return None

    def lookup(self, keys, slots=None) -> int:
        """How many leading `keys` are ready here (each key counted first when store gating is on)."""
        if self.counts is not None:
            count_lookups(self.counts, keys, self.max_tracker_size)
        refs = self.policy.refs(keys, NOT_READY)  # missing or not ready: -1, the first ends the hits
        return refs.index(NOT_READY) if NOT_READY in refs else len(refs)

    def in_use(self, keys, slots=None) -> bool:
        """Whether a load reads any of `keys`."""
        return max(self.policy.refs(keys, 0), default=0) > 0

    def touch(self, keys, slots=None) -> None:
        self.policy.touch(keys)

    def prepare_store_at(self, keys, slots=None, held=None, folded=None) -> tuple:
        """prepare_store without gating, as kvsim.engine.lru_tier's (no slots here)."""
        return self.prepare_store(keys, gate=False), None

    def prepare_store(self, keys, gate: bool = True) -> Optional[list]:
        """The keys to store now, entered not ready (None: no room can be made; nothing changed).
        `gate` False: no reuse gating (a promotion from a lower tier, a cascade into one)."""
        if gate and self.counts is not None:
            counts, threshold = self.counts, self.store_threshold
            keys = [k for k in keys if counts.get(k, 0) >= threshold]
        if self.lru is not None:
            new = list(filter(self.lru.__contains__, keys))
            new = [k for k in keys if k not in self.lru] if new else list(keys)
        else:
            get = self.policy.get
            new = [k for k in keys if get(k) is None]
        if not new:
            return new
        evict = len(new) - (self.num_blocks - len(self.policy))
        if evict > 0:
            if evict > self.num_evictable:
                return None
            evicted = self.policy.evict(evict, set(keys))
            if evicted is None:
                return None
            self.num_evictable -= len(evicted)
            self.evictions += len(evicted)
        if self.lru is not None:
            self.lru.update(dict.fromkeys(new, NOT_READY))
        else:
            insert = self.policy.insert
            for key in new:
                insert(key, NOT_READY)
        self.num_pending += len(new)
        return new

    def complete_store(self, keys, slots=None) -> None:
        lru = self.lru
        if lru is not None and list(map(lru.get, keys)).count(NOT_READY) == len(keys):  # one store's keys, usually
            lru.update(dict.fromkeys(keys, 0))
            self.num_pending -= len(keys)
            self.num_evictable += len(keys)
            return
        get, set_ref = self.policy.get, self.policy.set_ref
        for key in keys:
            if get(key) == NOT_READY:
                set_ref(key, 0)
                self.num_pending -= 1
                self.num_evictable += 1

    def prepare_load(self, keys, slots=None) -> None:
        refs = self.policy.refs(keys, None)
        self.num_evictable -= refs.count(0)
        self.policy.set_refs(keys, map(add, refs, repeat(1)))

    def complete_load(self, keys, slots=None) -> None:
        refs = list(map(add, self.policy.refs(keys, None), repeat(-1)))
        self.policy.set_refs(keys, refs)
        self.num_evictable += refs.count(0)
