"""One simulated point of a plan or sweep: a scenario at a given load and seed, reduced to a flat record.

`at_load(scenario, rate, seed, num_requests)` rewrites the workload so that requests arrive at
`rate` per second: the Poisson or gamma rate itself, or for a trace a time compression
(`workload.arrival.time_scale`) relative to the trace's own rate (`base_rate`); for a closed loop
(arrival process immediate) `rate` is its concurrency, `max_concurrency` clients. `evaluate_point`
runs one policy of it (a pure function of its arguments: any worker gives the same record) and
`point_record` (kvsim.results.verdict.flat_record) keeps the figures a capacity answer needs.

Seeds are independent replications of the workload. A trace replayed with its own times and lengths
draws nothing at random (`seed_invariant`), so there the k-th seed after the scenario's replays the
k-th window of `num_requests` rows (`workload.trace.skip_rows`), time-compressed by that window's own
mean rate; `replications` says how many such windows the trace holds, and how many seeds a plan can
simulate that differ at all.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.results.early_stop import VerdictKnown, VerdictWatch, watched_total
from kvsim.results.verdict import FIGURES, flat_record as point_record  # noqa: F401 (FIGURES: the record's keys)
from kvsim.scenario.config import scenario_from_dict

CLIENTS, REQ_RATE, SESSION_RATE = "clients", "req/s", "sessions/s"


def load_unit(scenario) -> str:
    """What a plan searches: `clients` for a closed loop (arrival process immediate, max_concurrency
    clients: the load is how many), else the arrival rate: `sessions/s` when requests come as
    multi-turn sessions, `req/s` otherwise (with max_concurrency too: vllm bench's semaphore over
    its arrival process, whose clients stay as the scenario sets them)."""
    wl = scenario.workload
    if wl.arrival.process == "immediate":
        if wl.max_concurrency is None:
            raise KvsimError(f"{scenario.source}: workload.arrival.process 'immediate' without max_concurrency sends "
                             "everything at t = 0: no rate or concurrency to search (set max_concurrency)")
        return CLIENTS
    return SESSION_RATE if wl.sessions is not None else REQ_RATE


def seed_invariant(scenario) -> bool:
    """Whether every seed gives the same requests: arrivals from a trace, deterministic or all at once,
    lengths fixed or from a trace, no shared-prefix groups, fixed think times and session turns."""
    wl = scenario.workload
    fixed = ("fixed", "trace")
    if wl.arrival.process not in ("trace", "deterministic", "immediate") or wl.prefix is not None:
        return False
    if wl.prompt_len.dist not in fixed or wl.output_len.dist not in fixed:
        return False
    if wl.think_time_s is not None and wl.think_time_s.dist != "fixed":
        return False
    return wl.sessions is None or wl.sessions.turns.dist in fixed


def windowed(scenario) -> bool:
    """Whether a plan's seeds are windows of the trace: a trace replayed with its times, nothing random."""
    return scenario.workload.arrival.process == "trace" and seed_invariant(scenario)


def trace_rows(scenario) -> int:
    """Rows the scenario's trace holds (after max_requests and skip_rows)."""
    from kvsim.scenario.traces import load_trace

    return len(load_trace(scenario))


