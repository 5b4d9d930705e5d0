"""The engine's boundaries: the interfaces its parts meet at, and who implements them.

Each is a `typing.Protocol`, so an implementation needs no base class; a new allocator, backend,
observer or arrival source is a new class satisfying one of these, not a new branch in the engine.

| Protocol | what it is | implementers |
| --- | --- | --- |
| `KVAllocator` | KV-cache blocks of one replica | `block_manager.BlockManager` (paged, prefix caching), `contiguous.ContiguousAllocator`, `reference_pool.ReferencePool` (the plain specification), `kv_transfer.HeldBlocks` (a prefill instance's: finished requests' blocks held until their KV has left) |
| `Backend` | prices (or runs) engine steps | `kvsim.backends.analytic.AnalyticBackend`, `kvsim.backends.triton_engine.backend.TritonBackend` |
| `EngineObserver` | is told what each step did | `kvsim.results.metrics.Metrics` |
| `ArrivalSource` | releases requests, is told when they end | `arrivals.RequestStream` (open loop), `arrivals.ClosedLoop` (a `ClosedLoopSource`) |
| `Router` | picks a replica for each request | `router.LeastLoaded`, `router.RoundRobin`, `router.PrefixAffinity`, `router.MostFreeBlocks` |
| `TransferObserver` | is told of each KV transfer of a disaggregated deployment | `kvsim.results.disaggregation.DisaggregationObserver` |
| `Autoscaler` | decides an autoscaled pool's replica count | `autoscalers.FixedPool`, `HpaAutoscaler`, `KedaAutoscaler`, `WvaAutoscaler`, `SloAwareAutoscaler` |
| `KVConnector` | between a replica's scheduler and everything outside its GPU KV cache | `kv_transfer.NixlProducer` / `NixlConsumer` (disaggregated prefill and decode), `offload.OffloadingConnector` (vLLM's native CPU and disk tiers), `lmcache.LMCacheConnector` |

The records that cross them: `kvsim.batch.Batch` (the scheduler's plan of a step, the backend's
input), `kvsim.batch.DecodeShape` and `kvsim.perf.pricing.DecodeRunPrice` (a run of decode steps and
its price), `records.DecodeRunPlan` (what the scheduler allows a run), `records.StepRecord` (what a
step did, for the observer) and `settings.EngineSettings` (one policy's engine, resolved once).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Optional, Protocol, Sequence as Seq, runtime_checkable

if TYPE_CHECKING:
    from kvsim.batch import Batch, DecodeShape
    from kvsim.engine.autoscalers import FleetView
    from kvsim.engine.kv_transfer import KvTransfer
    from kvsim.engine.records import StepRecord
    from kvsim.perf.pricing import DecodeRunPrice
    from kvsim.sequence import Request, Sequence


@runtime_checkable
class KVAllocator(Protocol):
    """One replica's KV cache as the scheduler and the decode cohort use it. Misuse (an allocation
    the caller should have checked, a double free) raises `block_manager.AllocationError`."""

    num_blocks: int
    block_size: int
    grows: bool  # False: a sequence holds all its blocks from admission (contiguous slabs)
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int  # free blocks still holding reusable content
    num_shared_refs: int  # references to blocks past their first holder (a shared prefix)
    reserved_unused_tokens: int  # slots held and not yet written
    external_fragmentation: float  # share of free blocks no waiting sequence can use

    # ---- what fits --------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int: ...
    def peak_blocks(self, seq: Sequence) -> int: ...  # what it holds with all its tokens
    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int: ...
    def get_computed_blocks(self, seq: Sequence) -> Seq[int]: ...  # prefix hits, at a first allocation
    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool: ...
    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool: ...

    # ---- taking and freeing ------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> None: ...
    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None: ...
    def deallocate(self, seq: Sequence) -> None: ...
    def reserve(self, n: int) -> None: ...  # n blocks now, for decode-cohort members that claim them later
    def claim(self, seq: Sequence, num_tokens: int = -1) -> None: ...  # reserved blocks into the table, to cover its
    #   computed tokens (num_tokens >= 0: that many slots, a speculative member's lookahead included)
    def note_written(self, num_tokens: int) -> None: ...  # tokens written into slots already held

    # ---- figures ------------------------------------------------------------------------------
    def block_counts(self) -> tuple[int, int, int]: ...  # (used, cached, free)
    def evictions_ahead(self, counts: Seq[int]) -> list[int]: ...  # cached blocks among the next n taken, per n
    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]: ...


@runtime_checkable
class Backend(Protocol):
    """Prices engine steps (or runs them on a device). Built by the kvsim.backends registry as
    `Backend(scenario, policy, model, gpu, capacity, settings)`."""

    name: str
    num_blocks: int  # KV blocks per replica (the allocator's size)
    fuses_decode_runs: bool  # runs of cohort decode steps may be one event, priced by decode_run
    prices_longest_decode: bool  # step prices read Batch.decode_max_context (the cohort keeps it)
    holds_device: bool  # holds a device one policy's backend at a time may use (policies run one after the other)

    def execute(self, batch: Batch) -> float: ...  # seconds of one step
    def decode_run(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice: ...
    def decode_run_time(self, shape: DecodeShape, k: int) -> float: ...
    def free(self, seq: Sequence) -> None: ...  # a finished sequence's device state
    def describe(self) -> dict: ...  # summary.json's "backend"
    def close(self) -> None: ...  # release the device (a next policy's backend needs it)


@runtime_checkable
class EngineObserver(Protocol):
    """Is told what the engine does; `interval` is its time-series sampling interval (a fused run
    reports the state at the last step ending in every interval it crosses, `StepRecord.marks`)."""

    interval: float

    def on_reject(self, seq: Sequence) -> None: ...
    def on_held_back(self, step: StepRecord) -> None: ...  # planned and priced; requests wait (step.admission_limit)
    def on_step(self, step: StepRecord) -> None: ...  # ran; sets step.sample_boundary


@runtime_checkable
class ArrivalSource(Protocol):
    """Requests in arrival order. `next_request` gives the next one (None: no more); `exhausted` is
    True once none will ever come. A `closed_loop` source is a `ClosedLoopSource`."""

    exhausted: bool
    closed_loop: bool

    def next_request(self) -> Optional[Request]: ...
    def request_ended(self, seq: Sequence, now: float) -> None: ...


@runtime_checkable
class ClosedLoopSource(ArrivalSource, Protocol):
    """A source whose requests depend on earlier ones ending (clients waiting for replies): it hears
    of every request that finished or was rejected through `request_ended`; `next_time` is when its
    next request is due (inf: none until a request ends), and `next_request` is taken only then (an
    end may make an earlier one due). Every request it releases after an end at t is due at
    t + `min_gap` or later."""

    next_time: float
    min_gap: float


@runtime_checkable
class Router(Protocol):
    def route(self, seq: Sequence) -> int: ...  # the replica (index) that gets the request


@runtime_checkable
class TransferObserver(Protocol):
    """Is told of each request's KV transfer (kvsim.engine.kv_transfer.KvTransfer) once the decode
    instance has the whole KV; the record is the request's own (kept until it finishes)."""

    def on_transfer(self, transfer: KvTransfer) -> None: ...


