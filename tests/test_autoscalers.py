"""The autoscalers replay their documented rules decision by decision: KEDA's activation and cooldown,
llm-d's Workload Variant Autoscaler (saturation analyzer v1: thresholds, spare-capacity triggers,
scale-down safety, transitions, cascade prevention) and llm-d's SLO-aware loop (the saturation
signal, the KEDA formula, the guide's HPA behavior); and the metrics pipeline's scrape delay and
averaging windows."""

import math
from types import SimpleNamespace

import pytest

from kvsim.engine.autoscalers import (SLO_DOWN, SLO_UP, WVA_DOWN, WVA_UP, FleetView, KedaAutoscaler,
                                      SloAwareAutoscaler, WvaAutoscaler, make_autoscaler)
from kvsim.engine.hpa import Hpa
from kvsim.engine.observe import Latencies, Scrapes
from kvsim.scenario.autoscaling import KedaConfig, SloAwareConfig, WvaConfig

from conftest import make_scenario


def replica(index: int, waiting: int = 0, running: int = 0, kv: float = 0.0, blocks: int = 1000):
    sched = SimpleNamespace(waiting=[None] * waiting, num_running=running)
    return SimpleNamespace(index=index, scheduler=sched,
                           allocator=SimpleNamespace(num_used_blocks=round(kv * blocks), num_blocks=blocks))


def view(now, scrapes, spec, ready=None, pending=0, latencies=None):
    ready = spec if ready is None else ready
    return FleetView(now, spec, ready, pending, spec - ready - pending, frozenset(range(spec)), scrapes, latencies)


# ---- the metrics pipeline -------------------------------------------------------------------------

def test_scrapes_are_read_late_and_over_their_windows():
    s = Scrapes(15.0, delay=5.0)
    for t, w in ((0.0, 1), (15.0, 3), (30.0, 8)):
        s.scrape(t, [replica(0, waiting=w), replica(1, waiting=2 * w)], gateway_queue=0, spec=2, ready=2)
    # at 33 s the 30 s scrape is not visible yet (5 s delay): the latest is the 15 s one
    assert s.replica_values(33.0, "num_requests_waiting") == {0: 3, 1: 6}
    assert s.replica_values(35.0, "num_requests_waiting") == {0: 8, 1: 16}
    assert s.replica_values(35.0, "num_requests_waiting", "max_over_time", 30.0) == {0: 8, 1: 16}
    assert s.replica_values(35.0, "num_requests_waiting", "avg_over_time", 30.0) == {0: 5.5, 1: 11.0}
    assert s.metric_total(35.0, "num_requests_waiting") == 24
    assert s.last_time(19.9) == 0.0 and s.last_time(20.0) == 15.0


def test_a_removed_replica_is_stale_at_once_but_kept_by_range_queries():
    s = Scrapes(15.0)
    s.scrape(0.0, [replica(0, kv=0.5), replica(1, kv=0.9)], 0, 2, 2)
    s.scrape(15.0, [replica(0, kv=0.4)], 0, 1, 1)
    assert s.replica_values(15.0, "kv_cache_usage_perc") == {0: 0.4}
    assert s.replica_values(15.0, "kv_cache_usage_perc", "max_over_time", 60.0) == {0: 0.5, 1: 0.9}


# ---- KEDA -------------------------------------------------------------------------------------------

def test_keda_wakes_a_pool_from_zero_on_activation_and_sends_it_back_after_the_cooldown():
    """minReplicaCount 0: at zero replicas only the gateway reports; the trigger is active when its
    metric exceeds activationThreshold, checked every pollingInterval (30 s); the pool goes to zero
    after cooldownPeriod (300 s) without activity; in between KEDA's HPA scales on the metric."""
    cfg = KedaConfig(metric="gateway_queue_size", threshold=10.0, activation_threshold=0.0)
    keda = KedaAutoscaler(cfg, Hpa(1, 8), min_replicas=0)
    s = Scrapes(15.0)
    decisions, spec = {}, 0
    for t in range(0, 900, 15):
        queue = 3 if 100 <= t < 130 else 0  # requests held at the gateway for a while
        s.scrape(float(t), [], queue, spec, spec)
        spec = keda.desired(view(float(t), s, spec))
        decisions[t] = spec
    assert decisions[90] == 0 and decisions[105] == 0  # held requests, but the next poll is at 120
    assert decisions[120] == 1  # activation at the poll: to max(1, minReplicaCount)
    assert all(decisions[t] == 1 for t in range(120, 420, 15))
    # last active at the 120 s poll (queue 3 > 0); the first poll 300 s later is at 420
    assert decisions[420] == 0 and all(v == 0 for t, v in decisions.items() if t >= 420)


def test_keda_hpa_scales_on_the_summed_metric_with_an_average_value_target():
    cfg = KedaConfig(metric="num_requests_waiting", threshold=5.0)
    keda = KedaAutoscaler(cfg, Hpa(1, 10), min_replicas=1)
    s = Scrapes(15.0)
    s.scrape(0.0, [replica(0, waiting=20), replica(1, waiting=10)], 0, 2, 2)
    assert keda.desired(view(0.0, s, 2)) == 6  # ceil(30 / 5)


