"""Executable specifications of vLLM v0.26.0's offload tier (cpu/manager.py with its LRU and ARC cache
policies), written plainly: Python lists in recency order, every operation a scan. The tests drive
these and kvsim.engine.offload_tier.OffloadTier with the same operations (Hypothesis) and compare
every answer and the tier's contents."""

from __future__ import annotations

from typing import Optional


class ReferenceTier:
    """A tier of `capacity` blocks; `policy` "lru" or "arc". Entries are [key, ref] lists (ref -1: store
    in flight, 0: ready, n > 0: n loads)."""

    def __init__(self, capacity: int, policy: str = "lru", store_threshold: int = 0, max_tracker_size: int = 64_000):
        self.capacity, self.policy = capacity, policy
        self.t1: list[list] = []  # LRU: the only list; ARC: blocks touched once
        self.t2: list[list] = []  # ARC: touched again
        self.b1: list = []
        self.b2: list = []
        self.target = 0.0
        self.threshold, self.tracker_size = store_threshold, max_tracker_size
        self.counts: list[list] = []  # [key, count], least recent first

    # ---- lookups
    def _find(self, key) -> Optional[list]:
        for entry in self.t1 + self.t2:
            if entry[0] == key:
                return entry
        return None

    def keys(self) -> list:
        return [e[0] for e in self.t1] + [e[0] for e in self.t2]

    def lookup(self, keys) -> int:
        if self.threshold >= 2:
            for key in keys:
                found = [c for c in self.counts if c[0] == key]
                if found:
                    self.counts.remove(found[0])
                    self.counts.append([key, found[0][1] + 1])
                else:
                    if len(self.counts) >= self.tracker_size:
                        self.counts.pop(0)
                    self.counts.append([key, 1])
        n = 0
        for key in keys:
            e = self._find(key)
            if e is None or e[1] < 0:
                break
            n += 1
        return n

    def touch(self, keys) -> None:
        for key in list(keys)[::-1]:
            e1 = [e for e in self.t1 if e[0] == key]
            e2 = [e for e in self.t2 if e[0] == key]
            if e1:
                self.t1.remove(e1[0])
                if self.policy == "lru" or e1[0][1] == -1:
                    self.t1.append(e1[0])
                else:
                    self.t2.append(e1[0])
            elif e2:
                self.t2.remove(e2[0])
                self.t2.append(e2[0])
            elif self.policy == "arc" and key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.remove(key)
                self.b1.append(key)
            elif self.policy == "arc" and key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.remove(key)
                self.b2.append(key)

    # ---- stores and loads
    def _victims(self, n: int, protected: set) -> Optional[list]:
        free = [e for e in self.t1 if e[1] == 0 and e[0] not in protected]
        if self.policy == "lru":
            return [(e, True) for e in free[:n]] if len(free) >= n else None
        free2 = [e for e in self.t2 if e[1] == 0 and e[0] not in protected]
        out, size = [], len(self.t1)
        while len(out) < n:
            if size >= int(self.target) and free:
                out.append((free.pop(0), True))
                size -= 1
            elif free2:
                out.append((free2.pop(0), False))
            else:
                return None
        return out

    def prepare_store(self, keys, gate: bool = True) -> Optional[list]:
        keys = list(keys)
        if gate and self.threshold >= 2:
            counts = {k: c for k, c in self.counts}
            keys = [k for k in keys if counts.get(k, 0) >= self.threshold]
        new = [k for k in keys if self._find(k) is None]
        if not new:
            return new
        over = len(new) - (self.capacity - len(self.t1) - len(self.t2))
        if over > 0:
            victims = self._victims(over, set(keys))
            if victims is None:
                return None
            for e, from_t1 in victims:
                (self.t1 if from_t1 else self.t2).remove(e)
                if self.policy == "arc":
                    (self.b1 if from_t1 else self.b2).append(e[0])
            for ghost in (self.b1, self.b2):
                del ghost[:max(0, len(ghost) - self.capacity)]
        for key in new:
            if self.policy == "arc":
                self.b1[:] = [k for k in self.b1 if k != key]
                self.b2[:] = [k for k in self.b2 if k != key]
            self.t1.append([key, -1])
        return new

    def complete_store(self, keys) -> None:
        for key in keys:
            e = self._find(key)
            if e is not None and e[1] == -1:
                e[1] = 0

    def prepare_load(self, keys) -> None:
        for key in keys:
            self._find(key)[1] += 1

    def complete_load(self, keys) -> None:
        for key in keys:
            self._find(key)[1] -= 1
