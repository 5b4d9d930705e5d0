"""The workload: a stream of `Request`s sorted by arrival, synthetic or replayed from a trace.

`generate_requests(scenario)` yields requests with ids 0, 1, 2, ... in arrival order. The same
scenario and seed always give the same stream.

- Arrivals: `poisson` (exponential gaps, mean 1/rate; the first request arrives after one gap; with
  `arrival.curve`, a rate that varies over time: kvsim/scenario/load_curve.py),
  `gamma` (shape 1/cv², mean gap 1/rate, so cv > 1 is bursty), `deterministic` (every gap 1/rate,
  the first after one gap: capacity in closed form) or `trace` (the trace's times, the first at 0,
  gaps multiplied by `arrival.time_scale`).
- Lengths: `fixed`, `uniform` integers in [min, max], `lognormal` (`mean` of the lengths in tokens,
  `sigma` of the underlying normal, so mu = ln(mean) - sigma²/2; rounded, clipped to [min or 1, max or 2^31])
  or `trace` (the row's value). Synthetic arrivals with trace lengths take the rows in order and
  cycle when more requests are asked for.
- The stream stops at `num_requests`, or at the first arrival after `duration_s`, whichever comes
  first; a trace also ends at its last row (after `trace.max_requests`). Synthetic arrivals with
  trace lengths and neither limit give one pass over the trace.
- Prefix groups (`workload.prefix`): each request joins, with probability `fraction`, one of
  `num_groups` groups chosen uniformly. A member's prompt is the group's `prefix_len` system-prompt
  tokens followed by its own sampled prompt, so `prompt_len = prefix_len + sampled`, and its
  `token_ids` is the group's prefix: one read-only int32 array, the same object for every member,
  with values in [0, 32000) that depend only on the seed and the group index. Requests outside a
  group have `token_ids=None`, unless the trace carries block ids (Mooncake) and the prompt lengths
  come from it: then `token_ids` is the row's prompt named by its block ids (`KeyedTokens`, expanded
  into token ids only when read), after the group's prefix if any.
- Prompt pools (`workload.prefix.prompts_per_group`, llm-d inference-perf's shared_prefix data): a fixed
  pool of num_groups × prompts_per_group whole prompts (a group's prefix and a question whose length is
  drawn once from prompt_len), shuffled once and sent in that order over and over; each request's
  `token_ids` is its whole prompt (`PromptPool`).

Random numbers come in vectorized chunks from independent generators (arrivals, prompt lengths,
output lengths, groups: `SeedSequence(seed).spawn(4)`), so changing a length distribution leaves
the arrival times alone, and a million requests stream in a few seconds with bounded memory.

`arrival_window` says how long the arrivals last before any is generated, and
`timeseries_interval` sizes the time series to it when the scenario leaves the interval unset.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

import numpy as np

from kvsim.scenario.config import ArrivalConfig, LengthDist, PrefixConfig
from kvsim.scenario.limits import MAX_MODEL_LEN, MAX_TOKENS
from kvsim.scenario.load_curve import curve_arrival_chunks, rate_curve
from kvsim.scenario.trace_rows import MOONCAKE_BLOCK_SIZE, VOCAB_SIZE, Trace, block_token_ids
from kvsim.scenario.traces import load_conversations, load_trace
from kvsim.sequence import KeyedTokens, Request

CHUNK = 65536
AUTO_ROWS = 1000  # time-series rows per replica when output.timeseries_interval_s is unset
MIN_AUTO_INTERVAL_S = 0.25
_GROUP_CONTENT_KEY = 4  # spawn-key branch for group prefix tokens, beside the 4 spawned streams
_POOL_CONTENT_KEY = 5  # spawn-key branch for the questions of a prompt pool (prefix.prompts_per_group)


def generate_requests(scenario, max_model_len: Optional[int] = None) -> Iterator[Request]:
    """The scenario's requests in arrival order (a generator; trace and seed are checked now).

    A request whose prompt + output exceeds `max_model_len` (the engine rejects it; default
    MAX_MODEL_LEN) gets no trace token ids: a trace row that can never run is never expanded.
    """
    trace = load_trace(scenario) if scenario.workload.trace is not None else None
    return _stream(scenario, trace, min(max_model_len or MAX_MODEL_LEN, MAX_MODEL_LEN))


def expected_count(scenario) -> Optional[int]:
    """How many requests `generate_requests` yields, for a progress bar.

    Exact for traces and for `num_requests` alone; when `duration_s` cuts synthetic arrivals it is
    the expectation, about rate × duration_s.
    """
    wl = scenario.workload
    if wl.sessions is not None:
        return session_requests(scenario)
    trace = load_trace(scenario) if wl.trace is not None else None
    limit = _limit(wl, trace)
    if wl.duration_s is None:
        if wl.arrival.curve is not None and wl.sessions is None:
            curve = rate_curve(wl.arrival.curve)  # the curve ends the stream
            estimate = math.floor(curve.total - float(curve.cumulative(wl.start_s or 0.0)))
            return estimate if limit is None else min(limit, estimate)
        return limit
    if wl.arrival.process == "trace":
        times = trace.arrival_s * wl.arrival.time_scale
        in_time = int(np.searchsorted(times, wl.duration_s, side="right"))
        in_time = in_time if limit is None else min(limit, in_time)
        return in_time - int(np.searchsorted(times[:in_time], wl.start_s or 0.0, side="left"))
    if wl.arrival.process == "immediate":
        return limit  # a closed loop's count depends on how fast the engine answers
    start = wl.start_s or 0.0
    if wl.arrival.curve is not None:
        curve = rate_curve(wl.arrival.curve)
        estimate = math.floor(float(curve.cumulative(wl.duration_s) - curve.cumulative(start)))
        return estimate if limit is None else min(limit, estimate)
    estimate = math.floor(wl.arrival.rate * (wl.duration_s - start))
    return estimate if limit is None else min(limit, estimate)


def session_requests(scenario, dataset=None) -> Optional[int]:
    """How many turns multi-turn sessions hand out at most: num_requests; a dataset's without a
    limit (one pass over its conversations); None when only duration_s bounds them."""
    wl = scenario.workload
    if wl.num_requests is not None:
        return wl.num_requests
    if wl.sessions.turns.dist == "trace" and wl.duration_s is None:
        return len((dataset or load_conversations(scenario)).prompt)
    return None


def timeseries_interval(scenario) -> float:
    """output.timeseries_interval_s, or when unset about a thousandth of the arrival window: the
    smallest 1, 2 or 5 x 10^k seconds at or above it, at least MIN_AUTO_INTERVAL_S."""
    if scenario.output.timeseries_interval_s is not None:
        return scenario.output.timeseries_interval_s
    want = arrival_window(scenario) / AUTO_ROWS
    if want <= MIN_AUTO_INTERVAL_S:
        return MIN_AUTO_INTERVAL_S
    power = 10.0 ** math.floor(math.log10(want))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= want * (1 - 1e-12))


def arrival_window(scenario) -> float:
    """Seconds from the start to the last arrival: exact for traces and deterministic arrivals, the
    expectation for random ones (0 when unbounded)."""
    wl = scenario.workload
    if wl.arrival.process == "immediate":
        return wl.duration_s or 0.0  # a closed loop lasts as long as the engine takes
    if wl.arrival.process == "trace":
        trace = load_trace(scenario)
        n = _limit(wl, trace)
        last = float(trace.arrival_s[n - 1]) * wl.arrival.time_scale if n else 0.0
        return last if wl.duration_s is None else min(last, wl.duration_s)
    if wl.arrival.curve is not None:
        curve = rate_curve(wl.arrival.curve)
        end = curve.end_s if wl.duration_s is None else min(curve.end_s, wl.duration_s)
        if wl.num_requests is not None and wl.num_requests < curve.cumulative(end):
            end = float(curve.invert(np.array([wl.num_requests]))[0])
        return end
    n = expected_count(scenario)
    window = n / wl.arrival.rate if n else 0.0
    return window if wl.duration_s is None else min(window, wl.duration_s)


def _limit(wl, trace: Optional[Trace]) -> Optional[int]:
    """Most requests to yield, before any duration cut (None: unbounded)."""
    limit = wl.num_requests
    if wl.arrival.process == "trace":
        return len(trace) if limit is None else min(limit, len(trace))
    if trace is not None and limit is None and wl.duration_s is None and wl.arrival.curve is None:
        return len(trace)
    return limit


def _stream(scenario, trace: Optional[Trace], max_len: int) -> Iterator[Request]:
    wl = scenario.workload
    arrival_rng, prompt_rng, output_rng, group_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(wl.seed).spawn(4))
    prefix = PrefixGroups(wl.prefix, wl.seed, group_rng) if wl.prefix is not None else None
    if prefix is not None and wl.prefix.prompts_per_group is not None:
        yield from _pool_stream(scenario, trace, PromptPool(wl.prefix, wl, prefix, prompt_rng, group_rng),
                                arrival_rng, output_rng)
        return
    trace_tokens = (trace is not None and trace.hash_ids is not None and wl.prompt_len.dist == "trace")
    limit = _limit(wl, trace)
    rid = 0
    for times in arrival_chunks(wl.arrival, trace, arrival_rng):
        n = _chunk_size(wl, times, limit, rid)
        rows = None if trace is None else np.arange(rid, rid + n) % len(trace)
        prompt = draw_lengths(wl.prompt_len, prompt_rng, n, trace, rows, "prompt_len")
        output = draw_lengths(wl.output_len, output_rng, n, trace, rows, "output_len")
        groups = prefix.draw(n) if prefix is not None else None
        first = 0 if wl.start_s is None else min(n, int(np.searchsorted(times, wl.start_s, side="left")))
        rid += first  # a window of the workload: its requests keep their ids (and draws)
        for i in range(first, n):
            p = prompt[i]
            joins = groups is not None and groups[i] >= 0
            if joins:
                p += prefix.prefix_len
            # a request longer than max_model_len is rejected: it needs no content identity
            tokens = _keyed_tokens(trace, int(rows[i]), prompt[i]) if trace_tokens and p + output[i] <= max_len else None
            if joins:
                tokens = prefix.tokens(groups[i], tokens)
            yield Request(rid, times[i], p, output[i], tokens)
            rid += 1
        if n < len(times):
            return


def _chunk_size(wl, times: list, limit: Optional[int], rid: int) -> int:
    """How many of a chunk's arrival `times` to yield, `rid` requests yielded so far."""
    n = len(times) if limit is None else min(len(times), limit - rid)
    if wl.duration_s is not None:
        n = min(n, int(np.searchsorted(times, wl.duration_s, side="right")))
    return n


