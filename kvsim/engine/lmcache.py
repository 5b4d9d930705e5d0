"""LMCache's vLLM connector (LMCacheConnectorV1, lmcache/integration/vllm/vllm_v1_adapter.py) over its
local CPU backend and, optionally, its local disk backend, as a KVConnector (kvsim.engine.interfaces).

- Chunks: KV is kept in chunks of `chunk_size` tokens (256 by default), named by the chained identity
  of their last GPU block; a prompt's tail short of a chunk is not saved (LMCache discards partial
  chunks), and nothing of the decode is (save_decode_cache off).
- Lookup (`get_num_new_matched_tokens`): the leading chunks of the prompt found in the CPU backend or
  on disk; the tokens past the GPU prefix hits are external (a whole-prompt hit leaves its last token
  to compute). The connector answers synchronously: the tokens count as computed at admission and
  their load is part of the step (`start_load_kv` retrieves them before the forward pass: chunks on
  disk are read into CPU memory first, then every chunk crosses PCIe).
- Store: after the forward pass (`wait_for_save`), every chunk the step completed that the backends
  do not hold is copied to CPU memory, and the step waits for the copy; the local disk backend then
  writes it in the background. Both backends evict least recently used chunks; a chunk read from
  disk is written back to the CPU backend.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from kvsim.engine.block_manager import identities
from kvsim.engine.host_link import host_links
from kvsim.engine.offload import Request, offload_keys
from kvsim.engine.offload_tier import make_tier
from kvsim.engine.prefix_cache import ChainMemo
from kvsim.sequence import Sequence


class LMCacheConnector:
    def __init__(self, settings, scheduler, stats, replica: int = 0):
        self.settings, self.stats, self.replica = settings, stats, replica
        self.chunk = settings.block_size
        self.factor = settings.factor
        self.chunk_bytes = settings.bytes_per_block
        self.memo = ChainMemo(settings.gpu_block_size, identities)
        self.cpu = make_tier(settings.num_blocks, "lru")
        self.h2d, self.d2h = host_links(settings.h2d_gbps, settings.d2h_gbps, settings.duplex_gbps, settings.latency_s)
        disk = settings.disk
        self.disk = make_tier(disk.num_blocks, "lru", name="disk") if disk else None
        self.disk_read, self.disk_write = host_links(disk.read_gbps, disk.write_gbps, 2 * (disk.read_gbps + disk.write_gbps),
                                                     disk.latency_s) if disk else (None, None)
        self.reqs: dict[Sequence, Request] = {}
        self.to_load: list = []  # (request, cpu keys, disk keys) admitted this step
        self.writes: list = []  # heap of (end, order, keys): disk writes in flight
        self.order = 0
        self.clock = 0.0
        self.waiting: deque = deque()
        self.next_event = math.inf

    def _req(self, seq: Sequence) -> Request:
        r = self.reqs.get(seq)
        if r is None:
            self.order += 1
            r = self.reqs[seq] = Request(seq, offload_keys(seq, self.memo, self.factor,
                                                           seq.request.prompt_len // self.chunk), self.order)
        return r

    def _held(self, key) -> bool:
        return self.cpu.ready(key) or (self.disk is not None and self.disk.ready(key))

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int):
        r = self._req(seq)
        r.looked_up = True
        hits = 0
        for key in r.keys:
            if not self._held(key):
                break
            hits += 1
        tokens = hits * self.chunk
        external = tokens - num_computed_tokens - (tokens == seq.num_tokens)
        return (external, False) if external > 0 else (0, False)

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        r = self.reqs[seq]
        if not r.looked_up:
            return
        r.looked_up = False
        local = seq.num_computed_tokens - num_external_tokens  # the scheduler counted the external tokens in
        self.stats.admitted(seq, local, 0, r, self.clock,
                            (self.replica, r.keys, local // self.chunk) if self.stats.record else None)
        if not num_external_tokens:
            r.next_store = max(r.next_store, local // self.chunk)
            return
        first, last = local // self.chunk, -(-(local + num_external_tokens) // self.chunk)
        keys = r.keys[first:last]
        on_disk = [k for k in keys if not self.cpu.ready(k)]
        self.stats.cpu_hit_tokens += num_external_tokens - min(num_external_tokens, len(on_disk) * self.chunk)
        self.stats.disk_hit_tokens += min(num_external_tokens, len(on_disk) * self.chunk)
        r.next_store = max(r.next_store, last)
        self.to_load.append((r, keys, on_disk, num_external_tokens))

    def build_connector_meta(self, batch, start: float, end: float) -> float:
        """Loads before the forward pass, stores after it; returns the seconds the step waits for them."""
        self.clock = start
        t = start
        for r, keys, on_disk, tokens in self.to_load:
            t = self._load(keys, on_disk, tokens, t)
        self.to_load.clear()
        load_s = t - start
        t = end + load_s  # the forward pass ends later by the loads
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            t = self._store(seq, n, t)
        extra = t - end
        self.stats.sync_s += extra
        return extra

    def _load(self, keys: list, on_disk: list, tokens: int, t: float) -> float:
        if on_disk:
            nbytes = len(on_disk) * self.chunk_bytes
            _, t = self.disk_read.transfer(t, nbytes)
            self.stats.promoted(len(on_disk), nbytes, 0.0)
            self.disk.touch(on_disk)
            room = self.cpu.prepare_store(on_disk, gate=False)  # written back to the CPU backend
            if room:
                self.cpu.complete_store(room)
        self.cpu.touch(keys)
        nbytes = -(-tokens // self.settings.gpu_block_size) * (self.chunk_bytes // self.factor)
        s, end = self.h2d.transfer(t, nbytes)
        self.stats.loaded(len(keys), nbytes, end - s, s)
        return end

    def _store(self, seq: Sequence, num_new: int, t: float) -> float:
        r = self.reqs.get(seq) or self._req(seq)
        upto = min(seq.num_computed_tokens + num_new, seq.request.prompt_len) // self.chunk
        if upto <= r.next_store:
            return t
        keys = [k for k in r.keys[r.next_store:upto] if not self._held(k)]
        r.next_store = upto
        keys = self.cpu.prepare_store(keys, gate=False) if keys else keys
        if not keys:
            return t
        self.cpu.complete_store(keys)
        nbytes = len(keys) * self.chunk_bytes
        s, end = self.d2h.transfer(t, nbytes)
        self.stats.stored(len(keys), nbytes, end - s, s)
        if self.disk is not None:
            on_disk = self.disk.prepare_store(keys, gate=False)
            if on_disk:
                _, w = self.disk_write.transfer(end, len(on_disk) * self.chunk_bytes)
                self.order += 1
                heapq.heappush(self.writes, (w, self.order, on_disk))
                self.stats.cascaded(len(on_disk), len(on_disk) * self.chunk_bytes)
        return end

    def get_finished(self, now: float) -> list:
        self.clock = now
        while self.writes and self.writes[0][0] <= now:
            self.disk.complete_store(heapq.heappop(self.writes)[2])
        return []

    def request_finished(self, seq: Sequence) -> bool:
        self.reqs.pop(seq, None)
        return False
