"""Moving a request's prompt KV from a prefill instance to a decode instance, as vLLM v0.11.0's
NixlConnector does (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).

Both sides are KVConnectors (kvsim.engine.interfaces), called by the instance's scheduler where vLLM's
calls its connector (kvsim.engine.connector):

- Prefill side (`NixlProducer`): the prefill request runs with max_tokens = 1 and finishes
  FINISHED_LENGTH_CAPPED; `request_finished` then delays the free of its blocks until the decode side
  has read them (or VLLM_NIXL_ABORT_REQUEST_TIMEOUT passes), so they stay in use, still reachable by
  the instance's prefix cache, until `release`.
- Decode side (`NixlConsumer`, one per decode instance): the request arrives with do_remote_prefill
  (`arrive`). In the scheduler's waiting loop `get_num_new_matched_tokens` counts every prompt token
  the local prefix cache does not hold, but the last, as external, the blocks are allocated
  (`allocate_slots` for them, no tokens scheduled, no budget or sequence slot taken) and the request
  waits in WAITING_FOR_REMOTE_KVS while the workers read the blocks the local cache did not hit
  (`get_unhashed_block_ids`: a decode-side prefix hit is not moved). Once the read is done the
  request's computed tokens are all its prompt but the last, which it computes in its first step,
  emitting its first token (the prefill's token is not used by the decode instance).
- The link (`KvLink`): each transfer's bytes cross the prefill instance's links and the decode
  instance's; a link serves one transfer at a time, in the order they start (`schedule`).

The decode instance admits arrivals (the connector's `waiting`) after the scheduler's own queue, in
order, while the step's token budget has room, fewer than max_num_seqs run and nothing waits before
them (vLLM's waiting queue is one FCFS queue; a request that cannot get blocks stops it).
Differences from vLLM, each small: vLLM allocates the block of the last prompt token with the others,
kvsim when that token is computed (it differs for one prompt length in `block_size`); vLLM caches the
received blocks for prefix hits when the read completes, kvsim when they are allocated; vLLM keeps the
requests waiting for remote KV at the head of its queue and reverses their order on every pass, kvsim
puts each at the head as its KV arrives; the time series' `waiting` counts the arrivals not yet
admitted as vLLM's does not (they wait in the connector, as before issue 28).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kvsim.sequence import Sequence


@dataclass(slots=True, eq=False)
class KvTransfer:
    """One request's trip from a prefill instance to a decode instance. Times in simulated seconds
    (-1.0 until known); `blocks` and `tokens` are what crosses the link (whole blocks)."""

    seq: Sequence  # the decode instance's sequence (the request as the client sent it)
    prefill_seq: Sequence  # the prefill instance's (max_tokens = 1), whose blocks are held until `end`
    src: int  # prefill instance (index in its pool)
    dst: int = -1  # decode instance
    handed_off: float = -1.0  # when the decode instance got the request
    prefill_end: float = -1.0  # when the prefill produced its token
    start: float = -1.0  # when the read began (the decode instance had allocated the blocks)
    data_end: float = -1.0  # when the link had carried its bytes
    end: float = -1.0  # when the decode instance had the whole KV (layer-wise: after the last layer)
    blocks: int = 0
    tokens: int = 0  # prompt tokens moved (the decode instance's cache missed them)
    decode_hit_tokens: int = 0  # prompt tokens the decode instance's prefix cache held: not moved
    link_s: float = 0.0  # the link's seconds for it (overhead, latency and bytes)

    def finish_time(self, num_layers: int) -> float:
        """When the KV is whole on the decode side: the link's end, and at least the prefill's end plus
        the last layer's share of the transfer (layer-wise streaming overlaps the rest)."""
        return max(self.data_end, self.prefill_end + self.link_s / num_layers)


class KvLink:
    """Each prefill instance's egress and each decode instance's ingress links, every one serving one
    transfer at a time in the order transfers start; all figures per GPU (kvsim.perf.disaggregation)."""

    __slots__ = ("spec", "bytes_per_block", "egress", "ingress")

    def __init__(self, spec, link_bytes_per_block: int, num_prefill: int, num_decode: int):
        self.spec, self.bytes_per_block = spec, link_bytes_per_block
        self.egress = [0.0] * num_prefill  # when each link is next free
        self.ingress = [0.0] * num_decode

    def schedule(self, tr: KvTransfer, ready: float) -> None:
        """Start `tr` once it is `ready` and both its links are free; sets start, link_s and data_end."""
        start = max(ready, self.egress[tr.src], self.ingress[tr.dst])
        tr.start = start
        tr.link_s = self.spec.transfer_s(tr.blocks * self.bytes_per_block)
        tr.data_end = self.egress[tr.src] = self.ingress[tr.dst] = start + tr.link_s