def _pool_stream(scenario, trace: Optional[Trace], pool: "PromptPool", arrival_rng, output_rng) -> Iterator[Request]:
    """Requests sending the pool's prompts in its order, over and over (prefix.prompts_per_group)."""
    wl = scenario.workload
    limit = _limit(wl, trace)
    rid = 0
    for times in arrival_chunks(wl.arrival, trace, arrival_rng):
        n = _chunk_size(wl, times, limit, rid)
        rows = None if trace is None else np.arange(rid, rid + n) % len(trace)
        output = draw_lengths(wl.output_len, output_rng, n, trace, rows, "output_len")
        for i in range(n):
            k = pool.order[(rid + i) % len(pool.order)]
            yield Request(rid + i, times[i], pool.lengths[k], output[i], pool.tokens(k))
        rid += n
        if n < len(times):
            return


def _keyed_tokens(trace: Trace, row: int, prompt_len: int) -> KeyedTokens:
    """The row's prompt by its block ids: the allocator reads the ids, nobody expands 12k tokens."""
    keys = trace.hash_ids[trace.hash_start[row]:trace.hash_end[row]]
    return KeyedTokens(keys, MOONCAKE_BLOCK_SIZE, prompt_len, block_token_ids)


def arrival_chunks(cfg: ArrivalConfig, trace: Optional[Trace], rng: np.random.Generator) -> Iterator[list]:
    """Absolute arrival times, CHUNK at a time, as Python floats."""
    if cfg.process == "trace":
        scaled = trace.arrival_s * cfg.time_scale
        for start in range(0, len(scaled), CHUNK):
            yield scaled[start:start + CHUNK].tolist()
        return
    if cfg.process == "immediate":
        while True:
            yield [0.0] * CHUNK
    if cfg.curve is not None:
        yield from curve_arrival_chunks(cfg.process, cfg.cv, rate_curve(cfg.curve), rng, CHUNK)
        return
    mean_gap = 1.0 / cfg.rate
    shape = 1.0 / (cfg.cv * cfg.cv)
    t = 0.0
    while True:
        if cfg.process == "poisson":
            gaps = rng.exponential(mean_gap, CHUNK)
        elif cfg.process == "deterministic":
            gaps = np.full(CHUNK, mean_gap)
        else:
            gaps = rng.gamma(shape, mean_gap / shape, CHUNK)
        times = t + np.cumsum(gaps)
        t = float(times[-1])
        yield times.tolist()


