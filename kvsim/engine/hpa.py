"""Kubernetes' HorizontalPodAutoscaler algorithm (autoscaling/v2), as kube-controller-manager runs it.

Mirrors `pkg/controller/podautoscaler` of kubernetes/kubernetes (v1.27 and later: scale events of
both directions count in a policy's period; the newest stabilization, a recommendation clamped
between the lowest of the scale-up window and the highest of the scale-down window):

- replica calculators (replica_calculator.go): `pods_replicas` (a Pods metric, AverageValue:
  calcPlainMetricReplicas, with pending pods set aside and pods missing metrics counted as using the
  target on a scale-down and 0 on a scale-up), `external_average_replicas` (an External metric with
  an AverageValue target: GetExternalPerPodMetricReplicas) and `external_value_replicas` (a Value
  target: GetExternalMetricReplicas); each skips a change while the usage ratio is within
  1 ± tolerance;
- `Hpa.reconcile` (reconcileAutoscaler): the current count outside [min, max] is brought inside;
  else the metric's desired count goes through `normalize` (normalizeDesiredReplicasWithBehaviors):
  stabilization (recordInitialRecommendation, stabilizeRecommendationWithBehaviors) then the rate
  limits of the behavior's policies over their periods (convertDesiredReplicasWithBehaviorRate,
  calculateScaleUpLimitWithScalingRules, calculateScaleDownLimitWithBehaviors); a change is stored
  as a scale event (storeScaleEvent).

Times are simulated seconds passed in; a recommendation or event is in a window of w seconds at t
when it is younger than w (time.Time.After(t - w), strictly). Values are floats where Kubernetes
holds milli-quantities (a difference only below 0.001 per replica).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, slots=True)
class Rules:
    """One direction's HPAScalingRules, resolved: window, policy selection, (type, value, period) policies."""

    stabilization_s: float
    select: str  # "Max", "Min" or "Disabled"
    policies: tuple[tuple[str, int, float], ...]


# autoscaling/v2 defaults (SetDefaults_HorizontalPodAutoscalerBehavior; the scale-down window is the
# controller's --horizontal-pod-autoscaler-downscale-stabilization, 5 minutes)
SCALE_UP = Rules(0.0, "Max", (("Percent", 100, 15.0), ("Pods", 4, 15.0)))
SCALE_DOWN = Rules(300.0, "Max", (("Percent", 100, 15.0),))


def resolve_rules(cfg, default: Rules) -> Rules:
    """A `[autoscaling.behavior.scale_up|down]` table (kvsim.scenario.autoscaling.ScalingRules or None)
    over `default`: unset keys keep the default's, as the API server fills them."""
    if cfg is None:
        return default
    return Rules(default.stabilization_s if cfg.stabilization_window_seconds is None else float(cfg.stabilization_window_seconds),
                 cfg.select_policy or default.select,
                 default.policies if cfg.policies is None else tuple((p.type, p.value, float(p.period_seconds))
                                                                    for p in cfg.policies))


# ---- replica calculators (replica_calculator.go) -----------------------------------------------

def pods_replicas(current: int, values: list[float], missing: int, unready: int, target: float,
                  tolerance: float) -> int:
    """A Pods metric with an AverageValue target: `values` of the ready pods that report it, `missing`
    Running pods without metrics, `unready` Pending pods (calcPlainMetricReplicas, groupPods)."""
    if not values:
        return current  # "did not receive metrics for any ready pods": no scaling
    ratio = sum(values) / len(values) / target
    rebalance_unready = unready > 0 and ratio > 1.0
    if not rebalance_unready and not missing:
        return current if abs(1.0 - ratio) <= tolerance else math.ceil(ratio * len(values))
    total, count = sum(values), len(values)
    if missing:  # set aside: the target on a scale-down, 0 on a scale-up
        total += missing * target if ratio < 1.0 else 0.0
        count += missing
    if rebalance_unready:  # pending pods as using 0 on a scale-up
        count += unready
    new_ratio = total / count / target
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current  # too small, or the direction would flip
    replicas = math.ceil(new_ratio * count)
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current
    return replicas


def external_average_replicas(status_replicas: int, total: float, target: float, tolerance: float) -> int:
    """An External metric with an AverageValue target: `total` over the pool (GetExternalPerPodMetricReplicas)."""
    if status_replicas == 0:
        return math.ceil(total / target)
    ratio = total / (target * status_replicas)
    return math.ceil(total / target) if abs(1.0 - ratio) > tolerance else status_replicas


