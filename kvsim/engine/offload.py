"""vLLM's native KV offload (the OffloadingConnector with its CPU tier and, through its TieringOffloadingSpec,
a disk tier behind it), as a KVConnector (kvsim.engine.interfaces), mirroring vLLM v0.26.0's
OffloadingConnectorScheduler (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py).

- Blocks: an offloaded block is `factor` GPU blocks, named by the chained identity of its last GPU
  block (shareable content: the prefix cache's identities; content unique to a request: the request
  and the position, so only its own recomputation after a preemption can hit it). Only prompt
  blocks are stored (vLLM's offload_prompt_only, on by default since #43797).
- Admission (`get_num_new_matched_tokens`): every offloaded block of the prompt is touched; past the
  GPU prefix hits, the leading blocks ready in the CPU tier are loaded asynchronously if they come
  to at least one offloaded block; a request some of whose hit blocks another request is loading
  is skipped this step (vLLM's `_blocks_being_loaded`). With a disk tier, blocks that follow the
  CPU hits on disk are promoted into the CPU tier (read at the disk's rate) and the request is
  skipped (vLLM's lookup returns None: retry later) at every step until they are in.
- Loads start at the step in which the request was admitted (host to device, FIFO); the request
  comes back to the head of the queue at the first step boundary after its load ends, its loaded
  tokens computed (all but the last prompt token at most).
- Stores: after each step, the prompt blocks it completed that are not stored yet are prepared
  (`OffloadTier.prepare_store`: gating, eviction; none if no room: retried next step) and copied
  device to host from the step's end; a block becomes loadable when its copy ends. A request that
  finishes with stores in flight keeps its GPU blocks until they end (vLLM's delayed free). With a
  disk tier every stored block is then written to disk too (vLLM's tiering cascades every store).

Everything is counted into an `OffloadStats` (kvsim.engine.offload_stats), per tier and over time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from kvsim.engine.block_manager import identities
from kvsim.engine.host_link import host_links
from kvsim.engine.lru_tier import fold_keys
from kvsim.engine.offload_tier import make_tier
from kvsim.engine.prefix_cache import ChainMemo, sequence_chain
from kvsim.sequence import Sequence

UNIQUE = 1 << 70  # keys of content unique to a request: above every 64-bit identity


class Request:
    """One sequence's offload state."""

    __slots__ = ("seq", "keys", "next_store", "stores", "finished", "order", "ready_tokens", "disk_tokens",
                 "looked_up", "slots", "folded")

    def __init__(self, seq: Sequence, keys: list, order: int):
        self.seq, self.keys, self.order = seq, keys, order
        self.next_store = 0  # the next offloaded block to store
        self.stores = 0  # stores in flight
        self.finished = False
        self.ready_tokens = 0  # computed tokens once its load ends
        self.disk_tokens = 0  # tokens its pending hits owe to the disk tier
        self.looked_up = False  # asked at an admission (not yet allocated)
        self.slots = None  # its keys' slots in the CPU tier as last found (an array tier: kvsim.engine.lru_tier)
        self.folded = None  # its keys as uint64 (fold_keys), when asked: `fold()`

    def fold(self):
        if self.folded is None:
            self.folded = fold_keys(self.keys)
        return self.folded