def draw_lengths(dist: LengthDist, rng: np.random.Generator, n: int, trace: Optional[Trace],
             rows: Optional[np.ndarray], name: str, top: int = MAX_TOKENS) -> list:
    """n token lengths (Python ints) from `dist`; `rows` index the trace for `dist='trace'`; a
    lognormal without `max` is clipped at `top`."""
    if dist.dist == "fixed":
        return [dist.value] * n
    if dist.dist == "uniform":
        return rng.integers(dist.min, dist.max + 1, n).tolist()
    if dist.dist == "lognormal":
        mu = math.log(dist.mean) - dist.sigma ** 2 / 2
        x = np.rint(rng.lognormal(mu, dist.sigma, n))
        return np.clip(x, dist.min or 1, dist.max or top).astype(np.int64).tolist()  # inf: top
    column = trace.prompt_len if name == "prompt_len" else trace.output_len
    return column[rows].tolist()


class PrefixGroups:
    """Which group each request joins (-1: none) and each group's shared prefix tokens."""

    def __init__(self, cfg: PrefixConfig, seed: int, rng: np.random.Generator):
        self.cfg, self.seed, self.rng = cfg, seed, rng
        self.prefix_len = cfg.prefix_len
        self._tokens: dict[int, np.ndarray] = {}

    def draw(self, n: int) -> list:
        joins = self.rng.random(n) < self.cfg.fraction
        group = self.rng.integers(0, self.cfg.num_groups, n)
        return np.where(joins, group, -1).tolist()

    def tokens(self, group: int, tail: Optional[np.ndarray] = None) -> np.ndarray:
        """The group's prefix, followed by `tail` when the request brings shareable tokens of its own."""
        prefix = self._tokens.get(group)
        if prefix is None:
            seq = np.random.SeedSequence(self.seed, spawn_key=(_GROUP_CONTENT_KEY, group))
            prefix = np.random.default_rng(seq).integers(0, VOCAB_SIZE, self.prefix_len, dtype=np.int32)
            prefix.flags.writeable = False
            self._tokens[group] = prefix
        if tail is None:
            return prefix
        out = np.concatenate([prefix, tail])
        out.flags.writeable = False
        return out


