"""Arrival sources: where the simulation's requests come from (`interfaces.ArrivalSource`).

The simulation pulls the next request when the previous one has been dispatched, and tells a
`closed_loop` source about every request that finished or was rejected. An open-loop stream (a synthetic arrival
process, a trace) ignores that; a closed-loop source (a fixed number of clients, each sending its
next request a think time after the last one ended) releases requests from there, and returns None
from `next_request` while every client waits.
"""

from __future__ import annotations

from typing import Iterable, Optional

from kvsim.sequence import Request, Sequence


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
