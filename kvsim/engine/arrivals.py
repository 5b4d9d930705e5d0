"""Arrival sources: where the simulation's requests come from (`interfaces.ArrivalSource`).

- `RequestStream` (open loop): the requests of an iterable in arrival order, whatever ends when. The
  simulation pulls the next one as soon as the previous one was dispatched.
- `ClosedLoop`: clients that send a request and wait for its end, as `vllm bench serve
  --max-concurrency N` and vLLM's multi-turn benchmark (`benchmarks/multi_turn`) drive a server
  (vLLM v0.11.0). Work comes as *sessions*, in arrival order: a session is one or more turns; a
  plain request is a session of one. A session needs a client: it waits for one in arrival order
  (FIFO, as an `asyncio.Semaphore(N)` queues its waiters) and holds it for all its turns; turn k+1
  is sent `think(k)` seconds after turn k ended, and the client is free again `think` seconds
  after the session's last turn ended. With `max_concurrency = N` at most N sessions hold a client,
  so at most N requests are in flight: with every session arrived at t = 0 (`--request-rate inf`)
  this is the pure closed loop of N clients (throughput N / (R + Z) by Little's law, for response
  time R and think time Z); with sessions arriving at a finite rate it is vllm bench's semaphore
  over its arrival process (requests still arrive at --request-rate, at most N in flight). Without
  a limit every session has its own client (an open loop of sessions, closed within each).
  A request's `arrival_time` is when it is *sent*: latencies are measured from there, as vllm bench
  measures them (time waiting for a client is the source's `client_wait_s`). A rejected turn ends
  its session, as vLLM's multi-turn benchmark drops a conversation whose request failed.

A closed-loop source never hands out a request ahead of time: an end may make an earlier one due.
It says when its next request is due (`next_time`, inf while every client waits on a request or
nothing is left) and gives that request when the simulation's clock gets there; it hears of every
end through `request_ended`.
"""

from __future__ import annotations

import heapq
import math
from array import array
from typing import Iterable, Iterator, Optional

import numpy as np

from kvsim.sequence import Request, Sequence, SequenceStatus


class RequestStream:
    """An open-loop stream: the requests of an iterable, in arrival order, whatever ends when."""

    __slots__ = ("_requests", "exhausted")
    closed_loop = False  # request_ended releases nothing: the simulation need not call it

    def __init__(self, requests: Iterable[Request]):
        self._requests = iter(requests)
        self.exhausted = False

    def next_request(self) -> Optional[Request]:
        req = next(self._requests, None)
        if req is None:
            self.exhausted = True
        return req

    def request_ended(self, seq: Sequence, now: float) -> None:
        pass