@runtime_checkable
class Autoscaler(Protocol):
    """Decides an autoscaled pool's replica count (kvsim.engine.fleet asks every `period_s` seconds;
    inf: never) from a `kvsim.engine.autoscalers.FleetView` of the pool and its metrics."""

    name: str
    period_s: float

    def desired(self, view: FleetView) -> int: ...
    def describe(self) -> dict: ...  # its settings, for summary.json


@runtime_checkable
class KVConnector(Protocol):
    """Between one replica's scheduler and whatever holds KV outside its GPU cache, called where vLLM's
    scheduler calls its KVConnectorBase_V1 (vLLM v0.26.0, vllm/v1/core/sched/scheduler.py), by
    kvsim.engine.connector.ConnectedScheduling and ConnectedReplica:

    - at admission of a request with nothing computed, after the local prefix-cache lookup:
      `get_num_new_matched_tokens(seq, num_computed_tokens)` -> (tokens the connector can provide
      beyond them, whether they arrive asynchronously); None tokens: it cannot tell yet, the request
      is skipped this step (vLLM's retry);
    - after the blocks were allocated (the external tokens' too): `update_state_after_alloc(seq, n)`;
      an asynchronous request then waits outside the queues (vLLM's WAITING_FOR_REMOTE_KVS) until
      `get_finished(now)` hands it back, its KV in place, at a step boundary;
    - after a step is planned: `build_connector_meta(batch, start, end)` starts its transfers (loads
      at the start, stores of the blocks it computes at the end) and returns the seconds a
      synchronous connector adds to the step;
    - when a request finishes: `request_finished(seq)` True means the connector frees its blocks
      later (vLLM's delayed free: a store or a remote read still reads them).

    `waiting` holds requests that reach the engine through the connector (a decode instance's
    hand-offs), admitted after the scheduler's own queue; `next_event` is when the connector next
    changes what the scheduler may do (a load's end; inf: never), which bounds fused decode runs and
    waits.
    """

    waiting: deque
    next_event: float

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[Optional[int], bool]: ...
    def update_state_after_alloc(self, seq: Sequence, num_external_tokens: int) -> None: ...
    def build_connector_meta(self, batch: Batch, start: float, end: float) -> float: ...
    def get_finished(self, now: float) -> list: ...  # sequences whose KV arrived by now, in admission order
    def request_finished(self, seq: Sequence) -> bool: ...
