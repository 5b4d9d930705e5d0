"""Work for a closed loop: the scenario's requests as sessions of turns, for `kvsim.engine.arrivals.ClosedLoop`.

`sessions(scenario)` yields session records in arrival order (the arrival process gives each
session's start; `immediate`: all at t = 0). The same scenario and seed give the same sessions.

- Without `[workload.sessions]` every request of `generate_requests` is a session of one turn
  (lengths, prefix groups, traces and datasets as for an open loop).
- With it, a session has `sessions.turns` turns. Turn k's prompt is the conversation so far, the
  session's system prompt (a prefix group's, if it joins one), every earlier turn's new tokens and
  reply, then `prompt_len` new tokens; its reply is `output_len` tokens. Its `token_ids` name the
  conversation through the reply: the allocator registers the reply's full blocks as it computes
  them, so the next turn hits the whole conversation before its new tokens, as vLLM's prefix cache
  does when a chat client sends the history back (the chat template's own tokens aside). Content
  is named by keys of `engine.block_size` tokens (`KeyedTokens`): a session's keys are its own, a
  group's system prompt's are the group's (a key straddling the end of the prompt is the
  session's, as the block holding it is).
- A ShareGPT dataset (`[workload.trace] format = "sharegpt"`, turns, prompt_len and output_len
  dist = "trace") gives sessions as its conversations: (human, gpt) turn pairs in order, tokens
  estimated as for the open loop (kvsim/scenario/datasets.py), the file's conversations in order,
  cycled when more requests are asked for.
- `workload.think_time_s` follows each turn (the client's pause before the next; after a session's
  last turn, before the client takes another session).
- `num_requests` caps the turns of all sessions together (the last session is cut); `duration_s`
  is the source's horizon (nothing is sent after it).

Random numbers come from their own streams (turns, think times: spawn keys beyond the open loop's),
so adding think times or sessions leaves the other draws alone.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Iterator, Optional

import numpy as np

from kvsim.scenario.limits import MAX_REQUESTS, MAX_TURNS
from kvsim.scenario.trace_rows import block_token_ids
from kvsim.scenario.traces import load_conversations, load_trace
from kvsim.scenario.workload import (CHUNK, PrefixGroups, arrival_chunks, draw_lengths, generate_requests,
                                     session_requests)
from kvsim.sequence import KeyedTokens, Request, mix64

_TURNS_KEY, _THINK_KEY = 5, 6  # spawn keys of the turn-count and think-time streams
_SESSION_SALT, _GROUP_SALT = np.uint64(0x5E55_10A5_0000_0001), np.uint64(0x6A0B_0000_5E55_0002)


def is_closed_loop(scenario) -> bool:
    """Whether the scenario's requests come from clients (kvsim.engine.arrivals.ClosedLoop)."""
    wl = scenario.workload
    return wl.max_concurrency is not None or wl.sessions is not None or wl.think_time_s is not None


def draw_times(dist, rng: np.random.Generator, n: int) -> list:
    """n durations (seconds) from a TimeDist; none: zeros."""
    if dist is None:
        return [0.0] * n
    if dist.dist == "fixed":
        return [dist.value] * n
    if dist.dist == "uniform":
        return rng.uniform(dist.min, dist.max, n).tolist()
    if dist.dist == "exponential":
        return rng.exponential(dist.mean, n).tolist()
    mu = math.log(dist.mean) - dist.sigma ** 2 / 2
    return rng.lognormal(mu, dist.sigma, n).tolist()


