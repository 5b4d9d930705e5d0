"""What an autoscaler sees: Prometheus scrapes of the replicas, the gateway and the cluster, read late.

`Scrapes` takes a sample every `interval` seconds (the fleet's scrape process calls `scrape`): per
replica that serves metrics (ready or draining: a starting vLLM serves /metrics only once its engine
is up) its waiting and running requests and KV-cache usage, the gauges vLLM exports as
vllm:num_requests_waiting, vllm:num_requests_running and vllm:kv_cache_usage_perc (a replica in a
fused decode run shows the run's blocks from its start: less than a block per running request);
the gateway's queue (requests held while no replica is ready); and kube-state-metrics' spec and
ready replica counts. A scrape taken at t is visible to queries from t + `delay`.

Queries mirror PromQL over the visible scrapes at `now`:
- `last`: each series' latest sample in the latest visible scrape (a replica gone from it is stale);
- `avg_over_time` / `max_over_time`: each series over the samples in (now - delay - window, now - delay],
  a replica removed within the window still counted, as Prometheus keeps its samples.

`Latencies` holds finished requests' TTFT and TPOT by finishing time, for an SLO-driven loop's
quantiles over a window (exact quantiles of the samples, where Prometheus' histogram_quantile
interpolates inside histogram buckets).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections import deque

import numpy as np

# index of each replica metric in a replica's sample tuple
FIELDS = {"num_requests_waiting": 0, "num_requests_running": 1, "kv_cache_usage_perc": 2}


class Scrapes:
    """Every scrape: its time, {replica index: (waiting, running, kv usage)}, the gateway's queue and
    the (spec, ready) replica counts; kept for `retention` seconds."""

    __slots__ = ("interval", "delay", "retention", "times", "replicas", "gateway", "counts")

    def __init__(self, interval: float, delay: float = 0.0, retention: float = 600.0):
        self.interval, self.delay, self.retention = interval, delay, retention + delay + interval
        self.times: deque[float] = deque()
        self.replicas: deque[dict] = deque()
        self.gateway: deque[int] = deque()
        self.counts: deque[tuple[int, int]] = deque()

    def scrape(self, now: float, reporting: list, gateway_queue: int, spec: int, ready: int) -> None:
        """A scrape at `now` of the `reporting` replicas (each with `index`, `scheduler`, `allocator`)."""
        values = {}
        for rep in reporting:
            sched, alloc = rep.scheduler, rep.allocator
            values[rep.index] = (len(sched.waiting), sched.num_running, alloc.num_used_blocks / alloc.num_blocks)
        self.times.append(now)
        self.replicas.append(values)
        self.gateway.append(gateway_queue)
        self.counts.append((spec, ready))
        while self.times and self.times[0] < now - self.retention:
            for q in (self.times, self.replicas, self.gateway, self.counts):
                q.popleft()

    def _visible(self, now: float) -> int:
        """How many scrapes are visible at `now` (the first ones)."""
        return bisect_right(self.times, now - self.delay)

    def last_time(self, now: float) -> float:
        """When the latest visible scrape was taken (-inf: none yet)."""
        n = self._visible(now)
        return self.times[n - 1] if n else -math.inf

    def _window(self, now: float, window: float) -> range:
        n = self._visible(now)
        start = bisect_right(self.times, now - self.delay - window, 0, n)
        return range(start, n)

    def replica_values(self, now: float, metric: str, query: str = "last", window: float = 60.0) -> dict[int, float]:
        """{replica index: value} of a replica metric, as `query` reads it (module docstring)."""
        f = FIELDS[metric]
        if query == "last":
            n = self._visible(now)
            return {i: v[f] for i, v in self.replicas[n - 1].items()} if n else {}
        out: dict[int, list] = {}
        for k in self._window(now, window):
            for i, v in self.replicas[k].items():
                out.setdefault(i, []).append(v[f])
        pick = max if query == "max_over_time" else (lambda xs: sum(xs) / len(xs))
        return {i: pick(xs) for i, xs in out.items()}

    def gateway_value(self, now: float, query: str = "last", window: float = 60.0) -> float:
        """The gateway's queue as `query` reads it (0 before any scrape)."""
        if query == "last":
            n = self._visible(now)
            return float(self.gateway[n - 1]) if n else 0.0
        xs = [self.gateway[k] for k in self._window(now, window)]
        if not xs:
            return 0.0
        return float(max(xs)) if query == "max_over_time" else sum(xs) / len(xs)

    def metric_total(self, now: float, metric: str, query: str = "last", window: float = 60.0) -> float:
        """sum(...) of a metric over the pool: the replicas' series, or the gateway's."""
        if metric in FIELDS:
            return float(sum(self.replica_values(now, metric, query, window).values()))
        return self.gateway_value(now, query, window)

    def replica_counts(self, now: float) -> tuple[int, int]:
        """kube-state-metrics' (spec, ready) replicas at the latest visible scrape ((0, 0) before any)."""
        n = self._visible(now)
        return self.counts[n - 1] if n else (0, 0)


class Latencies:
    """Finished requests' TTFT and TPOT (seconds) by finishing time, kept for `retention` seconds."""

    __slots__ = ("retention", "times", "ttft", "tpot_times", "tpot", "_start", "_tpot_start")

    def __init__(self, retention: float = 600.0):
        self.retention = retention
        self.times, self.ttft = array("d"), array("d")
        self.tpot_times, self.tpot = array("d"), array("d")
        self._start = self._tpot_start = 0

    def add(self, t: float, ttft: float, tpot: float | None) -> None:
        self.times.append(t)
        self.ttft.append(ttft)
        if tpot is not None:
            self.tpot_times.append(t)
            self.tpot.append(tpot)

    def quantiles(self, lo: float, hi: float, q: float) -> tuple[float, float]:
        """The q-quantile of TTFT and of TPOT over requests finished in (lo, hi] (NaN: none)."""
        self._trim(lo)
        return (_quantile(self.times, self.ttft, self._start, lo, hi, q),
                _quantile(self.tpot_times, self.tpot, self._tpot_start, lo, hi, q))

    def _trim(self, lo: float) -> None:
        """Forget what finished before the retention: compact the arrays when half is stale."""
        cut = lo - self.retention
        self._start = bisect_right(self.times, cut, self._start)
        self._tpot_start = bisect_right(self.tpot_times, cut, self._tpot_start)
        if self._start > 65536 and self._start > len(self.times) // 2:
            self.times, self.ttft = self.times[self._start:], self.ttft[self._start:]
            self._start = 0
        if self._tpot_start > 65536 and self._tpot_start > len(self.tpot_times) // 2:
            self.tpot_times, self.tpot = self.tpot_times[self._tpot_start:], self.tpot[self._tpot_start:]
            self._tpot_start = 0


def _quantile(times: array, values: array, start: int, lo: float, hi: float, q: float) -> float:
    a, b = bisect_right(times, lo, start), bisect_right(times, hi, start)
    if a >= b:
        return math.nan
    return float(np.quantile(np.frombuffer(values, dtype=np.float64)[a:b], q))