# ---- llm-d WVA saturation analyzer --------------------------------------------------------------------

def wva_at(now, replicas, spec=None, ready=None, target=0, cfg=None):
    w = WvaAutoscaler(cfg or WvaConfig(), Hpa(1, 20, WVA_UP, WVA_DOWN))
    w.target = target
    s = Scrapes(15.0)
    s.scrape(now, replicas, 0, len(replicas), len(replicas))
    return w.analyze(view(now, s, len(replicas) if spec is None else spec, ready))


def test_wva_saturated_replicas_and_the_spare_capacity_triggers():
    """Saturated: KV >= 0.80 or queue >= 5. Scale up when the non-saturated replicas' mean spare KV
    (0.80 - usage) < 0.1 or mean spare queue (5 - waiting) < 3: to ready + 1."""
    # mean spare KV 0.05 < 0.1 -> up
    assert wva_at(60.0, [replica(0, kv=0.75), replica(1, kv=0.75)]) == 3
    # mean spare queue 5 - 2.5 = 2.5 < 3 -> up
    assert wva_at(60.0, [replica(0, waiting=2, kv=0.3), replica(1, waiting=3, kv=0.3)]) == 3
    # every replica saturated: no spare at all -> up
    assert wva_at(60.0, [replica(0, kv=0.85), replica(1, waiting=5, kv=0.1)]) == 3
    # the documented multi-variant example's five replicas: spare KV 0.15, queue 3.2: no trigger; one
    # fewer would leave KV spare 0.8 - 0.65 x 5/4 < 0.1: unsafe -> hold
    five = [replica(i, waiting=q, kv=k) for i, (k, q) in enumerate(((0.70, 2), (0.75, 3), (0.60, 1), (0.65, 2),
                                                                      (0.55, 1)))]
    assert wva_at(60.0, five) == 5


def test_wva_scale_down_simulates_the_load_on_one_replica_fewer():
    """Safe when, spread over N - 1 non-saturated replicas, both spares stay at or above the triggers
    (and N >= 2): to ready - 1, never below 1."""
    assert wva_at(60.0, [replica(i, kv=0.2) for i in range(4)]) == 3
    assert wva_at(60.0, [replica(0, kv=0.2)]) == 1  # one replica: no scale-down
    # 0.5 x 4/3 = 0.667 -> spare 0.133 >= 0.1: safe; 0.55 x 4/3 = 0.733 -> 0.067: not
    assert wva_at(60.0, [replica(i, kv=0.5) for i in range(4)]) == 3
    assert wva_at(60.0, [replica(i, kv=0.55) for i in range(4)]) == 4


def test_wva_holds_while_in_transition_and_prevents_cascade_scaling():
    """The documented timeline: 'T+0s: Saturation detected -> Scale up from 2 to 3 (PendingReplicas=1);
    T+30s: Saturation still detected, but the variant is skipped (has 1 pending replica) ... T+90s
    pod becomes ready, now eligible for scale-up again'."""
    hot = [replica(0, kv=0.78), replica(1, kv=0.78)]
    assert wva_at(0.0, hot) == 3
    # the previous decision (3) is not reached yet (spec 3 now, one pending): desired == current, but
    # metrics (2) != current (3): in transition, hold at current
    assert wva_at(30.0, hot, spec=3, ready=2, target=3) == 3
    # a decision not yet applied (desired 3 != current 2): hold at the desired
    assert wva_at(30.0, hot, spec=2, ready=2, target=3) == 3
    # all three ready and reporting, still hot: up again
    assert wva_at(90.0, hot + [replica(2, kv=0.78)], spec=3, ready=3, target=3) == 4


def test_wva_loop_runs_every_60_seconds_and_its_hpa_follows_the_scraped_gauge():
    w = WvaAutoscaler(WvaConfig(), Hpa(1, 20, WVA_UP, WVA_DOWN))
    s = Scrapes(15.0)
    spec, history = 2, []
    for t in range(0, 181, 15):
        s.scrape(float(t), [replica(i, kv=0.78) for i in range(spec)], 0, spec, spec)
        spec = w.desired(view(float(t), s, spec))
        history.append((t, spec))
    # analysis at 0 (-> 3), exported; the scrape at 0 was taken before the export: the HPA sees 3 at
    # the 15 s scrape; the next analysis at 60 finds 3 replicas hot -> 4, seen at 75; then 120 -> 5
    assert [t for t, _ in w.emitted] == [0.0, 60.0, 120.0, 180.0]
    assert dict(history)[0] == 2 and dict(history)[15] == 3 and dict(history)[75] == 4 and dict(history)[135] == 5


# ---- llm-d SLO-aware loop ---------------------------------------------------------------------------

