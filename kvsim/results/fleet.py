"""Answers over a day of an autoscaled pool: summary.json's `autoscaling` section.

`FleetObserver` is the engine's observer of an autoscaled (or fixed) pool: every step and rejection
goes on to the run's `Metrics`; it keeps, per finished request in finishing order, its arrival and
TPOT (its TTFT and whether it met the SLO are Metrics'), and the rejected requests' arrivals.
`fleet_summary` then gives, over the run:

- replicas over time: the pool's spec (starting and ready) and ready counts at every change;
- per window of `window_s` (by arrival): requests, offered rate, SLO attainment (the share meeting
  every per-request bound, a rejection a miss), TTFT and TPOT at p90 and p99, mean spec and ready
  replicas; and how many windows met the attainment target;
- overall: attainment, replica-hours (each replica billed from its creation, startup included, to
  its removal after draining or the end of the day), GPU-hours, $ at the catalog's (or [cost]'s) GPU
  price, $ per million tokens served (prompt and output) and per million output tokens;
- the autoscaler's settings, its decisions and the startup delay's parts with their sources.
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from kvsim.engine.records import StepRecord
    from kvsim.results.metrics import Metrics

QUANTILES = (90, 99)


class FleetObserver:
    """The run's observer for an autoscaled pool (module docstring)."""

    def __init__(self, metrics: Metrics):
        self.metrics, self.interval = metrics, metrics.interval
        self.arrivals = array("d")  # per finished request, in Metrics' finishing order
        self.tpot = array("d")  # its TPOT (NaN: one output token)
        self.rejected = array("d")  # arrival of each rejected request

    def on_reject(self, seq) -> None:
        self.metrics.on_reject(seq)
        self.rejected.append(seq.request.arrival_time)

    def on_held_back(self, step: StepRecord) -> None:
        self.metrics.on_held_back(step)

    def on_step(self, step: StepRecord) -> None:
        self.metrics.on_step(step)
        for seq in step.finished:
            self.arrivals.append(seq.request.arrival_time)
            n = seq.num_output_tokens
            self.tpot.append((seq.finish_time - seq.first_token_time) / (n - 1) if n > 1 else math.nan)


def replica_steps(changes: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, spec, ready) of a pool's changes, in time order, one row per instant (its last state)."""
    rows = sorted(enumerate(changes), key=lambda ic: (ic[1][0], ic[0]))
    t = np.array([c[0] for _, c in rows])
    keep = np.append(t[1:] != t[:-1], True) if len(t) else np.array([], dtype=bool)
    return t[keep], np.array([c[1] for _, c in rows])[keep], np.array([c[2] for _, c in rows])[keep]


