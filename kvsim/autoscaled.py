"""One policy on an autoscaled pool: the pool's simulation built from the scenario, and its answers.

`pipeline.simulate_policy` calls `pool_simulation` when the scenario has an `[autoscaling]` section:
a fixed pool (`policy = "fixed"`) runs on today's engine (`Simulation`, the same event order and
bytes) with `autoscaling.fixed.replicas` replicas; any other autoscaler on a
`kvsim.engine.fleet.FleetSimulation` with the autoscaler (kvsim.engine.autoscalers.make_autoscaler),
the startup delay (kvsim.perf.startup, from the checkpoint's bytes), the scrapes
(kvsim.engine.observe) and, for the SLO-aware loop, the finished requests' latencies. Either way the
observer is a `kvsim.results.fleet.FleetObserver` around the run's `Metrics`, and
`autoscaling_summary` gives summary.json's `autoscaling` section: replicas over time, SLO attainment
per window and overall, replica-hours, $ and $ per million tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from kvsim.engine.autoscalers import make_autoscaler
from kvsim.engine.fleet import FleetSimulation, Member
from kvsim.engine.observe import Latencies, Scrapes
from kvsim.engine.router import make_router
from kvsim.perf.startup import startup_delay
from kvsim.results.fleet import FleetObserver, fleet_summary
from kvsim.scenario.catalog import gpu_price
from kvsim.scenario.workload import arrival_window

RETENTION_S = 900.0  # scrapes and latencies kept: the longest query window or cooldown read


def attainment_target(scenario) -> float:
    """The share of requests that must meet every per-request SLO bound: autoscaling.attainment_target,
    else slo.percentile / 100."""
    auto = scenario.autoscaling
    if auto is not None and auto.attainment_target is not None:
        return auto.attainment_target
    return scenario.slo.percentile / 100.0


def fixed_size(scenario, settings) -> int:
    """A fixed pool's engines: autoscaling.fixed.replicas (each data_parallel_size engines), else
    hardware.num_replicas's."""
    fixed = scenario.autoscaling.fixed
    if fixed is None or fixed.replicas is None:
        return settings.num_replicas
    return fixed.replicas * scenario.hardware.data_parallel_size


def autoscaling_meta(scenario) -> dict:
    """summary.json's meta of an autoscaled pool: the autoscaler and its bounds (a fixed pool: its size)."""
    auto, hw = scenario.autoscaling, scenario.hardware
    if auto.policy == "fixed":
        replicas = hw.num_replicas if auto.fixed is None or auto.fixed.replicas is None else auto.fixed.replicas
        return {"policy": "fixed", "replicas": replicas}
    return {"policy": auto.policy, "min_replicas": auto.min_replicas, "max_replicas": auto.max_replicas}


def pool_simulation(scenario, model, settings, factory: Callable, metrics, on_progress: Optional[Callable]):
    """(simulation or None, observer, settings) of an autoscaled scenario's policy: None asks the
    caller for today's `Simulation` over `settings.num_replicas` replicas (a fixed pool)."""
    auto, observer = scenario.autoscaling, FleetObserver(metrics)
    if auto.policy == "fixed":
        return None, observer, replace(settings, num_replicas=fixed_size(scenario, settings))
    autoscaler = make_autoscaler(auto, scenario.slo)
    startup = startup_delay(auto.startup, model.weight_bytes)
    scrapes = Scrapes(auto.metrics.scrape_interval_s, auto.metrics.delay_s, RETENTION_S)
    latencies = Latencies(RETENTION_S) if autoscaler.name == "slo_aware" else None
    initial = auto.initial_replicas or max(1, auto.min_replicas)
    sim = FleetSimulation(factory, autoscaler, startup, initial, observer,
                          lambda ready: make_router(settings, ready, ready[0].backend.num_blocks if ready else 1,
                                                    fixed=False),
                          scrapes, latencies, metrics.request_overhead_s, on_progress)
    return sim, observer, settings


def pool_size(sim) -> int:
    """The most replicas alive at once (a fixed pool: all of them)."""
    if not isinstance(sim, FleetSimulation):
        return len(sim.replicas)
    return max(max((spec + draining for _, spec, _, draining in sim.changes), default=1), 1)


def autoscaling_summary(scenario, gpu, sim, observer: FleetObserver, end: float) -> dict:
    """summary.json's `autoscaling` section for the finished simulation `sim` (kvsim.results.fleet)."""
    auto, hw = scenario.autoscaling, scenario.hardware
    window_end = arrival_window(scenario) or end
    if isinstance(sim, FleetSimulation):
        members, changes, decisions = sim.members, sim.changes, sim.decisions
        described, startup = sim.autoscaler.describe(), sim.startup.describe()
    else:
        n = len(sim.replicas)
        members, changes, decisions = [Member(i, 0.0, 0.0, 0.0) for i in range(n)], [(0.0, n, n, 0)], []
        described, startup = {"policy": "fixed", "replicas": n // hw.data_parallel_size}, None
    return fleet_summary(observer, members, changes, decisions, window_s=auto.window_s, end_s=window_end,
                         horizon_s=max(window_end, end), target=attainment_target(scenario),
                         price=gpu_price(scenario, gpu.name), gpus_per_replica=hw.tensor_parallel_size,
                         autoscaler=described, startup=startup, start_s=scenario.workload.start_s or 0.0)
