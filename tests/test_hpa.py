"""Kubernetes' HPA algorithm (kvsim.engine.hpa) replays the documented examples decision by decision:
kubernetes.io "Horizontal Pod Autoscaling" (the algorithm, the default behavior, the scaling-policy
example, selectPolicy Min, Disabled) and KEP-853's user stories (configurable scale velocity)."""

from kvsim.engine.hpa import (SCALE_DOWN, SCALE_UP, Hpa, Rules, external_average_replicas,
                              external_value_replicas, pods_replicas)


def replay(hpa: Hpa, current: int, desired, period: float, until: float, start: float = 0.0) -> list[tuple]:
    """Run the controller every `period` s: `desired(t)` is the metric's recommendation; returns the
    (time, new count) of every change."""
    changes, t = [], start
    while t <= until + 1e-9:
        new = hpa.reconcile(t, current, desired(t) if callable(desired) else desired)
        if new != current:
            changes.append((t, new))
        current, t = new, t + period
    return changes


# ---- the algorithm ---------------------------------------------------------------------------------

def test_desired_replicas_is_the_ratio_of_current_to_target_metric():
    """'if the current metric value is 200m, and the desired value is 100m, the number of replicas will
    be doubled ... If the current value is instead 50m, you'll halve the number of replicas'."""
    assert pods_replicas(4, [0.2] * 4, 0, 0, 0.1, 0.1) == 8
    assert pods_replicas(4, [0.05] * 4, 0, 0, 0.1, 0.1) == 2
    # 'The control plane skips any scaling action if the ratio is sufficiently close to 1.0 (0.1)'
    assert pods_replicas(10, [1.09] * 10, 0, 0, 1.0, 0.1) == 10
    assert pods_replicas(10, [1.11] * 10, 0, 0, 1.0, 0.1) == 12  # ceil(11.1)
    # the v1.33 blog's example: 50 replicas at 90% CPU, target 75%: 50 x 90/75 = 60
    assert pods_replicas(50, [90.0] * 50, 0, 0, 75.0, 0.1) == 60


def test_missing_and_not_yet_ready_pods_dampen_as_documented():
    """'assuming those pods were consuming 100% of the desired value in case of a scale down, and 0%
    in case of a scale up ... If the new ratio reverses the scale direction, or is within the
    tolerance, the controller doesn't take any scaling action.'"""
    # scale down, one Running pod without metrics counted at the target: (2 + 2 + 5) / 3 / 5 -> ceil(1.8)
    assert pods_replicas(3, [2.0, 2.0], 1, 0, 5.0, 0.1) == 2
    assert pods_replicas(2, [2.0, 2.0], 0, 0, 5.0, 0.1) == 1  # without it: ceil(0.8)
    # scale up with a Pending pod counted as 0: (6 + 6 + 0) / 3 / 5 = 0.8 reverses the direction: hold
    assert pods_replicas(3, [6.0, 6.0], 0, 1, 5.0, 0.1) == 3
    assert pods_replicas(2, [6.0, 6.0], 0, 0, 5.0, 0.1) == 3  # without it: ceil(2.4)
    # no metrics at all: no scaling
    assert pods_replicas(3, [], 3, 0, 5.0, 0.1) == 3


def test_external_metric_targets():
    """AverageValue: ceil(total / target) unless total / (target x replicas) is within tolerance;
    Value: ceil(ratio x ready pods)."""
    assert external_average_replicas(4, 10.0, 1.0, 0.1) == 10
    assert external_average_replicas(10, 11.0, 1.0, 0.1) == 11  # 1.1: |1 - 1.1| > 0.1 in float64, as Go's
    assert external_average_replicas(10, 10.5, 1.0, 0.1) == 10
    assert external_value_replicas(4, 4, 30.0, 10.0, 0.1) == 12
    assert external_value_replicas(0, 0, 30.0, 10.0, 0.1) == 3  # from zero: ceil(ratio)


# ---- behavior ------------------------------------------------------------------------------------

