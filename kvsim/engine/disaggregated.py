"""The simulation of a disaggregated deployment: a prefill pool, a decode pool and the KV link.

A request arrives at the prefill pool's router as its own sequence with max_tokens = 1 (the proxy of
vLLM's disaggregated-serving examples sends it so); the decode pool's checks come first, so a request
the decode pool can never hold is rejected on arrival with its reason. When the prefill instance has
computed the prompt (layer-wise: when it starts), the request goes to the decode pool's router; the
decode instance allocates its blocks in its own order of admission and reads the KV over the link
(kvsim.engine.kv_transfer), after which the prefill instance frees its blocks and the decode
instance computes the last prompt token, emitting the request's first token, and decodes the rest.

Every engine loop waits for its step's end as a SimPy timeout (the instances interact, so none may
run ahead of the clock). A decode instance's run of fused decode steps ends before anything could
reach it: a prefill step's end (a hand-off), an arrival while a prefill instance is idle, one of its
reads completing; while requests wait for its blocks it runs step by step. A closed loop's clients
send as `Simulation`'s wakes dispatch them, and then an arrival may be one a step on another
instance releases (`Simulation.arrival_bound`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from kvsim.engine.interfaces import ArrivalSource, EngineObserver, Router, TransferObserver
from kvsim.engine.kv_transfer import KvLink, KvTransfer, NixlConsumer, stalled
from kvsim.engine.replica import Replica
from kvsim.engine.simulator import Simulation
from kvsim.sequence import Sequence, SequenceStatus


class DisaggregatedSimulation(Simulation):
    """One policy's run on a prefill pool and a decode pool (`Simulation`'s arrivals and accounting).
    The prefill replicas' KV connectors are `kv_transfer.NixlProducer`s, the decode replicas'
    `NixlConsumer`s; `num_layers` paces layer-wise streaming (`layerwise`)."""

    def __init__(self, prefill: list[Replica], decode: list[Replica], observer: EngineObserver,
                 routers: tuple[Router, Router], link: KvLink, transfers: TransferObserver, layerwise: bool,
                 num_layers: int, on_progress: Optional[Callable[[int], None]] = None):
        super().__init__(prefill + decode, observer, routers[0], on_progress)
        self.prefill, self.decode, self.decode_router = prefill, decode, routers[1]
        self.link, self.transfers, self.layerwise, self.num_layers = link, transfers, layerwise, num_layers
        self.receivers = [rep.scheduler.connector for rep in decode]
        self.pending: dict[Sequence, KvTransfer] = {}  # prefill sequence -> its transfer, until it is done
        self.prefill_ends = [math.inf] * len(prefill)  # the end of each prefill instance's step (inf: idle)
        self.reads = [{} for _ in decode]  # per decode instance: its reads in flight -> their end

    def run(self, source: ArrivalSource) -> float:
        import simpy

        self.source, self.closed = source, source.closed_loop
        env = self.env = simpy.Environment()
        if not self.closed:
            env.process(self._arrivals())
        for rep in self.prefill:
            env.process(self._prefill_loop(rep))
        for rep, receiver in zip(self.decode, self.receivers):
            env.process(self._decode_loop(rep, receiver))
        if self.closed:
            self.start_wakes(env)
        env.run()
        stuck = sum(rep.scheduler.num_unfinished for rep in self.replicas) + len(self.pending)
        if stuck or not source.exhausted or any(rep.scheduler.connector.held for rep in self.prefill):
            raise RuntimeError(f"simulation ended with {stuck} requests unaccounted for")
        return max(self.last_dispatch if self.closed else env.now, *(rep.clock for rep in self.replicas))

    # ---- arrivals ------------------------------------------------------------------------
    def dispatch(self, seq: Sequence, now: float) -> None:
        """`seq` (the decode instance's sequence) arrives: its prefill to the instance the prefill
        router picks, or rejected with the reason of the pool that could never serve it."""
        self.num_received += 1
        reason = self.decode[0].scheduler.reject_reason(seq)
        if not reason:
            prefill_seq = Sequence(seq.request._replace(output_len=1))
            index = self.router.route(prefill_seq)
            rep = self.prefill[index]
            if rep.scheduler.add(prefill_seq):
                self.pending[prefill_seq] = KvTransfer(seq, prefill_seq, index)
                _wake(rep)
                return
            reason = f"prefill pool: {prefill_seq.reject_reason}"
        else:
            reason = f"decode pool: {reason}"
        seq.status, seq.reject_reason, seq.finish_time = SequenceStatus.REJECTED, reason, now
        self.observer.on_reject(seq)
        self._ended([seq], now)

    # ---- prefill instances -----------------------------------------------------------------
    def _prefill_loop(self, rep: Replica):
        env, observer, held = self.env, self.observer, rep.scheduler.connector
        while True:
            sched = rep.scheduler
            if not sched.num_unfinished or (held.num_held_blocks and stalled(sched, rep.allocator)):
                self.prefill_ends[rep.index] = math.inf
                rep.clock = env.now
                rep.idle = env.event()  # an arrival or a released block wakes it
                yield rep.idle
                continue
            now = env.now
            step = rep.begin(now, math.inf)
            self.prefill_ends[rep.index] = step.end
            if self.layerwise:
                self._hand_off_started(step.batch.seqs, now)
            if step.admission_limit:
                observer.on_held_back(step)
            yield env.timeout(step.end - now)
            finished = rep.complete(step)
            step.finished = ()  # a prefill's end is no request's: the decode instance finishes it
            observer.on_step(step)
            for prefill_seq in finished:
                self._prefill_done(self.pending[prefill_seq], step.end)

    def _hand_off_started(self, seqs: list[Sequence], now: float) -> None:
        """Layer-wise streaming: requests whose prefill starts now go to their decode instance now."""
        for prefill_seq in seqs:
            if prefill_seq.first_scheduled_time == now:
                tr = self.pending[prefill_seq]
                if tr.dst < 0:
                    self._hand_off(tr, now)

    def _prefill_done(self, tr: KvTransfer, now: float) -> None:
        tr.prefill_end = now
        if not self.layerwise:
            self._hand_off(tr, now)
        elif tr.start >= 0:  # streaming already: it ends one layer's share after the prefill at the earliest
            self._complete_at(tr)

    def _hand_off(self, tr: KvTransfer, now: float) -> None:
        """The request goes to the decode instance the decode router picks."""
        seq, prefill_seq = tr.seq, tr.prefill_seq
        seq.first_scheduled_time = prefill_seq.first_scheduled_time  # its queueing happened in the prefill pool
        seq.num_cached_tokens = prefill_seq.num_cached_tokens  # where its prompt was computed
        seq.block_hashes = prefill_seq.block_hashes  # the same blocks' identities: computed once
        tr.dst, tr.handed_off = self.decode_router.route(seq), now
        self.receivers[tr.dst].arrive(tr)
        _wake(self.decode[tr.dst])

    # ---- decode instances ------------------------------------------------------------------
    def _decode_loop(self, rep: Replica, receiver: NixlConsumer):
        env, observer = self.env, self.observer
        while True:
            sched = rep.scheduler
            if sched.num_unfinished == receiver.num_pending or stalled(sched, rep.allocator):
                sched.admit_arrivals(sched.max_num_batched_tokens, False)
                self._start_reads(receiver, env.now)
                rep.clock = env.now
                rep.idle = env.event()  # a hand-off or a read's end wakes it
                yield rep.idle
                continue
            now = env.now
            step = rep.begin(now, self._decode_horizon(rep, receiver, now))  # admits arrivals as it schedules
            self._start_reads(receiver, now)
            if step.admission_limit:  # requests (arrivals too) wait for this instance's blocks, seats or budget
                observer.on_held_back(step)
            yield env.timeout(step.end - now)
            finished = rep.complete(step)
            observer.on_step(step)
            if finished:
                self._ended(finished, step.end)

    def _decode_horizon(self, rep: Replica, receiver: NixlConsumer, now: float) -> float:
        """Before when a decode instance's fused run must end: the next moment a request could reach it
        or its reads could end (now: requests wait for its blocks, so it runs step by step). An idle
        prefill instance starts on the next arrival; in a closed loop that may be one another
        instance's step releases (`Simulation.arrival_bound`)."""
        if receiver.waiting:
            return now
        ends = self.prefill_ends
        horizon = min(ends)
        if math.inf in ends:
            horizon = min(horizon, self.arrival_bound(rep, now) if self.closed else self.next_arrival_time)
        reads = self.reads[rep.index] if receiver.num_receiving else None
        return min(horizon, *reads.values()) if reads else horizon

    def _start_reads(self, receiver: NixlConsumer, now: float) -> None:
        """The reads of the arrivals the decode instance admitted."""
        for tr in receiver.take_started():
            self.link.schedule(tr, now)
            if tr.prefill_end >= 0:
                self._complete_at(tr)

    def _complete_at(self, tr: KvTransfer) -> None:
        """The decode instance will have the whole KV at `tr.end`."""
        tr.end = tr.finish_time(self.num_layers)
        self.reads[tr.dst][tr] = tr.end
        done = self.env.timeout(tr.end - self.env.now)
        done.callbacks.append(lambda _event: self._read_done(tr))

    def _read_done(self, tr: KvTransfer) -> None:
        """The read is done: the prefill instance frees the blocks, the decode instance schedules the request."""
        del self.reads[tr.dst][tr]
        del self.pending[tr.prefill_seq]
        prefill = self.prefill[tr.src]
        prefill.scheduler.connector.release(tr.prefill_seq)
        _wake(prefill)
        self.receivers[tr.dst].arrived(tr)
        _wake(self.decode[tr.dst])
        self.transfers.on_transfer(tr)


def _wake(rep: Replica) -> None:
    if rep.idle is not None:
        rep.idle.succeed()
        rep.idle = None