class NixlProducer:
    """A prefill instance's KVConnector (the NixlConnector's producer side): the instance serves its
    requests from its own cache; a finished request's blocks stay in use (and in its prefix cache)
    until `release`, when the decode side has read them (vLLM's delayed free). A preempted request's
    are freed at once."""

    __slots__ = ("allocator", "held", "num_held_blocks", "waiting", "next_event")

    def __init__(self, allocator):
        self.allocator = allocator
        self.held: set[Sequence] = set()
        self.num_held_blocks = 0
        self.waiting: deque = deque()  # none: requests reach a prefill instance through its router
        self.next_event = math.inf

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, batch, start: float, end: float) -> float:
        return 0.0

    def get_finished(self, now: float) -> list:
        return []

    def request_finished(self, seq: Sequence) -> bool:
        self.held.add(seq)
        self.num_held_blocks += len(seq.block_table)
        return True

    def release(self, seq: Sequence) -> None:
        """The decode side has read the KV: free the blocks."""
        self.held.remove(seq)
        self.num_held_blocks -= len(seq.block_table)
        self.allocator.deallocate(seq)


class NixlConsumer:
    """A decode instance's KVConnector (the NixlConnector's consumer side): its requests arrive with
    their prompt computed elsewhere (`arrive`, then `waiting` in order); at admission every prompt
    token but the last that the local prefix cache does not hold is external and arrives
    asynchronously (`num_receiving` while the read runs); `arrived` hands the request to the
    scheduler with every prompt token but the last computed."""

    __slots__ = ("scheduler", "waiting", "num_receiving", "started", "transfers", "next_event")

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.waiting: deque[Sequence] = deque()
        self.num_receiving = 0
        self.started: list[KvTransfer] = []  # reads allocated since the simulation last took them
        self.transfers: dict[Sequence, KvTransfer] = {}  # arrived, not yet admitted
        self.next_event = math.inf  # the simulation runs the reads on its link (kvsim.engine.disaggregated)

    @property
    def num_pending(self) -> int:
        return len(self.waiting) + self.num_receiving

    def arrive(self, tr: KvTransfer) -> None:
        self.waiting.append(tr.seq)
        self.transfers[tr.seq] = tr
        self.scheduler.add_remote(tr.seq)

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        if seq not in self.transfers:  # a request of this instance's own queue (preempted: recomputed here)
            return 0, False
        return seq.num_tokens - 1 - num_computed_tokens, True  # the last prompt token is computed here

    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None:
        tr = self.transfers.pop(seq, None)
        if tr is None:
            return
        hit_tokens = seq.num_computed_tokens  # the decode cache's prefix hits are not moved
        tr.decode_hit_tokens, tr.tokens = hit_tokens, seq.num_tokens - hit_tokens
        tr.blocks = self.scheduler.allocator.blocks_for(seq.num_tokens) - hit_tokens // self.scheduler.allocator.block_size
        seq.num_cached_tokens -= hit_tokens  # counted by the transfer: the request's hits are its prefill's
        self.num_receiving += 1
        self.started.append(tr)

    def take_started(self) -> list[KvTransfer]:
        started, self.started = self.started, []
        return started

    def build_connector_meta(self, batch, start: float, end: float) -> float:
        return 0.0

    def get_finished(self, now: float) -> list:
        return []

    def request_finished(self, seq: Sequence) -> bool:
        return False

    def arrived(self, tr: KvTransfer) -> None:
        """The read is done: every prompt token but the last is computed; the scheduler takes it over."""
        seq = tr.seq
        seq.num_computed_tokens = seq.num_tokens - 1
        self.num_receiving -= 1
        self.scheduler.add_ready(seq)


def stalled(scheduler, allocator) -> bool:
    """Nothing runs and the request at the head of the queue (swapped first) cannot get its blocks:
    the engine can only wait for blocks that another instance's progress frees (a prefill instance's
    held blocks, a decode instance's reads in flight)."""
    if scheduler.num_running:
        return False
    if scheduler.swapped:
        seq, hits = scheduler.swapped[0], ()
    elif scheduler.waiting:
        seq = scheduler.waiting[0]
        hits = allocator.get_computed_blocks(seq) if seq.num_computed_tokens == 0 else ()
    else:
        return False
    num_new = seq.num_tokens - seq.num_computed_tokens - len(hits) * allocator.block_size
    return not allocator.can_allocate(seq, min(num_new, scheduler.max_num_batched_tokens), hits)