def test_default_scale_up_adds_4_pods_or_100_percent_every_15_seconds():
    """Defaults: 'There are 2 policies where 4 pods or a 100% of the currently running replicas will
    be added every 15 seconds till the HPA reaches its steady state'; no stabilization up."""
    changes = replay(Hpa(1, 100), 1, 100, 15.0, 120.0)
    assert changes == [(0.0, 5), (15.0, 10), (30.0, 20), (45.0, 40), (60.0, 80), (75.0, 100)]


def test_default_scale_down_waits_the_300_second_stabilization_window():
    """'For scaling down the stabilization window is 300 seconds ... a 100% of the currently running
    replicas to be removed which means the scaling target can be scaled down to the minimum'."""
    changes = replay(Hpa(1, 100), 10, 1, 15.0, 600.0)
    assert changes == [(300.0, 1)]  # the initial recommendation (10) ages out of the window at 300


def test_scaling_policies_example_80_to_10():
    """Pods 4 / Percent 10 per 60 s (Max): 'if there are 80 replicas and the target has to be scaled
    down to 10 replicas then during the first step 8 replicas will be reduced. In the next iteration
    when the number of replicas is 72, 10% of the pods is 7.2 but the number is rounded up to 8 ...
    When the number of replicas falls below 40 the first policy (Pods) is applied and 4 replicas will
    be reduced at a time.' (stabilization 0: the policies alone)."""
    hpa = Hpa(1, 100, SCALE_UP, Rules(0.0, "Max", (("Pods", 4, 60.0), ("Percent", 10, 60.0))))
    changes = replay(hpa, 80, 10, 15.0, 900.0)
    counts = [80] + [n for _, n in changes]
    assert [t for t, _ in changes] == [60.0 * i for i in range(len(changes))]  # one step a period
    removed = [a - b for a, b in zip(counts, counts[1:])]
    assert counts[:3] == [80, 72, 64] and removed[:2] == [8, 8]
    assert all(r == 4 for a, r in zip(counts, removed) if a <= 40 and a - 4 >= 10)
    assert counts[-1] == 10


def test_select_policy_min_removes_no_more_than_5_pods_a_minute():
    """'To ensure that no more than 5 Pods are removed per minute ... set selectPolicy to minimum':
    Percent 10 and Pods 5 per 60 s, Min."""
    hpa = Hpa(1, 200, SCALE_UP, Rules(0.0, "Min", (("Percent", 10, 60.0), ("Pods", 5, 60.0))))
    changes = replay(hpa, 100, 1, 15.0, 180.0)
    assert changes == [(0.0, 95), (60.0, 90), (120.0, 85), (180.0, 80)]
    hpa = Hpa(1, 200, SCALE_UP, Rules(0.0, "Min", (("Percent", 10, 60.0), ("Pods", 5, 60.0))))
    assert replay(hpa, 20, 1, 15.0, 0.0) == [(0.0, 18)]  # 10% of 20 is the smaller change


def test_disabled_select_policy_never_scales_that_way():
    """'Setting the value to Disabled completely disables scaling in that direction' (KEP story 4)."""
    hpa = Hpa(1, 100, SCALE_UP, Rules(300.0, "Disabled", (("Percent", 100, 15.0),)))
    assert replay(hpa, 10, 1, 15.0, 1200.0) == []
    hpa = Hpa(1, 100, SCALE_UP, Rules(300.0, "Disabled", (("Percent", 100, 15.0),)))
    assert replay(hpa, 10, 30, 15.0, 15.0) == [(0.0, 20), (15.0, 30)]  # up as usual: 100% per 15 s


def test_kep_story_1_scale_up_as_fast_as_possible():
    """Percent 900 per 60 s from 1 pod: '1 -> 10 -> 100 -> 1000'."""
    hpa = Hpa(1, 10_000, Rules(0.0, "Max", (("Percent", 900, 60.0),)), SCALE_DOWN)
    assert replay(hpa, 1, 10_000, 15.0, 180.0)[:3] == [(0.0, 10), (60.0, 100), (120.0, 1000)]


