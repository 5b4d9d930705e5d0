"""Autoscalers: each decides a pool's replica count from what it observes (`interfaces.Autoscaler`).

The fleet (kvsim/engine/fleet.py) calls `desired(view)` every `period_s` seconds with a `FleetView`:
the scale's replicas (spec: starting and ready, not draining), how many are ready, how many are
Pending, the metrics pipeline (kvsim/engine/observe.py) and finished requests' latencies; it scales
to the count returned. Every autoscaler that actuates through Kubernetes ends in an HPA
(kvsim/engine/hpa.py) with its behavior, as the products deploy it:

- `FixedPool`: always `replicas`.
- `HpaAutoscaler`: a HorizontalPodAutoscaler on one metric (Pods or External), every sync period.
- `KedaAutoscaler`: a KEDA ScaledObject with a Prometheus trigger: KEDA's HPA on the External metric
  while replicas run; every `polling_interval_s` the trigger's activity (metric > activation
  threshold) wakes a pool at zero, and a pool with `min_replicas = 0` inactive for
  `cooldown_period_s` goes to zero (KEDA's scale_handler).
- `WvaAutoscaler`: llm-d's Workload Variant Autoscaler, saturation analyzer v1
  (internal/saturation/analyzer.go, one variant): every `interval_s` it takes each replica's peak KV
  usage and queue over the last minute; replicas at or over a threshold are saturated; the others'
  mean spare capacity below a trigger asks for ready + 1; a redistribution of their load over one
  replica fewer that keeps both spares at or above the triggers allows ready - 1 (with two or more
  non-saturated replicas); while a previous decision is not reached (desired != current) or some
  replicas report no metrics (metrics != current) it holds. Its target is exported as
  wva_desired_replicas, scraped, and an HPA follows it (External, AverageValue 1; the WVA sample
  HPA's behavior: no stabilization, 10 Pods per 15 s). The analyzer asks for as few as 1 replica
  and then holds while its last target differs from the current count: under an HPA whose
  minReplicas is above what it asked for, the target is never reached and it holds for good, as the
  controller does (keep that HPA's minReplicas at 1, the sample's).
- `SloAwareAutoscaler`: llm-d's SLO-aware loop (llm-d guides/workload-autoscaling/README.slo-aware.md):
  every `rule_interval_s` s_raw = max(P90 TTFT / TTFT SLO, P90 TPOT / TPOT SLO) over the last minute's
  requests (0 without traffic), clamped at C; s = its average over the smoothing window; at each HPA
  sync the KEDA formula d = n + ceil(n (s c / θ_up - 1)) above θ_up (c = r / n while 0 < r < n, else
  1), n - floor(n (1 - s / θ_dn)) below θ_dn, else n (n: spec replicas, r: ready, from
  kube-state-metrics), through KEDA's HPA (AverageValue 1; the guide's behavior).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from kvsim.engine.hpa import (SCALE_DOWN, SCALE_UP, Hpa, Rules, external_average_replicas, external_value_replicas,
                              pods_replicas)
from kvsim.engine.observe import FIELDS, Latencies, Scrapes

# The WVA sample HPA (config/samples/hpa-integration.yaml) and the SLO-aware guide's behaviors
WVA_UP = Rules(0.0, "Max", (("Pods", 10, 15.0),))
WVA_DOWN = Rules(0.0, "Max", (("Pods", 10, 15.0),))
SLO_UP = Rules(30.0, "Max", (("Percent", 100, 60.0), ("Pods", 4, 60.0)))
SLO_DOWN = Rules(180.0, "Max", (("Pods", 1, 120.0),))
EPS = 1e-9


@dataclass(slots=True)
class FleetView:
    """What an autoscaler observes at `now`: the scale (`spec` replicas: starting and ready), the
    ready ones, those Pending (node or container starting: no metrics) and Running without metrics
    yet, the indices of the non-draining replicas, the metrics pipeline and latencies."""

    now: float
    spec: int
    ready: int
    pending: int
    starting_running: int
    live: frozenset
    scrapes: Scrapes
    latencies: Optional[Latencies] = None


@dataclass(slots=True)
class Loop:
    """A periodic loop inside an autoscaler: due at multiples of `period` (on the first call at or after)."""

    period: float
    due: float = 0.0

    def fire(self, now: float) -> bool:
        if now + EPS < self.due:
            return False
        self.due = (math.floor((now + EPS) / self.period) + 1) * self.period
        return True


class FixedPool:
    name = "fixed"

    def __init__(self, replicas: int):
        self.replicas, self.period_s = replicas, math.inf

    def desired(self, view: FleetView) -> int:
        return self.replicas

    def describe(self) -> dict:
        return {"policy": self.name, "replicas": self.replicas}


def metric_desired(view: FleetView, metric: str, source: str, target_type: str, target: float, query: str,
                   window: float, tolerance: float) -> Optional[int]:
    """The HPA's desired replicas for one metric (its replica calculator), None when it cannot say."""
    s = view.scrapes
    if source == "pods":
        values = s.replica_values(view.now, metric, query, window)
        live = [values[i] for i in sorted(values) if i in view.live]  # terminating pods are dropped
        missing = view.starting_running + max(0, view.ready - len(live))  # running, no metrics yet
        return pods_replicas(view.spec, live, missing, view.pending, target, tolerance) if live else None
    total = s.metric_total(view.now, metric, query, window)
    if target_type == "AverageValue":
        return external_average_replicas(view.spec, total, target, tolerance)
    return external_value_replicas(view.spec, view.ready, total, target, tolerance)