def replications(scenario, num_requests: int, seeds: int) -> tuple[int, str]:
    """(how many of `seeds` differ, why fewer): all of them when the workload draws at random; for a
    windowed trace the disjoint windows of `num_requests` rows it holds (at most `seeds`, at least 1);
    1 for any other workload that draws nothing at random."""
    if not seed_invariant(scenario):
        return seeds, ""
    if not windowed(scenario):
        return 1, "the workload draws nothing at random, so every seed gives the same requests"
    rows = trace_rows(scenario)
    windows = max(1, min(seeds, rows // num_requests))
    if windows >= seeds:
        return seeds, ""
    return windows, (f"a replayed trace has nothing a seed could change: each seed replays its own window of "
                     f"{num_requests:,} rows, and the trace's {rows:,} rows hold {windows}")


def run_length(scenario, num_requests: int) -> int:
    """Requests a point of `num_requests` replays: a trace replayed with its times ends at its last row."""
    if scenario.workload.arrival.process != "trace":
        return num_requests
    return min(num_requests, trace_rows(scenario))


def base_rate(scenario, num_requests: Optional[int] = None) -> float:
    """The scenario's own load: a closed loop's clients, the configured rate, or a trace's mean rate
    over the first `num_requests` rows (default: the requests it replays) at its own time_scale."""
    arrival = scenario.workload.arrival
    if load_unit(scenario) == CLIENTS:
        return float(scenario.workload.max_concurrency)
    if arrival.process != "trace":
        return arrival.rate
    from kvsim.scenario.traces import load_trace

    trace = load_trace(scenario)
    n = num_requests or scenario.workload.num_requests or len(trace)
    n = min(len(trace), n)
    times = trace.arrival_s[:n] * arrival.time_scale
    span = float(times[-1] - times[0]) if n > 1 else 0.0
    return (n - 1) / span if span > 0 else 1.0


def at_load(scenario, rate: float, seed: Optional[int] = None, num_requests: Optional[int] = None,
            policies: Optional[list[str]] = None, trace_rate: Optional[float] = None, overrides: dict | None = None):
    """The scenario with requests arriving at `rate`/s (see the module docstring), `seed`,
    `num_requests` requests (no duration cut) and only the named policies; `overrides` is a dict
    of section updates merged in first (e.g. {"hardware": {"gpu": "H200"}}; "policies": keys set on
    every policy)."""
    data = scenario.model_dump()  # None stays None (an absent SLO bound), not the default
    window = seed is not None and seed != scenario.workload.seed and windowed(scenario)
    if window:  # this seed's own rows of the trace, at that window's own mean rate (module docstring)
        data["workload"]["trace"]["skip_rows"] += (seed - scenario.workload.seed) * (num_requests or 0)
    for section, values in (overrides or {}).items():
        if section == "policies":  # the same keys on every policy
            for p in data["policies"]:
                p.update(values)
        else:
            data.setdefault(section, {}).update(values)
    wl = data["workload"]
    arrival = wl["arrival"]
    if arrival["process"] == "immediate":  # a closed loop: the load is its clients
        wl["max_concurrency"] = max(1, int(round(rate)))
    elif arrival["process"] == "trace":
        if window:
            own = base_rate(scenario_from_dict(data, scenario.source, scenario.base_dir), num_requests)
        else:
            own = trace_rate if trace_rate is not None else base_rate(scenario)
        arrival["time_scale"] = scenario.workload.arrival.time_scale * own / rate
    else:
        arrival["rate"] = rate
    if seed is not None:
        wl["seed"] = seed
    if num_requests is not None:
        wl["num_requests"] = num_requests
        wl["duration_s"] = None
    if policies is not None:
        data["policies"] = [p for p in data["policies"] if p["name"] in policies]
    return scenario_from_dict(data, scenario.source, scenario.base_dir)


def check_fits(scenario, policies: Optional[list[str]] = None) -> None:
    """Raise KvsimError (one line) now if a policy's KV cache cannot hold the model (or a disaggregated
    policy's pools cannot run), not in a worker."""
    from kvsim.pipeline import check_deployments
    from kvsim.scenario.catalog import gpu_spec, model_spec

    check_deployments(scenario, model_spec(scenario), gpu_spec(scenario),
                      [p for p in scenario.policies if policies is None or p.name in policies])


def simulate(scenario) -> dict[str, dict]:
    """Every policy of the scenario simulated (no files): {policy: record}."""
    from kvsim.pipeline import run_scenario

    result = run_scenario(scenario, write=False)
    return {name: point_record(s) for name, s in result.summaries.items()}


def evaluate_point(scenario, policy: str, rate: float, seed: int, num_requests: int,
                   trace_rate: Optional[float] = None, overrides: dict | None = None, stop_early: bool = False) -> dict:
    """One policy of the scenario at `rate` req/s with `seed`: its record (see point_record). `stop_early`:
    end the run once it is certain to be unsustainable (`stopped_record`; kvsim/results/early_stop.py)."""
    sc = at_load(scenario, rate, seed, num_requests, [policy], trace_rate, overrides)
    total = watched_total(sc) if stop_early else None
    if total is None:
        return simulate(sc)[policy]
    from kvsim.pipeline import run_scenario

    try:
        result = run_scenario(sc, write=False, observe=lambda metrics, sim: VerdictWatch(metrics, sim, total))
    except VerdictKnown as known:
        return stopped_record(known)
    return point_record(result.summaries[policy])


def stopped_record(known: VerdictKnown) -> dict:
    """The record of a run stopped once it was certain to be unsustainable: that verdict, which part of
    it failed (`slo_met` False, or `stable` False; the other None, unknown), and no figures (None);
    `binding_detail` says why it stopped, `stopped_s` when."""
    record = {k: None for k in FIGURES}
    record.update(sustainable=False, slo_met=None if known.kind == "stable" else False,
                  stable=False if known.kind == "stable" else None, binding_detail=known.reason,
                  _prompt_tokens_per_request=None, stopped_s=known.at_s)
    return record


def is_stopped(record: dict) -> bool:
    """Whether a point record is a stopped run's (its figures unknown)."""
    return record.get("stopped_s") is not None


def mean_or_none(values) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