def external_value_replicas(current: int, ready: int, value: float, target: float, tolerance: float) -> int:
    """An External metric with a Value target (GetExternalMetricReplicas, getUsageRatioReplicaCount):
    ceil(ratio × ready pods), or ceil(ratio) from zero."""
    ratio = value / target
    if current == 0:
        return math.ceil(ratio)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(ratio * ready)


# ---- the controller's normalization (horizontal.go) -------------------------------------------

class Hpa:
    """One HPA's state between reconciles: recommendations and scale events, with their times."""

    __slots__ = ("min_replicas", "max_replicas", "up", "down", "recommendations", "up_events", "down_events")

    def __init__(self, min_replicas: int, max_replicas: int, up: Rules = SCALE_UP, down: Rules = SCALE_DOWN):
        self.min_replicas, self.max_replicas, self.up, self.down = min_replicas, max_replicas, up, down
        self.recommendations: list[tuple[float, int]] = []  # (time, unstabilized desired)
        self.up_events: list[tuple[float, int]] = []  # (time, replicas added)
        self.down_events: list[tuple[float, int]] = []  # (time, replicas removed)

    def reconcile(self, now: float, current: int, metric_desired: Optional[int]) -> int:
        """The new replica count for the scale's `current` count and the metric's desired one (None:
        the metric could not be computed: no change unless out of bounds); records a change."""
        if not self.recommendations:  # recordInitialRecommendation
            self.recommendations.append((now, current))
        if current == 0 and self.min_replicas != 0:
            return 0  # ScalingDisabled: the target was scaled to zero by someone else
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        elif metric_desired is None:
            return current
        else:
            desired = self.normalize(now, current, metric_desired)
        if desired != current:
            self._store_event(now, current, desired)
        return desired

    def normalize(self, now: float, current: int, desired: int) -> int:
        """Stabilize, then rate-limit (normalizeDesiredReplicasWithBehaviors)."""
        return self._rate_limited(now, current, self._stabilized(now, current, desired))

    def _stabilized(self, now: float, current: int, desired: int) -> int:
        """The recommendation clamped to [lowest in the up window, highest in the down window]; the
        unstabilized `desired` is recorded, in the place of one older than both windows."""
        up_cut, down_cut = now - self.up.stabilization_s, now - self.down.stabilization_s
        up_rec = down_rec = desired
        old = -1
        for i, (t, rec) in enumerate(self.recommendations):
            if t > up_cut:
                up_rec = min(up_rec, rec)
            if t > down_cut:
                down_rec = max(down_rec, rec)
            if t < up_cut and t < down_cut:
                old = i
        recommendation = min(max(current, up_rec), down_rec)
        if old >= 0:
            self.recommendations[old] = (now, desired)
        else:
            self.recommendations.append((now, desired))
        return recommendation

    def _rate_limited(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = max(self._up_limit(now, current), current)
            return min(desired, self.max_replicas, limit)
        if desired < current:
            limit = min(self._down_limit(now, current), current)
            return max(desired, self.min_replicas, limit)
        return desired

    def _changes(self, events: list[tuple[float, int]], now: float, period: float) -> int:
        return sum(n for t, n in events if t > now - period)

    def _up_limit(self, now: float, current: int) -> int:
        rules = self.up
        if rules.select == "Disabled":
            return current
        pick, result = (min, math.inf) if rules.select == "Min" else (max, -math.inf)
        for kind, value, period in rules.policies:
            start = current - self._changes(self.up_events, now, period) + self._changes(self.down_events, now, period)
            proposed = start + value if kind == "Pods" else math.ceil(start * (1 + value / 100))
            result = pick(result, proposed)
        return int(result)

    def _down_limit(self, now: float, current: int) -> int:
        rules = self.down
        if rules.select == "Disabled":
            return current
        pick, result = (max, -math.inf) if rules.select == "Min" else (min, math.inf)
        for kind, value, period in rules.policies:
            start = current + self._changes(self.down_events, now, period) - self._changes(self.up_events, now, period)
            proposed = start - value if kind == "Pods" else int(start * (1 - value / 100))
            result = pick(result, proposed)
        return int(result)

    def _store_event(self, now: float, previous: int, new: int) -> None:
        """storeScaleEvent: the change replaces an event older than the direction's longest period."""
        up = new > previous
        events = self.up_events if up else self.down_events
        longest = max((p for _, _, p in (self.up if up else self.down).policies), default=0.0)
        event = (now, abs(new - previous))
        for i, (t, _) in enumerate(events):
            if t < now - longest:
                events[i] = event
                return
        events.append(event)