class HpaAutoscaler:
    name = "hpa"

    def __init__(self, cfg, hpa: Hpa):
        self.cfg, self.hpa, self.period_s = cfg, hpa, cfg.sync_period_s

    def desired(self, view: FleetView) -> int:
        c = self.cfg
        want = metric_desired(view, c.metric, c.source, c.target_type, c.target, c.query, c.query_window_s, c.tolerance)
        return self.hpa.reconcile(view.now, view.spec, want)

    def describe(self) -> dict:
        return {"policy": self.name, **self.cfg.model_dump(), **_bounds(self.hpa)}


class KedaAutoscaler:
    name = "keda"

    def __init__(self, cfg, hpa: Hpa, min_replicas: int):
        self.cfg, self.hpa, self.min_replicas, self.period_s = cfg, hpa, min_replicas, cfg.sync_period_s
        self.poll, self.last_active = Loop(cfg.polling_interval_s), -math.inf

    def desired(self, view: FleetView) -> int:
        c, now = self.cfg, view.now
        if self.poll.fire(now):  # KEDA's scale loop: the trigger's activity
            if view.scrapes.metric_total(now, c.metric, c.query, c.query_window_s) > c.activation_threshold:
                self.last_active = now
            if view.spec == 0:
                return max(1, self.min_replicas) if self.last_active == now else 0
            if self.min_replicas == 0 and now - self.last_active >= c.cooldown_period_s:
                return 0
        if view.spec == 0:
            return 0
        want = metric_desired(view, c.metric, "external", c.metric_type, c.threshold, c.query, c.query_window_s,
                              c.tolerance)
        return self.hpa.reconcile(now, view.spec, want)

    def describe(self) -> dict:
        return {"policy": self.name, **self.cfg.model_dump(), **_bounds(self.hpa)}


class WvaAutoscaler:
    name = "wva"

    def __init__(self, cfg, hpa: Hpa):
        self.cfg, self.hpa, self.period_s = cfg, hpa, cfg.sync_period_s
        self.loop, self.target = Loop(cfg.interval_s), 0  # 0: no decision yet (the VA's status)
        self.emitted: list[tuple[float, int]] = []  # (time, wva_desired_replicas)

    def analyze(self, view: FleetView) -> int:
        """CalculateSaturationTargets for one variant: the new target (module docstring)."""
        c, s = self.cfg, view.scrapes
        kv = s.replica_values(view.now, "kv_cache_usage_perc", "max_over_time", c.query_window_s)
        queue = s.replica_values(view.now, "num_requests_waiting", "max_over_time", c.query_window_s)
        spare = [(c.kv_cache_threshold - kv[i], c.queue_length_threshold - queue[i]) for i in kv
                 if kv[i] < c.kv_cache_threshold and queue[i] < c.queue_length_threshold]
        n = len(spare)
        spare_kv = sum(x for x, _ in spare) / n if n else 0.0
        spare_q = sum(y for _, y in spare) / n if n else 0.0
        if (self.target and self.target != view.spec) or len(kv) != view.spec:
            return self.target if self.target and self.target != view.spec else view.spec  # in transition
        if not kv:
            return view.spec
        if spare_kv < c.kv_spare_trigger or spare_q < c.queue_spare_trigger:
            return len(kv) + 1 if view.spec == view.ready else len(kv)  # pending replicas: no cascade
        if n >= 2 and _scale_down_safe(c, spare_kv, spare_q, n) and len(kv) > 1:
            return len(kv) - 1
        return len(kv)

    def desired(self, view: FleetView) -> int:
        if self.loop.fire(view.now):
            self.target = self.analyze(view)
            self.emitted.append((view.now, self.target))
        seen = view.scrapes.last_time(view.now)  # the gauge as Prometheus last scraped it (after it was set)
        value = next((v for t, v in reversed(self.emitted) if t < seen), None)
        want = None if value is None else external_average_replicas(view.spec, value, 1.0, self.cfg.tolerance)
        return self.hpa.reconcile(view.now, view.spec, want)

    def describe(self) -> dict:
        return {"policy": self.name, **self.cfg.model_dump(), **_bounds(self.hpa)}


def _scale_down_safe(c, spare_kv: float, spare_q: float, n: int) -> bool:
    """isScaleDownSafe: the non-saturated replicas' load over n - 1 of them keeps both spares."""
    factor = n / (n - 1)
    kv_after = c.kv_cache_threshold - (c.kv_cache_threshold - spare_kv) * factor
    q_after = c.queue_length_threshold - (c.queue_length_threshold - spare_q) * factor
    return kv_after >= c.kv_spare_trigger and q_after >= c.queue_spare_trigger