def _stream_rng(seed: int, key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


class OneTurn:
    """A request of the open-loop workload as a session of one turn."""

    __slots__ = ("req", "arrival_time", "gap", "turn")
    num_turns = 1

    def __init__(self, req: Request, gap: float):
        self.req, self.arrival_time, self.gap, self.turn = req, req.arrival_time, gap, 0

    def think(self, k: int) -> float:
        return self.gap

    def request(self, k: int, request_id: int, t: float) -> Request:
        return self.req._replace(request_id=request_id, arrival_time=t)


class Session:
    """A conversation: `prompts[k]` new tokens and `outputs[k]` reply tokens in turn k, after a
    system prompt of `prefix_len` tokens (group `group`, -1: none); `thinks[k]` after turn k."""

    __slots__ = ("index", "arrival_time", "num_turns", "prompts", "outputs", "thinks", "prefix_len", "group",
                 "span", "turn", "context")

    def __init__(self, index: int, arrival_time: float, prompts: list, outputs: list, thinks: list,
                 prefix_len: int, group: int, span: int):
        self.index, self.arrival_time, self.num_turns = index, arrival_time, len(prompts)
        self.prompts, self.outputs, self.thinks = prompts, outputs, thinks
        self.prefix_len, self.group, self.span = prefix_len, group, span
        self.turn, self.context = 0, prefix_len  # tokens said before the next turn

    def think(self, k: int) -> float:
        return self.thinks[k]

    def request(self, k: int, request_id: int, t: float) -> Request:
        """Turn k (asked for in order): the conversation so far and its new tokens; content through its reply."""
        prompt = self.context + self.prompts[k]
        said = prompt + self.outputs[k]
        self.context = said
        return Request(request_id, t, prompt, self.outputs[k], self.content(said))

    def content(self, length: int) -> KeyedTokens:
        """The session's first `length` tokens named by keys of `span` tokens."""
        span = self.span
        n = -(-length // span)
        j = np.arange(n, dtype=np.uint64)
        keys = mix64(_base(self.index, _SESSION_SALT) + j)
        if self.group >= 0:
            whole = min(n, self.prefix_len // span)  # keys wholly inside the system prompt
            keys[:whole] = mix64(_base(self.group, _GROUP_SALT) + j[:whole])
        return KeyedTokens(keys, span, length, partial(block_token_ids, block_size=span))


def _base(index: int, salt: np.uint64) -> np.uint64:
    return mix64(np.array([index], dtype=np.uint64) ^ salt)[0]


def sessions(scenario, max_model_len: Optional[int] = None) -> Iterator:
    """The scenario's work in arrival order, as session records (module docstring)."""
    wl = scenario.workload
    if wl.sessions is None:
        return _one_turn_sessions(scenario, max_model_len)
    return _conversations(scenario)


def _one_turn_sessions(scenario, max_model_len: Optional[int]) -> Iterator[OneTurn]:
    think_rng = _stream_rng(scenario.workload.seed, _THINK_KEY)
    gaps: list = []
    for req in generate_requests(scenario, max_model_len):
        if not gaps:
            gaps = draw_times(scenario.workload.think_time_s, think_rng, CHUNK)[::-1]
        yield OneTurn(req, gaps.pop())


def _conversations(scenario) -> Iterator[Session]:
    wl = scenario.workload
    seed, span = wl.seed, scenario.engine.block_size
    arrival_rng, prompt_rng, output_rng, group_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    turns_rng, think_rng = _stream_rng(seed, _TURNS_KEY), _stream_rng(seed, _THINK_KEY)
    prefix = PrefixGroups(wl.prefix, seed, group_rng) if wl.prefix is not None else None
    dataset = _dataset(scenario) if wl.sessions.turns.dist == "trace" else None
    left = session_requests(scenario, dataset) or MAX_REQUESTS  # turns still to hand out
    index = 0
    for times in arrival_chunks(wl.arrival, _arrival_trace(scenario), arrival_rng):
        n = len(times) if wl.duration_s is None else int(np.searchsorted(times, wl.duration_s, side="right"))
        if dataset is not None:
            counts = [dataset.turns(index + i) for i in range(n)]
        else:
            counts = draw_lengths(wl.sessions.turns, turns_rng, n, None, None, "turns", MAX_TURNS)
        groups = prefix.draw(n) if prefix is not None else [-1] * n
        for i in range(n):
            k = min(counts[i], left)
            if dataset is not None:
                prompts, outputs = dataset.lengths(index)
                prompts, outputs = prompts[:k], outputs[:k]
            else:
                prompts = draw_lengths(wl.prompt_len, prompt_rng, k, None, None, "prompt_len")
                outputs = draw_lengths(wl.output_len, output_rng, k, None, None, "output_len")
            g = groups[i]
            yield Session(index, times[i], prompts, outputs, draw_times(wl.think_time_s, think_rng, k),
                          prefix.prefix_len if g >= 0 else 0, g, span)
            index += 1
            left -= k
            if not left:
                return
        if n < len(times):
            return


def _arrival_trace(scenario):
    """The trace whose times start sessions (arrival.process = "trace"), else None."""
    if scenario.workload.arrival.process != "trace":
        return None
    return load_trace(scenario)


def _dataset(scenario):
    return load_conversations(scenario)


def mean_turns(scenario) -> float:
    """The mean turns per session (1 without sessions), for rates in requests per second."""
    wl = scenario.workload
    if wl.sessions is None:
        return 1.0
    d = wl.sessions.turns
    if d.dist == "fixed":
        return float(d.value)
    if d.dist == "uniform":
        return (d.min + d.max) / 2
    if d.dist == "lognormal":
        return float(d.mean)
    return _dataset(scenario).mean_turns