class ClosedLoop:
    """Sessions sent by clients (module docstring). `sessions` yields session records in arrival
    order, each with `arrival_time`, `num_turns`, `think(k)` (seconds after turn k ends) and
    `request(k, request_id, send_time)` (turn k as a `Request`; turns are asked for in order).
    `min_gap`: a lower bound of every think time (the simulation bounds fused decode runs with it);
    `immediate`: every session arrives at t = 0 (no arrival process: the engine's backlog says
    nothing about keeping up, the SLO alone decides); `horizon`: nothing is sent after it;
    `reply_delay`: what a client waits past the engine's last token (the API server's time)."""

    closed_loop = True

    def __init__(self, sessions: Iterator, max_concurrency: Optional[int] = None, min_gap: float = 0.0,
                 immediate: bool = False, horizon: float = math.inf, reply_delay: float = 0.0):
        self._sessions = iter(sessions)
        self._head = next(self._sessions, None)  # the next session to start
        self.max_concurrency, self.immediate, self.horizon = max_concurrency, immediate, horizon
        self.reply_delay, self.min_gap = reply_delay, reply_delay + min_gap
        self._free = max_concurrency  # idle clients (None: as many as sessions)
        self._frees: list[float] = []  # when busy clients' last think ends
        self._turns: list[tuple] = []  # (send time, session serial, session): next turns, client held
        self._live: dict[int, tuple] = {}  # request id -> (session, turn, ready time)
        self._clock = -math.inf  # the latest send or end told: a client freed now sends no earlier
        self._serial = self.num_sent = self.num_sessions = self.peak_in_flight = 0
        self.last_ready = -math.inf  # the latest time a request was ready to be sent
        self.client_wait = array("d")  # per first turn: its send less its session's arrival
        self._scheduled = array("d")  # per ended request: when the engine first scheduled it
        self.next_time, self.exhausted = math.inf, False
        self._update()

    # ---- the ArrivalSource side ----------------------------------------------------------------
    def next_request(self) -> Optional[Request]:
        """The request due at `next_time` (a session's next turn before a new session on ties)."""
        t = self.next_time
        if t == math.inf:
            return None
        self._clock = t
        if self._turns and self._turns[0][0] <= t:
            _, _, session = heapq.heappop(self._turns)
            req = self._send(session, session.turn + 1, t, t)
        else:
            req = self._start(t)
        self._update()
        return req

    def request_ended(self, seq: Sequence, now: float) -> None:
        """Turn k of a session ended at `now` (its client has the reply `reply_delay` later): its next
        turn a think time after that, or its client free."""
        session, k, _ = self._live.pop(seq.request.request_id)
        self._clock = max(self._clock, now)
        self._scheduled.append(seq.first_scheduled_time)
        ready = now + self.reply_delay + session.think(k)
        if k + 1 < session.num_turns and seq.status is not SequenceStatus.REJECTED:
            self._serial += 1
            heapq.heappush(self._turns, (ready, self._serial, session))
        elif self._free is not None:
            if ready > now:
                heapq.heappush(self._frees, ready)
            else:
                self._free += 1
        self._update()

    # ---- inside ----------------------------------------------------------------------------------
    def _start(self, t: float) -> Request:
        """The head session takes a client at `t` and sends its first turn."""
        session = self._head
        if self._free is not None:
            while self._frees and self._frees[0] <= t:
                heapq.heappop(self._frees)
                self._free += 1
            self._free -= 1
        self._head = next(self._sessions, None)
        self.num_sessions += 1
        self.client_wait.append(t - session.arrival_time)
        return self._send(session, 0, t, session.arrival_time)

    def _send(self, session, k: int, t: float, ready: float) -> Request:
        session.turn = k
        rid = self.num_sent
        self.num_sent += 1
        self._live[rid] = (session, k, ready)
        self.peak_in_flight = max(self.peak_in_flight, len(self._live))
        if ready > self.last_ready:
            self.last_ready = ready
        return session.request(k, rid, t)

    def _update(self) -> None:
        """next_time: the earliest due send; past the horizon nothing is sent any more."""
        t = self._turns[0][0] if self._turns else math.inf
        head = self._head
        if head is not None:
            start = max(head.arrival_time, self._clock)  # a client free now, or the next to be
            if self._free == 0:
                start = max(start, self._frees[0]) if self._frees else math.inf
            t = min(t, start)
        if t > self.horizon:
            t, self._turns, self._head = math.inf, [], None
        self.next_time = t
        self.exhausted = t == math.inf and not self._live

    # ---- figures ---------------------------------------------------------------------------------
    def backlog(self) -> Optional[int]:
        """Requests the engine first scheduled after the last one was ready to be sent (None when
        every session arrived at once: a closed population cannot outrun the engine)."""
        if self.immediate or not self._scheduled:
            return None
        return int(np.count_nonzero(np.frombuffer(self._scheduled, dtype=np.float64) > self.last_ready))

    def describe(self) -> dict:
        """summary.json's "clients": the loop's settings and what the clients saw."""
        wait = np.frombuffer(self.client_wait, dtype=np.float64)
        return {"max_concurrency": self.max_concurrency, "immediate": self.immediate, "sessions": self.num_sessions,
                "requests": self.num_sent, "peak_in_flight": self.peak_in_flight,
                "client_wait_s": {"mean": float(wait.mean()) if len(wait) else None,
                                  "max": float(wait.max()) if len(wait) else None}}