@dataclass(slots=True)
class SloSignal:
    """The recording rules' series: (time, clamped saturation) samples."""

    samples: list = field(default_factory=list)

    def smoothed(self, now: float, window: float) -> float:
        xs = [v for t, v in self.samples if now - window < t <= now]
        return sum(xs) / len(xs) if xs else 0.0


class SloAwareAutoscaler:
    name = "slo_aware"

    def __init__(self, cfg, hpa: Hpa, ttft_slo_s: float, tpot_slo_s: float):
        self.cfg, self.hpa, self.period_s = cfg, hpa, cfg.sync_period_s
        self.ttft_slo_s, self.tpot_slo_s = ttft_slo_s, tpot_slo_s
        self.rules, self.signal = Loop(cfg.rule_interval_s), SloSignal()

    def record(self, view: FleetView) -> float:
        """One evaluation of the recording rules: the clamped saturation sample at `view.now`."""
        c = self.cfg
        seen = view.scrapes.last_time(view.now)
        ttft, tpot = view.latencies.quantiles(seen - c.rate_window_s, seen, c.quantile)
        raw = max(0.0 if math.isnan(ttft) else ttft / self.ttft_slo_s, 0.0 if math.isnan(tpot) else tpot / self.tpot_slo_s)
        sample = min(raw, c.clamp)
        self.signal.samples.append((view.now, sample))
        if len(self.signal.samples) > 4096:
            del self.signal.samples[:2048]
        return sample

    def formula(self, s: float, n: int, r: int) -> int:
        """The ScaledObject's scalingModifiers formula: desired replicas d (module docstring)."""
        c = self.cfg
        if n <= 0:
            return 0
        if s > c.scale_up_threshold:
            credit = r / n if 0 < r < n else 1.0
            return n + math.ceil(n * (s * credit / c.scale_up_threshold - 1))
        if s < c.scale_down_boundary:
            return n - math.floor(n * (1 - s / c.scale_down_boundary))
        return n

    def desired(self, view: FleetView) -> int:
        if self.rules.fire(view.now):
            self.record(view)
        s = self.signal.smoothed(view.now, self.cfg.smoothing_window_s)
        n, r = view.scrapes.replica_counts(view.now)
        if n == 0:
            return self.hpa.reconcile(view.now, view.spec, None)
        d = self.formula(s, n, r)
        return self.hpa.reconcile(view.now, view.spec, external_average_replicas(view.spec, d, 1.0, self.cfg.tolerance))

    def describe(self) -> dict:
        return {"policy": self.name, **self.cfg.model_dump(), "ttft_slo_ms": self.ttft_slo_s * 1e3,
                "tpot_slo_ms": self.tpot_slo_s * 1e3, **_bounds(self.hpa)}


def _bounds(hpa: Hpa) -> dict:
    rules = lambda r: {"stabilization_window_seconds": r.stabilization_s, "select_policy": r.select,  # noqa: E731
                       "policies": [{"type": t, "value": v, "period_seconds": p} for t, v, p in r.policies]}
    return {"min_replicas": hpa.min_replicas, "max_replicas": hpa.max_replicas,
            "behavior": {"scale_up": rules(hpa.up), "scale_down": rules(hpa.down)}}


def make_autoscaler(auto, slo, fixed_replicas: int = 1):
    """The autoscaler of an `[autoscaling]` section (kvsim.scenario.autoscaling.AutoscalingConfig);
    `slo`: the scenario's [slo] (the SLO-aware loop's default SLOs)."""
    from kvsim.engine.hpa import resolve_rules
    from kvsim.scenario.autoscaling import SloAwareConfig, WvaConfig

    if auto.policy == "fixed":
        return FixedPool(auto.fixed.replicas if auto.fixed and auto.fixed.replicas else fixed_replicas)
    up, down = {"wva": (WVA_UP, WVA_DOWN), "slo_aware": (SLO_UP, SLO_DOWN)}.get(auto.policy, (SCALE_UP, SCALE_DOWN))
    b = auto.behavior
    hpa = Hpa(max(1, auto.min_replicas), auto.max_replicas, resolve_rules(b and b.scale_up, up),
              resolve_rules(b and b.scale_down, down))
    if auto.policy == "hpa":
        return HpaAutoscaler(auto.hpa, hpa)
    if auto.policy == "keda":
        return KedaAutoscaler(auto.keda, hpa, auto.min_replicas)
    if auto.policy == "wva":
        return WvaAutoscaler(auto.wva or WvaConfig(), hpa)
    cfg = auto.slo_aware or SloAwareConfig()
    ttft = cfg.ttft_slo_ms or slo.ttft_ms or 3000.0
    tpot = cfg.tpot_slo_ms or slo.tpot_ms or 100.0
    return SloAwareAutoscaler(cfg, hpa, ttft / 1e3, tpot / 1e3)


__all__ = ["FIELDS", "FleetView", "FixedPool", "HpaAutoscaler", "KedaAutoscaler", "WvaAutoscaler",
           "SloAwareAutoscaler", "make_autoscaler"]