def step_means(t: np.ndarray, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The time-average of the step function (t, y) over each [edges[i], edges[i + 1])."""
    grid = np.union1d(edges, t[(t > edges[0]) & (t < edges[-1])])
    idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 1)
    area = np.concatenate([[0.0], np.cumsum(y[idx[:-1]] * np.diff(grid))])
    at = area[np.searchsorted(grid, edges)]
    return np.diff(at) / np.diff(edges)


def _percentiles(values: np.ndarray, groups: np.ndarray, n: int) -> dict[int, list]:
    """Per group 0..n-1, each QUANTILES' percentile (linear) of `values` (NaN dropped), in ms."""
    out = {q: [None] * n for q in QUANTILES}
    ok = ~np.isnan(values)
    values, groups = values[ok], groups[ok]
    order = np.argsort(groups, kind="stable")
    values, groups = values[order], groups[order]
    bounds = np.searchsorted(groups, np.arange(n + 1))
    for g in range(n):
        part = values[bounds[g]:bounds[g + 1]]
        if len(part):
            for q, v in zip(QUANTILES, np.percentile(part, QUANTILES)):
                out[q][g] = float(v) * 1e3
    return out


def window_figures(obs: FleetObserver, changes: list[tuple], window_s: float, end_s: float,
                   target: float, start_s: float = 0.0) -> list[dict]:
    """Per window of arrivals from `start_s`: requests, attainment, latencies and replicas (module docstring)."""
    lat = obs.metrics.latencies()
    n = max(1, math.ceil((end_s - start_s) / window_s - 1e-9))
    arrivals = np.frombuffer(obs.arrivals, dtype=np.float64) - start_s
    win = np.clip((arrivals // window_s).astype(np.int64), 0, n - 1)
    rejected = np.clip(((np.frombuffer(obs.rejected, dtype=np.float64) - start_s) // window_s).astype(np.int64), 0, n - 1)
    finished = np.bincount(win, minlength=n)
    good = np.bincount(win, weights=~lat["missed"], minlength=n)
    received = finished + np.bincount(rejected, minlength=n)
    ttft = _percentiles(lat["ttft_s"], win, n)
    tpot = _percentiles(np.frombuffer(obs.tpot, dtype=np.float64), win, n)
    edges = np.minimum(start_s + np.arange(n + 1) * window_s, max(end_s, start_s + 1e-9))
    edges[-1] = max(end_s, edges[-2] + 1e-9)
    t, spec, ready = replica_steps(changes)
    spec_mean, ready_mean = step_means(t, spec, edges), step_means(t, ready, edges)
    rows = []
    for i in range(n):
        att = float(good[i] / received[i]) if received[i] else None
        rows.append({"start_s": float(edges[i]), "end_s": float(edges[i + 1]), "requests": int(received[i]),
                     "offered_rps": float(received[i] / (edges[i + 1] - edges[i])), "attainment": att,
                     "meets_target": att is None or att >= target,
                     "ttft_p90_ms": ttft[90][i], "ttft_p99_ms": ttft[99][i],
                     "tpot_p90_ms": tpot[90][i], "tpot_p99_ms": tpot[99][i],
                     "replicas_mean": float(spec_mean[i]), "ready_mean": float(ready_mean[i])})
    return rows


def billed_hours(members: list, horizon_s: float, start_s: float = 0.0) -> float:
    """Replica-hours: each replica from its creation (or `start_s`) to its removal (or the horizon)."""
    return sum(max(0.0, (m.removed if m.removed >= 0 else horizon_s) - max(m.created, start_s))
               for m in members) / 3600.0


def cost_figures(replica_hours: float, gpus_per_replica: int, price, tokens: int, output_tokens: int) -> dict:
    """GPU-hours, $ and $ per million tokens (None without a price)."""
    gpu_hours = replica_hours * gpus_per_replica
    usd = gpu_hours * price.usd_per_hour if price is not None else None
    per_m = lambda n: usd / n * 1e6 if usd is not None and n else None  # noqa: E731
    return {"replica_hours": replica_hours, "gpu_hours": gpu_hours, "usd": usd,
            "usd_per_m_tokens": per_m(tokens), "usd_per_m_output_tokens": per_m(output_tokens),
            "usd_per_gpu_hour": price.usd_per_hour if price is not None else None,
            "price_source": f"{price.source} ({price.date})" if price is not None else None}


def fleet_summary(obs: FleetObserver, members: list, changes: list[tuple], decisions: list[tuple], *,
                  window_s: float, end_s: float, horizon_s: float, target: float, price, gpus_per_replica: int,
                  autoscaler: dict, startup: Optional[dict], start_s: float = 0.0) -> dict:
    """summary.json's `autoscaling` section (module docstring). `start_s`, `end_s`: the arrivals'
    span (the windows; a window of a longer day starts late); `horizon_s`: until when replicas still
    running are billed (from `start_s`)."""
    m = obs.metrics
    windows = window_figures(obs, changes, window_s, end_s, target, start_s)
    hours = billed_hours(members, horizon_s, start_s)
    received = sum(w["requests"] for w in windows)
    good = m.num_good
    t, spec, ready = replica_steps(changes)
    return {
        "autoscaler": autoscaler,
        "startup": startup,
        "window_s": window_s,
        "attainment_target": target,
        "attainment": good / received if received else None,
        "windows_meeting_target": sum(1 for w in windows if w["meets_target"]),
        "num_windows": len(windows),
        "replicas": {"peak": int(spec.max()) if len(spec) else 0, "min": int(spec.min()) if len(spec) else 0,
                     "mean": hours * 3600.0 / (horizon_s - start_s) if horizon_s > start_s else None,
                     "created": len(members), "scale_decisions": len(decisions),
                     "times_s": t.tolist(), "spec": spec.tolist(), "ready": ready.tolist()},
        **cost_figures(hours, gpus_per_replica, price, m.prompt_tokens + m.output_tokens, m.output_tokens),
        "start_s": start_s,
        "horizon_s": horizon_s,
        "windows": windows,
    }