class PromptPool:
    """A fixed pool of whole prompts, as llm-d's inference-perf builds its shared_prefix data (its
    SharedPrefixDataGenerator, 2025-10): `num_groups` system prompts of `prefix_len` tokens, each followed
    by `prompts_per_group` questions of prompt_len tokens (drawn once per prompt); the pool shuffled once,
    then sent in that order over and over (request n sends prompt n mod its size). Its `tokens(k)` is the
    whole prompt k, the same read-only array every time it is sent, so prefix caching may hit all of it."""

    def __init__(self, cfg: PrefixConfig, wl, groups: PrefixGroups, prompt_rng, order_rng):
        size = cfg.num_groups * cfg.prompts_per_group
        questions = draw_lengths(wl.prompt_len, prompt_rng, size, None, None, "prompt_len")
        self.per_group, self.groups, self.seed = cfg.prompts_per_group, groups, groups.seed
        self.lengths = [cfg.prefix_len + q for q in questions]
        self.order = order_rng.permutation(size).tolist()
        self._tokens: dict[int, np.ndarray] = {}

    def tokens(self, k: int) -> np.ndarray:
        """Prompt k's token ids: its group's system prompt and its own question."""
        out = self._tokens.get(k)
        if out is None:
            seq = np.random.SeedSequence(self.seed, spawn_key=(_POOL_CONTENT_KEY, k))
            question = np.random.default_rng(seq).integers(0, VOCAB_SIZE, self.lengths[k] - self.groups.prefix_len,
                                                           dtype=np.int32)
            out = self._tokens[k] = self.groups.tokens(k // self.per_group, question)
        return out