def test_kep_story_3_scale_up_very_gradually():
    """Pods 1 per 300 s from 1 pod: '1 -> 2 -> 3 -> 4'."""
    hpa = Hpa(1, 100, Rules(0.0, "Max", (("Pods", 1, 300.0),)), SCALE_DOWN)
    assert replay(hpa, 1, 4, 60.0, 1200.0) == [(0.0, 2), (300.0, 3), (600.0, 4)]


def test_kep_story_2_scale_down_one_pod_every_10_minutes():
    """scaleDown Pods 1 per 600 s: 'the target will scale down by only one pod every 10 minutes'. The
    first pod goes once the default 300 s stabilization window has passed (the KEP's '1000 -> 1000 ->
    … (7 more min) -> 999' counts ten minutes to it), then one every 600 s."""
    hpa = Hpa(1, 1000, SCALE_UP, Rules(300.0, "Max", (("Pods", 1, 600.0),)))
    assert replay(hpa, 1000, 1, 60.0, 1500.0) == [(300.0, 999), (900.0, 998), (1500.0, 997)]


def test_kep_story_5_stabilization_before_scaling_down():
    """stabilizationWindowSeconds 600, Pods 5 per 60 s, CurReplicas 10, one cycle a minute; the
    recommendations [10, 9, 8, 9, 9, 8, 9, 8, 9] then 8 at the 10th minute: 'the algorithm picks the
    largest one 10 ... will not change'; 7 at the 11th minute, the first one dropped: 'picks 9 and
    changes the number of replicas 10 -> 9'."""
    recs = [10, 9, 8, 9, 9, 8, 9, 8, 9, 8, 7]
    hpa = Hpa(1, 100, SCALE_UP, Rules(600.0, "Max", (("Pods", 5, 60.0),)))
    current, decisions = 10, []
    for minute, rec in enumerate(recs, start=1):
        current = hpa.reconcile(60.0 * minute, current, rec)
        decisions.append(current)
    assert decisions == [10] * 10 + [9]


def test_kep_story_6_avoid_false_positive_signals_for_scaling_up():
    """stabilizationWindowSeconds 300 up, Pods 20 per 60 s, CurReplicas 2, one cycle a minute,
    recommendations [2, 3, 19, 10, 3], then 4, then 7: the smallest in the window is applied.

    The KEP narrates the 6th minute keeping six recommendations (the first, exactly 300 s old,
    included: 'picks the smallest one 2') and the 7th dropping it ('picks 3, 2 -> 3'). The
    controller keeps a recommendation while it is strictly younger than the window
    (timestamp.After(now - window)), so at a one-minute cycle the first one leaves at the 6th minute
    and the step comes one cycle earlier; with the recommendations a second younger (a controller
    cycle is never exact) the KEP's timeline is replayed to the minute."""
    recs = [2, 3, 19, 10, 3, 4, 7]

    def run(skew: float) -> list[int]:
        hpa = Hpa(1, 100, Rules(300.0, "Max", (("Pods", 20, 60.0),)), SCALE_DOWN)
        current, out = 2, []
        for minute, rec in enumerate(recs, start=1):
            t = 60.0 * minute + (skew if minute == 1 else 0.0)
            current = hpa.reconcile(t, current, rec)
            out.append(current)
        return out

    assert run(1.0) == [2, 2, 2, 2, 2, 2, 3]  # the KEP's narration
    assert run(0.0) == [2, 2, 2, 2, 2, 3, 3]  # exact minutes: the 300-s-old one is out at minute 6


def test_bounds_come_first():
    """A current count above maxReplicas or below minReplicas is brought inside before any metric."""
    assert Hpa(2, 5).reconcile(0.0, 9, 1) == 5
    assert Hpa(2, 5).reconcile(0.0, 1, None) == 2
    assert Hpa(1, 5).reconcile(0.0, 0, 3) == 0  # a target scaled to zero by someone else: scaling disabled