def offload_keys(seq: Sequence, memo: ChainMemo, factor: int, num_blocks: int) -> list:
    """The keys of the sequence's first `num_blocks` offloaded blocks."""
    ids = seq.request.token_ids
    chain = sequence_chain(seq, memo) if ids is not None else ()
    share = min(num_blocks, len(chain) // factor)
    keys = chain[factor - 1:share * factor:factor].tolist() if share else []
    if share < num_blocks:
        base = UNIQUE | seq.request.request_id << 32
        keys += [base | ((j + 1) * factor - 1) for j in range(share, num_blocks)]
    return keys


def _part(slots, start: int, end: int):
    """slots[start:end] (None: a tier without slots)."""
    return None if slots is None else slots[start:end]


class OffloadingConnector:
    """One replica's native offload connector: settings (kvsim.perf.offload.OffloadSettings), the
    replica's scheduler, and the policy's OffloadStats."""

    def __init__(self, settings, scheduler, stats, replica: int = 0):
        self.settings, self.allocator, self.stats, self.replica = settings, scheduler.allocator, stats, replica
        self.block_size = settings.block_size
        self.factor = settings.factor
        self.block_bytes = settings.bytes_per_block
        self.memo = ChainMemo(settings.gpu_block_size, identities)
        self.cpu = make_tier(settings.num_blocks, settings.eviction_policy, settings.store_threshold,
                               settings.max_tracker_size)
        self.h2d, self.d2h = host_links(settings.h2d_gbps, settings.d2h_gbps, settings.duplex_gbps, settings.latency_s)
        disk = settings.disk
        self.disk = make_tier(disk.num_blocks, "lru", name="disk") if disk else None
        self.disk_read, self.disk_write = host_links(disk.read_gbps, disk.write_gbps, 2 * (disk.read_gbps + disk.write_gbps),
                                                     disk.latency_s) if disk else (None, None)
        self.reqs: dict[Sequence, Request] = {}
        self.loads: list = []  # heap of (end, order, request, keys)
        self.stores: list = []  # heap of (end, order, request, keys)
        self.promotions: list = []  # heap of (end, order, keys)
        self.cascades: list = []  # heap of (end, order, keys): disk writes
        # vLLM tracks blocks being loaded only with GPU prefix caching on (they become GPU hits after the load)
        self.defer_loading = getattr(scheduler.allocator, "enable_prefix_caching", True)
        self.num_held = 0  # finished requests whose blocks wait for their stores
        self.order = 0
        self.admissions = 0  # admitted requests (the oracle tier's clock: kvsim.engine.belady_tier)
        self.clock = 0.0
        self.waiting: deque = deque()
        self.next_event = math.inf
        self.reserve_prompt = True  # loads admitted only with room for their whole prompt (kvsim.engine.connector)
        self.arrays = False  # the CPU tier keeps slots (kvsim.engine.lru_tier: the oracle's, set by its maker)

    # ---- admission ------------------------------------------------------------------------------
    def _req(self, seq: Sequence) -> Request:
        r = self.reqs.get(seq)
        if r is None:
            self.order += 1
            r = self.reqs[seq] = Request(seq, offload_keys(seq, self.memo, self.factor,
                                                           seq.request.prompt_len // self.block_size), self.order)
        return r

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int):
        r, obs = self._req(seq), self.block_size
        keys, cpu = r.keys, self.cpu
        r.looked_up = True
        slots = r.slots = cpu.resolve(keys, r.fold(), r.slots) if self.arrays else None  # valid until allocated
        cpu.touch(keys, slots)
        if len(keys) * obs - num_computed_tokens < obs:
            return 0, False
        start = num_computed_tokens // obs
        held = -(-num_computed_tokens // obs)
        if self.loads and self.defer_loading and cpu.in_use(keys[:held], _part(slots, 0, held)):
            self.stats.deferred += 1
            return None, False
        tail = keys[start:]
        hits = cpu.lookup(tail, _part(slots, start, len(keys)))
        if self.disk is not None and self._promote(r, tail[hits:]):
            self.stats.deferred += 1
            return None, False
        tokens = (start + hits) * obs - num_computed_tokens
        if not hits or tokens < obs:
            return 0, False
        if self.loads and self.defer_loading and cpu.in_use(tail[:hits], _part(slots, start, start + hits)):
            self.stats.deferred += 1
            return None, False
        return tokens, True

    def _promote(self, r: Request, keys: list) -> bool:
        """Blocks after the CPU hits that are on disk: read into the CPU tier; True while any is on its way."""
        disk, n = self.disk, 0
        for key in keys:
            if not disk.ready(key):
                break
            n += 1
        if not n:
            return False
        keys = keys[:n]
        if any(not self.cpu.ready(k) and k in self.cpu for k in keys):
            return True  # a promotion (or store) of them is in flight
        room = self.cpu.prepare_store(keys, gate=False)
        if not room:
            return False
        disk.prepare_load(room)
        nbytes = len(room) * self.block_bytes
        _, end = self.disk_read.transfer(self.clock, nbytes)
        self.order += 1
        heapq.heappush(self.promotions, (end, self.order, room))
        self.stats.promoted(len(room), nbytes, end - self.clock)
        r.disk_tokens += len(room) * self.block_size
        self._next()
        return True

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        r, obs = self.reqs[seq], self.block_size
        if not r.looked_up:  # back after its load: admitted already
            return
        r.looked_up = False
        self.admissions += 1
        local = seq.num_computed_tokens
        self.stats.admitted(seq, local, num_external_tokens, r, self.clock,
                            (self.replica, r.fold(), local // obs) if self.stats.record else None)
        if not num_external_tokens:
            return
        first, last = local // obs, (local + num_external_tokens) // obs
        keys, slots = r.keys[first:last], _part(r.slots, first, last)
        self.cpu.prepare_load(keys, slots)  # a block being loaded is one a load reads (vLLM's _blocks_being_loaded)
        r.ready_tokens = min(local + num_external_tokens, seq.num_tokens - 1)
        r.next_store = max(r.next_store, last)
        gpu_blocks = num_external_tokens // self.settings.gpu_block_size
        nbytes = gpu_blocks * (self.block_bytes // self.factor)
        start = self.clock  # the step being scheduled starts now (get_finished set the clock)
        _, t = self.h2d.transfer(start, nbytes)
        heapq.heappush(self.loads, (t, r.order, r, keys, slots))
        self.stats.loaded(len(keys), nbytes, t - start, start)
        self._next()

    # ---- steps ------------------------------------------------------------------------------------
    def build_connector_meta(self, batch, start: float, end: float) -> float:
        """Issue the stores of the blocks the step completes, from its end (its loads were issued at admission)."""
        self.clock = start
        reqs = self.reqs
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            r = reqs.get(seq)
            if r is None or r.next_store < len(r.keys):  # (a decoding request has stored its prompt: skipped)
                self._store(seq, n, end)
        self._next()
        return 0.0

    def _store(self, seq: Sequence, num_new: int, end: float) -> None:
        r = self.reqs.get(seq) or self._req(seq)
        upto = min(seq.num_computed_tokens + num_new, seq.request.prompt_len) // self.block_size
        if upto <= r.next_store:
            return
        cpu, nxt = self.cpu, r.next_store
        if self.arrays and cpu.counts is None:  # no gating: the prompt's slots serve the store and the touch
            folded = r.fold()[:upto]
            prefix = cpu.resolve(r.keys[:upto], folded, _part(r.slots, 0, upto))
            keys, slots = cpu.prepare_store_at(r.keys[nxt:upto], _part(prefix, nxt, upto), _part(prefix, 0, nxt),
                                               folded[nxt:upto])
        else:
            prefix, keys = None, cpu.prepare_store(r.keys[nxt:upto])
            slots = None if keys is None else cpu.resolve(keys)
        if keys is None:  # no room: retried after the next step
            self.stats.store_failures += 1
            return
        r.next_store = upto
        if not keys:
            return
        cpu.touch(r.keys[:upto], prefix)
        nbytes = len(keys) * self.block_bytes
        _, t = self.d2h.transfer(end, nbytes)
        self.order += 1
        heapq.heappush(self.stores, (t, self.order, r, keys, slots))
        r.stores += 1
        self.stats.stored(len(keys), nbytes, t - end, end)

    def get_finished(self, now: float) -> list:
        """Loads, stores, promotions and disk writes that ended by `now`; the requests whose KV is in."""
        self.clock = now
        ready = []
        loads = self.loads
        while loads and loads[0][0] <= now:
            _, _, r, keys, slots = heapq.heappop(loads)
            self.cpu.complete_load(keys, slots)
            r.seq.num_computed_tokens = r.ready_tokens
            ready.append(r)
        if self.stores and self.stores[0][0] <= now:
            self._stores_done(now)
        if self.promotions and self.promotions[0][0] <= now:
            self._promotions_done(now)
        if self.cascades and self.cascades[0][0] <= now:
            while self.cascades and self.cascades[0][0] <= now:
                self.disk.complete_store(heapq.heappop(self.cascades)[2])
        self._next()
        if len(ready) > 1:
            ready.sort(key=lambda r: r.order)
        return [r.seq for r in ready]

    def _stores_done(self, now: float) -> None:
        stores, cpu = self.stores, self.cpu
        while stores and stores[0][0] <= now:
            t, _, r, keys, slots = heapq.heappop(stores)
            cpu.complete_store(keys, slots)
            r.stores -= 1
            if r.finished and not r.stores:
                self.allocator.deallocate(r.seq)
                self.num_held -= 1
            if self.disk is not None:
                self._cascade(keys, t)

    def _cascade(self, keys: list, t: float) -> None:
        """Every block stored to the CPU tier is written to disk too (vLLM's tiering cascade)."""
        keys = self.disk.prepare_store(keys, gate=False)
        if keys:
            nbytes = len(keys) * self.block_bytes
            _, end = self.disk_write.transfer(t, nbytes)
            self.order += 1
            heapq.heappush(self.cascades, (end, self.order, keys))
            self.stats.cascaded(len(keys), nbytes)

    def _promotions_done(self, now: float) -> None:
        while self.promotions and self.promotions[0][0] <= now:
            keys = heapq.heappop(self.promotions)[2]
            self.cpu.complete_store(keys)
            self.disk.complete_load(keys)

    def _next(self) -> None:
        nxt = math.inf
        for heap in (self.loads, self.promotions):
            if heap and heap[0][0] < nxt:
                nxt = heap[0][0]
        if self.num_held and self.stores and self.stores[0][0] < nxt:
            nxt = self.stores[0][0]
        self.next_event = nxt

    def request_finished(self, seq: Sequence) -> bool:
        r = self.reqs.pop(seq, None)
        if r is None or not r.stores:
            return False
        r.finished = True
        self.num_held += 1
        self._next()
        return True
