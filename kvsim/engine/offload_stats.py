"""What a policy's offload tiers did, counted as the connectors work (every replica into one record):
admissions and their hits per tier, blocks and bytes moved per direction and the seconds the links
spent, evictions, and the same per time-series interval. With `record` on, each admission's lookup
(the offloaded blocks past its GPU prefix hits) is kept as dense key ids for the optimal bound
(kvsim.engine.belady)."""

from __future__ import annotations

import numpy as np

from kvsim.engine.lru_tier import fold_keys


# per interval: cpu hit tokens, disk hit tokens, loaded bytes, stored bytes, load seconds, store seconds
BUCKET_FIELDS = ("cpu_hit_tokens", "disk_hit_tokens", "loaded_bytes", "stored_bytes", "load_s", "store_s")


class OffloadStats:
    def __init__(self, interval: float, record: bool = False):
        self.interval = interval
        self.admissions = self.prompt_tokens = self.gpu_hit_tokens = 0
        self.cpu_hit_tokens = self.disk_hit_tokens = 0
        self.loads = self.loaded_blocks = self.loaded_bytes = 0
        self.load_s = 0.0
        self.stores = self.stored_blocks = self.stored_bytes = 0
        self.store_s = 0.0
        self.promotions = self.promoted_blocks = self.promoted_bytes = 0
        self.promote_s = 0.0
        self.cascaded_blocks = self.cascaded_bytes = 0
        self.deferred = 0  # admissions skipped a step: a hit block being loaded or promoted
        self.store_failures = 0  # store attempts with no room in the CPU tier (retried)
        self.sync_s = 0.0  # seconds synchronous connectors added to steps (LMCache)
        self.buckets: dict[int, list] = {}
        self.record = record
        self.refs: list = []  # per admission: (replica, its prompt's offloaded block keys (uint64), GPU-hit blocks)

    def _bucket(self, t: float, field: int, value: float) -> None:
        slot = self.buckets.get(b := int(t // self.interval))
        if slot is None:
            slot = self.buckets[b] = [0.0] * len(BUCKET_FIELDS)
        slot[field] += value

    def admitted(self, seq, local: int, external: int, r, now: float = 0.0, lookup=None) -> None:
        """`lookup`: (replica, keys, blocks the GPU held) when recording."""
        """An admission: its prompt, GPU hits and external tokens (the disk's share: `r.disk_tokens`)."""
        self.admissions += 1
        self.prompt_tokens += seq.num_tokens
        self.gpu_hit_tokens += local
        if external:
            disk = min(r.disk_tokens, external)
            r.disk_tokens = 0
            self.disk_hit_tokens += disk
            self.cpu_hit_tokens += external - disk
            self._bucket(now, 0, external - disk)
            if disk:
                self._bucket(now, 1, disk)
        if lookup is not None:
            replica, keys, held = lookup
            self.refs.append((replica, keys if isinstance(keys, np.ndarray) else fold_keys(keys), held))

    def loaded(self, blocks: int, nbytes: int, seconds: float, t: float) -> None:
        self.loads += 1
        self.loaded_blocks += blocks
        self.loaded_bytes += nbytes
        self.load_s += seconds
        self._bucket(t, 2, nbytes)
        self._bucket(t, 4, seconds)

    def stored(self, blocks: int, nbytes: int, seconds: float, t: float) -> None:
        self.stores += 1
        self.stored_blocks += blocks
        self.stored_bytes += nbytes
        self.store_s += seconds
        self._bucket(t, 3, nbytes)
        self._bucket(t, 5, seconds)

    def promoted(self, blocks: int, nbytes: int, seconds: float) -> None:
        self.promotions += 1
        self.promoted_blocks += blocks
        self.promoted_bytes += nbytes
        self.promote_s += seconds

    def cascaded(self, blocks: int, nbytes: int) -> None:
        self.cascaded_blocks += blocks
        self.cascaded_bytes += nbytes