def slo_loop(**cfg):
    return SloAwareAutoscaler(SloAwareConfig(**cfg), Hpa(3, 8, SLO_UP, SLO_DOWN), ttft_slo_s=3.0, tpot_slo_s=0.1)


def test_slo_aware_formula_hysteresis_and_in_flight_credit():
    """d = n + ceil(n (s c / θ_up - 1)) above θ_up = 0.55, n - floor(n (1 - s / θ_dn)) below θ_dn =
    0.40, n in between; c = r / n while 0 < r < n (scale-up only)."""
    loop = slo_loop()
    assert loop.formula(1.1, 4, 4) == 8  # twice the trigger: double
    assert loop.formula(1.1, 4, 2) == 4  # half the pool warming: its credit covers the ask
    assert loop.formula(0.45, 6, 6) == 6  # the hysteresis band holds
    assert loop.formula(0.2, 8, 8) == 4  # half the boundary: half the pool
    assert loop.formula(0.0, 8, 8) == 0  # idle: toward minReplicas
    assert loop.formula(0.3, 8, 4) == 6  # scale-down is uncredited: 8 - floor(8 x 0.25)


def test_slo_aware_signal_is_the_worst_p90_over_its_slo_clamped_and_smoothed():
    """s_raw = max(P90 TTFT / 3 s, P90 TPOT / 100 ms) over the last minute (0 without traffic),
    clamped at C = 2 and averaged over 45 s of 15 s samples."""
    loop, lat, s = slo_loop(), Latencies(), Scrapes(15.0)
    for t, ttft, tpot in ((5.0, 1.0, 0.03), (10.0, 2.0, 0.05)):
        lat.add(t, ttft, tpot)
    s.scrape(15.0, [], 0, 3, 3)
    sample = loop.record(view(15.0, s, 3, latencies=lat))
    assert sample == pytest.approx(max(1.9 / 3.0, 0.048 / 0.1))  # linear P90 of two samples: 1.9 s, 48 ms
    lat.add(20.0, 300.0, 0.05)  # a 100x spike
    s.scrape(30.0, [], 0, 3, 3)
    assert loop.record(view(30.0, s, 3, latencies=lat)) == 2.0  # clamped
    s.scrape(45.0, [], 0, 3, 3)
    loop.record(view(45.0, s, 3, latencies=lat))
    s.scrape(120.0, [], 0, 3, 3)
    assert loop.record(view(120.0, s, 3, latencies=Latencies())) == 0.0  # no traffic: 0
    assert loop.signal.smoothed(45.0, 45.0) == pytest.approx((sample + 2.0 + 2.0) / 3)


def test_slo_aware_behavior_bursts_up_and_drains_one_pod_every_120_seconds():
    """The guide's HPA: 'scale-up bursts at max(100 %, 4 pods) per 60 s with a 30 s stabilization window
    (min over window); scale-down walks 1 pod per 120 s with a 180 s window (max over window)'."""
    loop = slo_loop()
    hpa = loop.hpa
    current, changes = 3, []
    for t in range(0, 1200, 15):
        want = 8 if t < 300 else 3
        new = hpa.reconcile(float(t), current, want)
        if new != current:
            changes.append((t, new))
        current = new
    # up: the desired 8 must hold for 30 s (min over the window), then 3 + 4 = 7 within the first 60 s
    assert changes[0] == (30, 7) and changes[1] == (90, 8)
    downs = changes[2:]
    # down: the last 8, recommended at 285 s, leaves the 180 s window at 465 s; then one pod every 120 s
    assert [n for _, n in downs] == [7, 6, 5, 4, 3]
    assert all(b[0] - a[0] == 120 for a, b in zip(downs, downs[1:])) and downs[0][0] == 465


def test_make_autoscaler_defaults_the_slo_aware_loop_to_the_scenario_slo():
    sc = make_scenario(slo={"ttft_ms": 1500, "tpot_ms": 50},
                       autoscaling={"policy": "slo_aware", "min_replicas": 3, "max_replicas": 8})
    loop = make_autoscaler(sc.autoscaling, sc.slo)
    assert (loop.ttft_slo_s, loop.tpot_slo_s) == (1.5, 0.05) and loop.period_s == 15.0
    assert loop.hpa.up == SLO_UP and loop.hpa.down == SLO_DOWN and (loop.hpa.min_replicas, loop.hpa.max_replicas) == (3, 8)
    assert math.isinf(make_autoscaler(make_scenario(autoscaling={"policy": "fixed"}).autoscaling, sc.slo).period_s)


def test_every_autoscaler_satisfies_the_protocol():
    from kvsim.engine.interfaces import Autoscaler

    for policy, section in (("hpa", {"hpa": {"target": 2}}), ("keda", {"keda": {"threshold": 2}}), ("wva", {}),
                            ("slo_aware", {}), ("fixed", {})):
        sc = make_scenario(autoscaling={"policy": policy, **section})
        scaler = make_autoscaler(sc.autoscaling, sc.slo)
        assert isinstance(scaler, Autoscaler) and scaler.name == policy
        assert scaler.describe()["policy"] == policy
