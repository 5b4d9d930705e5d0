"""Metrics of a disaggregated deployment: summary.json's `disaggregation` section.

`DisaggregationObserver` is the engine's observer for both pools (every step and rejection goes on
to the run's `Metrics`, which keeps the requests, the time series and the KV integrals per replica)
and its `TransferObserver`. It adds, per pool, the time each instance was busy and what held its
admission back; per transfer, the blocks, tokens and bytes that crossed the link and when the link
was busy (bucketed by the time series' interval); and per finished request, where its time to first
token went:

    TTFT = queued (arrival to its prefill's first step) + prefill (to the prefill's token)
           + decode wait (to the read's start: the decode instance's admission)
           + transfer (to the whole KV on the decode side, after the prefill's end)
           + first token (the decode instance's first step for it)
           + API server (HTTP, tokenizing, streaming the token back: the run's request overhead,
             kvsim.perf.measured.request_overhead_s, 0 under the roofline)

so the parts of each request sum to its TTFT, as requests.csv and the SLO count it.

Layer-wise streaming overlaps the transfer with the prefill: only what follows the prefill's end
counts as transfer, and decode wait is then 0.

A pool's binding constraint: what held its admission back longest (for the decode pool, requests
waiting for its blocks, seats or token budget before their read count too), when that held it back
at least 1% of its instance-time; else its step time (with its busy share).
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING

import numpy as np

from kvsim.results.distributions import stats_of

if TYPE_CHECKING:
    from kvsim.engine.kv_transfer import KvTransfer
    from kvsim.engine.records import StepRecord
    from kvsim.results.metrics import Metrics

SPLIT = ("queued", "prefill", "decode_wait", "transfer", "first_token", "api_server")
BINDING_SHARE = 0.01  # held back this share of the pool's instance-time: the limit binds


class DisaggregationObserver:
    """Observer of both pools' replicas (prefill first: replicas [0, num_prefill)) and of the transfers."""

    def __init__(self, metrics: Metrics, num_prefill: int, num_decode: int):
        self.metrics, self.interval = metrics, metrics.interval
        self.num_prefill, self.num_decode = num_prefill, num_decode
        self.busy_s = [0.0] * (num_prefill + num_decode)
        self.held_back: tuple[dict, dict] = ({}, {})  # per pool: limit -> instance-seconds
        self.in_flight: dict = {}  # decode sequence -> its transfer, until it finishes
        self.split = {name: array("d") for name in SPLIT}
        self.count = self.blocks = self.tokens = self.decode_hit_tokens = 0
        self.link_s = array("d")
        self.buckets: dict[int, list] = {}  # link busy interval bucket -> [busy seconds, busiest-link bytes]

    # ---- the engine's observer, forwarded
    def on_reject(self, seq) -> None:
        self.metrics.on_reject(seq)

    def on_held_back(self, step: StepRecord) -> None:
        held = self.held_back[step.replica >= self.num_prefill]
        held[step.admission_limit] = held.get(step.admission_limit, 0.0) + step.duration
        self.metrics.on_held_back(step)

    def on_step(self, step: StepRecord) -> None:
        self.busy_s[step.replica] += step.duration
        for seq in step.finished:  # decode instances' only (the simulation clears a prefill step's)
            tr = self.in_flight.pop(seq, None)
            if tr is not None:
                self._split(tr)
        self.metrics.on_step(step)

    def _split(self, tr: KvTransfer) -> None:
        seq, split = tr.seq, self.split
        arrival, first = seq.request.arrival_time, tr.prefill_seq.first_scheduled_time
        after_prefill = max(tr.prefill_end, tr.start)
        for name, value in zip(SPLIT, (first - arrival, tr.prefill_end - first, after_prefill - tr.prefill_end,
                                       tr.end - after_prefill, seq.first_token_time - tr.end,
                                       self.metrics.request_overhead_s)):
            split[name].append(value)

    # ---- transfers
    def on_transfer(self, tr: KvTransfer) -> None:
        self.in_flight[tr.seq] = tr
        self.count += 1
        self.blocks += tr.blocks
        self.tokens += tr.tokens
        self.decode_hit_tokens += tr.decode_hit_tokens
        self.link_s.append(tr.link_s)
        self._bucket(tr.start, tr.data_end, tr.blocks)

    def _bucket(self, start: float, end: float, blocks: int) -> None:
        """The link's busy time [start, end) and its blocks, spread over the intervals it spans."""
        width = self.interval
        span = end - start
        b = int(start // width)
        while b * width < end:
            lo, hi = max(start, b * width), min(end, (b + 1) * width)
            slot = self.buckets.setdefault(b, [0.0, 0.0])
            slot[0] += hi - lo
            slot[1] += blocks * (hi - lo) / span if span > 0 else blocks
            b += 1

    # ---- summary
    def summary(self, duration_s: float, deployment: dict, pools: dict) -> dict:
        """The `disaggregation` section. `deployment`: `Disaggregation.describe()`; `pools`: per role
        its static figures (gpu, tensor_parallel_size, num_replicas, num_blocks_per_replica...)."""
        link_bytes = deployment["bytes_per_block"]["busiest_link"]
        egress = self.num_prefill
        out = dict(deployment)
        out["pools"] = {role: self._pool(role, i, duration_s, figures) for i, (role, figures) in enumerate(pools.items())}
        out["transfers"] = {
            "count": self.count, "blocks": self.blocks, "tokens": self.tokens,
            "bytes_all_links": self.blocks * deployment["bytes_per_block"]["all_links"],
            "bytes_busiest_link": self.blocks * link_bytes,
            "decode_prefix_hit_tokens": self.decode_hit_tokens,
            "link_s": stats_of(np.frombuffer(self.link_s, dtype=np.float64)),
            "link_busy_fraction": sum(self.link_s) / (duration_s * egress) if duration_s > 0 else None}
        out["ttft_split_s"] = {name: stats_of(np.frombuffer(v, dtype=np.float64)) for name, v in self.split.items()}
        keys = sorted(self.buckets)
        out["link_timeseries"] = {
            "interval_s": self.interval, "time_s": [k * self.interval for k in keys],
            "busy_fraction": [self.buckets[k][0] / (self.interval * egress) for k in keys],
            "gbytes_per_s": [self.buckets[k][1] * link_bytes / self.interval / 1e9 for k in keys]}
        return out

    def _pool(self, role: str, which: int, duration_s: float, figures: dict) -> dict:
        lo, n = (0, self.num_prefill) if which == 0 else (self.num_prefill, self.num_decode)
        series = [self.metrics.series(r) for r in range(lo, lo + n)]
        blocks = figures["num_blocks_per_replica"]
        span = sum(max(0.0, s.last_t - s.first_t) for s in series)
        busy = sum(self.busy_s[lo:lo + n]) / (duration_s * n) if duration_s > 0 else None
        held = dict(sorted(self.held_back[which].items()))
        binding, detail = _binding(held, busy, duration_s * n)
        return {**figures, "replicas": list(range(lo, lo + n)), "busy_fraction": busy,
                "kv_peak_used_fraction": max((s.peak_used for s in series), default=0) / blocks,
                "kv_mean_used_fraction": sum(s.used_seconds for s in series) / span / blocks if span > 0 else None,
                "admission_blocked_s": held, "binding": binding, "binding_detail": detail}


def _binding(held: dict, busy, instance_s: float) -> tuple[str, str]:
    limit = max(held, key=held.get, default=None)
    if limit is not None and instance_s > 0 and held[limit] >= BINDING_SHARE * instance_s:
        return limit, f"{limit} held admission back {held[limit] / instance_s:.1%} of the pool's instance-time"
    share = "" if busy is None or math.isnan(busy) else f" (busy {busy:.0%} of the time)"
    return "step_time", "nothing held admission back; its engines' step time" + share
