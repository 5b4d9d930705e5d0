"""Run a scenario: every policy through its own simulation, then one results folder.

`run_scenario` is the library entry point behind `python -m kvsim SCENARIO.toml`: it resolves the
model and GPU, sizes each policy's KV cache, builds allocator, scheduler and backend per replica,
replays the same request stream against each policy, and writes the results atomically.

With `workers` > 1 (the command line's default: one per policy, up to the cores) the policies are
simulated side by side on worker processes forked from this one (kvsim.workers.run_forked), each
streaming its requests.csv rows into a part file of the results folder, which is filled in the
policies' order afterwards: the same bytes as one after the other. A backend that holds a device
(`holds_device`: the GPU's) runs its policies one after the other, as where fork is missing.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from kvsim.autoscaled import autoscaling_meta, autoscaling_summary, pool_simulation, pool_size
from kvsim.backends import load_backend
from kvsim.errors import KvsimError, check_int
from kvsim.engine.arrivals import ClosedLoop, RequestStream
from kvsim.engine.disaggregated import DisaggregatedSimulation
from kvsim.engine.connector import make_connected_replica
from kvsim.engine.kv_transfer import KvLink, NixlConsumer, NixlProducer
from kvsim.engine.replica import ALLOCATORS, make_replica
from kvsim.engine.router import make_router
from kvsim.engine.tiers import offload_tiers
from kvsim.engine.settings import EngineSettings, engine_settings
from kvsim.engine.simulator import Simulation
from kvsim.perf.basis import PricingBasis, pricing_basis
from kvsim.perf.disaggregation import disaggregation, pool_basis
from kvsim.perf.measured import request_overhead_s
from kvsim.perf.energy import StepWork, energy_model
from kvsim.perf.memory import KvCapacity, check_fits, kv_capacity
from kvsim.perf.offload import offload_settings
from kvsim.perf.speculative import resolve_speculation, with_draft
from kvsim.results.disaggregation import DisaggregationObserver
from kvsim.results.intervals import summary_intervals, unlike
from kvsim.results.energy import EnergyMeter, Observers
from kvsim.results.metrics import Metrics
from kvsim.results.offload import offload_summary, oracle_ttft
from kvsim.results.speculative import speculative_summary
from kvsim.results.verdict import judge
from kvsim.results.writer import ResultsWriter
from kvsim.scenario.catalog import gpu_price, gpu_spec, model_spec
from kvsim.scenario.config import results_dir
from kvsim.scenario.defaults import engine_limits
from kvsim.scenario.files import user_path
from kvsim.scenario.limits import MAX_WORKERS
from kvsim.scenario.sessions import is_closed_loop, sessions
from kvsim.scenario.traces import one_read_per_call, reading, trace_reads
from kvsim.scenario.workload import expected_count, generate_requests, timeseries_interval
from kvsim.workers import can_fork, run_forked


def input_paths(scenario) -> list[Path]:
    """The files a run reads: a results folder that holds one of them is never replaced."""
    paths = [Path(scenario.source)]
    for rel in (scenario.model.hf_config, scenario.backend.calibration, scenario.backend.kernel_tables,
                scenario.backend.server_terms, scenario.workload.trace.path if scenario.workload.trace else None):
        if rel:
            paths.append(scenario.resolve(rel))
    return paths


@dataclass(slots=True)
class PolicyRun:
    name: str
    summary: dict
    wall_s: float  # simulation only, not written to summary.json (it would break determinism)
    events: int


@dataclass(slots=True)
class PolicyOutcome:
    """What one policy's simulation hands back (from a worker process, pickled): its summary, time-series
    rows and latencies (kvsim.results.metrics), simulated seconds of wall time and engine events."""

    summary: dict
    timeseries: list
    latencies: dict
    wall_s: float
    events: int


@dataclass(slots=True)
class ScenarioResult:
    out_dir: Optional[Path]
    summaries: dict[str, dict]
    runs: list[PolicyRun] = field(default_factory=list)
    capacity: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # summary.json's "meta": model, GPU, layout, arrivals, SLO

    def to_frame(self):
        """A pandas DataFrame, a row per policy: the verdict and headline figures (kvsim.results.verdict.FIGURES)."""
        from kvsim.results.verdict import summary_frame

        return summary_frame(self.summaries)


def run_meta(scenario, model, gpu, basis: Optional[PricingBasis] = None) -> dict:
    """What ran, for summary.json and the report's opening lines: `basis` says whether its answers are
    measured or estimated, and why."""
    hw = scenario.hardware
    basis = basis or pricing_basis(scenario, model, gpu)
    parallel = {"data_parallel_size": hw.data_parallel_size, "enable_expert_parallel": hw.enable_expert_parallel} \
        if hw.data_parallel_size > 1 or hw.enable_expert_parallel else {}
    pools = disaggregated_meta(scenario, basis) if scenario.disaggregation is not None else None
    if pools:
        basis = pools.pop("basis")
    meta = {"model": model.name, "gpu": gpu.name, "tensor_parallel_size": hw.tensor_parallel_size, **parallel,
            "pricing_basis": basis.to_dict(),
            "num_replicas": hw.num_replicas, "backend": scenario.backend.name, "seed": scenario.workload.seed,
            "description": scenario.description, "arrival": scenario.workload.arrival.model_dump(),
            "clients": clients_meta(scenario),
            "slo": scenario.slo.model_dump(), "policy_order": [p.name for p in scenario.policies]}
    if pools:
        meta["disaggregation"] = pools
    if scenario.autoscaling is not None:
        meta["autoscaling"] = autoscaling_meta(scenario)
        if meta["autoscaling"]["policy"] == "fixed":
            meta["num_replicas"] = meta["autoscaling"]["replicas"]
    return meta


def disaggregated_meta(scenario, hardware_basis: PricingBasis) -> dict:
    """The pools and link as summary.json's meta names them (which policies use them: `disaggregated`),
    each pool's pricing basis, and under "basis" the run's: the pools' and, when a policy is served
    aggregated, [hardware]'s (kvsim.perf.disaggregation.combined_basis)."""
    from kvsim.perf.disaggregation import combined_basis, pool
    from kvsim.scenario.disaggregation import ROLES, link_spec, pool_view

    served = [p for p in scenario.policies if scenario.disaggregated(p)]
    pools, bases = {}, {} if served else {"hardware": hardware_basis}
    for role in ROLES:
        hw = pool_view(scenario, scenario.policies[0], role)[0].hardware
        pools[role] = {"gpu": hw.gpu, "tensor_parallel_size": hw.tensor_parallel_size,
                       "num_replicas": hw.num_replicas, "router": hw.router}
        if served:
            bases[f"{role} pool"] = pool_basis(pool(scenario, served[0], role, simulate=False))
            pools[role]["pricing_basis"] = bases[f"{role} pool"].to_dict()
    if served and len(served) < len(scenario.policies):
        bases = {"hardware": hardware_basis, **bases}
    link = link_spec(scenario)
    return {**pools, "link": link.name, "bandwidth_gbps": link.bandwidth_gbps,
            "kv_transfer": scenario.disaggregation.kv_transfer, "policies": [p.name for p in served],
            "basis": combined_basis(bases)}


def clients_meta(scenario) -> Optional[dict]:
    """A closed loop's settings for summary.json's meta (None: an open loop)."""
    if not is_closed_loop(scenario):
        return None
    wl = scenario.workload
    return {"max_concurrency": wl.max_concurrency,
            "think_time_s": wl.think_time_s.model_dump(exclude_none=True) if wl.think_time_s else None,
            "sessions": wl.sessions.model_dump(exclude_none=True) if wl.sessions else None}


def resolve_policy(scenario, policy, model, gpu, basis: Optional[PricingBasis] = None) -> tuple[KvCapacity,
                                                                                                 EngineSettings]:
    """The policy's KV capacity and engine settings, its engine limits resolved once. Async scheduling
    defaults to the priced release's: on under measured kernel tables (vLLM >= 0.14), else off."""
    limits = engine_limits(scenario, policy, model, gpu)
    capacity = kv_capacity(scenario, policy, model, gpu, limits)
    spec = resolve_speculation(scenario, policy, model)  # a drafter's weights and KV come out of the cache
    capacity = with_draft(capacity, spec, scenario.engine.block_size, limits.max_model_len, scenario.source, policy.name)
    basis = basis or pricing_basis(scenario, model, gpu)
    return capacity, engine_settings(scenario, policy, limits, capacity.bytes_per_block, capacity.windows,
                                     async_default=basis.pricing == "measured", speculation=spec)


def arrival_source(scenario, max_model_len: int, reply_delay_s: float = 0.0):
    """The scenario's requests as an ArrivalSource: an open-loop stream, or clients in a closed
    loop (`workload.max_concurrency`, `think_time_s`, `[workload.sessions]`); `reply_delay_s`: the
    API server's time a client waits for a reply past the engine's last token (measured pricing)."""
    if not is_closed_loop(scenario):
        return RequestStream(generate_requests(scenario, max_model_len))
    wl = scenario.workload
    think = wl.think_time_s
    return ClosedLoop(sessions(scenario, max_model_len), wl.max_concurrency, think.lowest if think else 0.0,
                      wl.arrival.process == "immediate", wl.duration_s if wl.duration_s is not None else math.inf,
                      reply_delay_s)


def simulate_policy(scenario, policy, model, gpu, metrics: Metrics,
                    on_progress: Optional[Callable[[int], None]] = None,
                    basis: Optional[PricingBasis] = None, observe=None,
                    oracle: Optional[list] = None) -> tuple[dict, Simulation]:
    """Simulate one policy; returns its summary and the finished simulation. `observe(metrics, sim)`: the
    observer to run with instead of the run's own (`sim.observer`: the metrics, with an energy meter
    beside them), one that hands every event on to it (e.g. kvsim.results.early_stop.VerdictWatch).
    `oracle`: the offload tiers' recorded futures, for the optimal bound's re-run (kvsim.engine.tiers)."""
    if scenario.disaggregated(policy):
        return simulate_disaggregated(scenario, policy, metrics, on_progress)
    capacity, settings = resolve_policy(scenario, policy, model, gpu, basis)
    backend_cls = load_backend(scenario.backend.name, scenario.source)
    tiers = offload_tiers(scenario, policy, model, gpu, capacity, metrics.interval, oracle)
    make = make_replica if tiers is None else tiers.make_replica

    def factory(i: int):
        return make(i, settings, backend_cls(scenario, policy, model, gpu, capacity, settings), metrics.interval)

    auto = scenario.autoscaling
    # energy is metered over a fixed pool (an autoscaled pool's replica-hours are in its own summary)
    meter = energy_meter(scenario, policy, model, gpu, settings) if auto is None else None
    if auto is None:
        sim, observer = None, (Observers(metrics, meter) if meter is not None else metrics)
    else:  # no tiers: check_autoscaled refuses [kv_offload] beside [autoscaling]
        sim, observer, settings = pool_simulation(scenario, model, settings, factory, metrics, on_progress)
    if sim is None:
        replicas = [factory(i) for i in range(settings.num_replicas)]
        sim = Simulation(replicas, observer, make_router(settings, replicas, replicas[0].backend.num_blocks,
                                                         tiers.settings.tokens if tiers else 0), on_progress)
    if observe is not None:
        sim.observer = observe(metrics, sim)
    source = arrival_source(scenario, settings.max_model_len, metrics.request_overhead_s)
    try:
        end = sim.run(source)
        described = sim.replicas[0].backend.describe()
    finally:
        for rep in sim.replicas:  # a GPU backend holds most of the device: let the next policy have it
            rep.backend.close()
    peak = len(sim.replicas) if auto is None else pool_size(sim)
    # a window of a longer day (workload.start_s) is measured from its start, not from the day's
    summary = metrics.summary(duration_s=end - (scenario.workload.start_s or 0.0),
                              num_blocks=sim.replicas[0].backend.num_blocks * peak,
                              block_size=settings.block_size, bytes_per_block=capacity.bytes_per_block,
                              extra=_run_figures(sim, settings, policy, described), num_replicas=peak)
    if auto is not None:
        summary["autoscaling"] = autoscaling_summary(scenario, gpu, sim, observer, end)
    if meter is not None:
        price = gpu_price(scenario, gpu.name)
        summary["energy"] = meter.summary(end, metrics.output_tokens, peak, price and price.usd_per_hour,
                                          summary["arrivals"])
    if source.closed_loop:
        _clients_figures(summary, source)
    if tiers is not None:
        summary["kv_offload"] = offload_summary(tiers, end, summary)
        if tiers.oracle_ttft:  # the same policy again, its CPU tier evicting by the first run's future
            again = Metrics(policy.name, scenario.slo, metrics.interval, request_overhead_s=metrics.request_overhead_s)
            bound, _ = simulate_policy(scenario, policy, model, gpu, again, basis=basis, oracle=tiers.futures())
            summary["kv_offload"]["optimal"].update(oracle_ttft(metrics, again, bound))
    summary["verdict"] = judge(summary).as_dict()
    _error_bars(summary, basis or pricing_basis(scenario, model, gpu), settings,
                unlike(model, gpu.name, scenario.hardware.tensor_parallel_size))
    return summary, sim


def _error_bars(summary: dict, basis: PricingBasis, settings: EngineSettings, differs: tuple = ()) -> None:
    """The range real runs like this one fell in around kvsim's figures, and how this run differs from
    those runs (kvsim.results.intervals)."""
    bars = summary_intervals(summary, basis.to_dict(), settings.max_num_seqs, settings.num_replicas, differs)
    if bars is not None:
        summary["prediction_intervals"] = bars


def energy_meter(scenario, policy, model, gpu, settings):
    """An EnergyMeter for the policy's replicas when the scenario has an [energy] section (else None)."""
    energy = energy_model(scenario, gpu, model)
    if energy is None:
        return None
    hw, spec = scenario.hardware, settings.speculation
    draft = None if spec is None or spec.draft is None else StepWork(spec.draft, hw.tensor_parallel_size,
                                                                     policy.kv_cache_dtype)
    return EnergyMeter(energy, StepWork(model, hw.tensor_parallel_size, policy.kv_cache_dtype),
                       hw.tensor_parallel_size, draft, spec.k if spec is not None else 0)


def _clients_figures(summary: dict, source: ClosedLoop) -> None:
    """A closed loop's "clients", and its backlog: requests first scheduled after the last one was
    ready to be sent (none when everything was ready at t = 0: the SLO alone judges a closed loop)."""
    summary["clients"] = source.describe()
    arrivals, backlog = summary["arrivals"], source.backlog()
    received = summary["requests"]["received"]
    arrivals["backlog_at_last_arrival"] = backlog
    arrivals["backlog_fraction"] = backlog / received if backlog is not None and received else None


def _pool_replicas(pool, role_index: int, first: int, interval: float) -> tuple[list, EngineSettings]:
    """A pool's replicas (time-series ids from `first`) and its engine settings; a prefill instance's KV
    connector holds a finished request's blocks until its KV has left (kv_transfer.NixlProducer), a decode
    instance's reads it (NixlConsumer)."""
    settings = engine_settings(pool.scenario, pool.policy, pool.limits, pool.capacity.bytes_per_block)  # synchronous
    backend_cls = load_backend(pool.scenario.backend.name, pool.scenario.source)
    replicas = []
    for i in range(pool.num_replicas):
        backend = backend_cls(pool.scenario, pool.policy, pool.model, pool.gpu, pool.capacity, settings)
        allocator = ALLOCATORS[settings.allocator](settings, backend.num_blocks)
        connector = (lambda sched: NixlProducer(sched.allocator)) if role_index == 0 else NixlConsumer
        rep = make_connected_replica(i, settings, backend, interval, connector, allocator)
        rep.record.replica = first + i
        replicas.append(rep)
    return replicas, settings


def simulate_disaggregated(scenario, policy, metrics: Metrics,
                           on_progress: Optional[Callable[[int], None]] = None) -> tuple[dict, Simulation]:
    """Simulate one policy on the scenario's prefill and decode pools (kvsim.engine.disaggregated)."""
    dis = disaggregation(scenario, policy)
    prefill, prefill_settings = _pool_replicas(dis.prefill, 0, 0, metrics.interval)
    decode, settings = _pool_replicas(dis.decode, 1, len(prefill), metrics.interval)
    observer = DisaggregationObserver(metrics, len(prefill), len(decode))
    routers = (make_router(prefill_settings, prefill, dis.prefill.capacity.num_blocks),
               make_router(settings, decode, dis.decode.capacity.num_blocks))
    sim = DisaggregatedSimulation(prefill, decode, observer, routers,
                                  KvLink(dis.link, dis.link_bytes_per_block, len(prefill), len(decode)), observer,
                                  dis.kv_transfer == "layerwise", dis.decode.model.num_hidden_layers, on_progress)
    source = arrival_source(scenario, settings.max_model_len, metrics.request_overhead_s)
    end = sim.run(source)
    described = decode[0].backend.describe()
    extra = {**_run_figures(sim, settings, policy, described), "num_replicas": len(prefill) + len(decode)}
    summary = metrics.summary(duration_s=end, num_blocks=dis.decode.capacity.num_blocks * len(decode),
                              block_size=settings.block_size, bytes_per_block=dis.decode.capacity.bytes_per_block,
                              extra=extra, num_replicas=len(decode), kv_replicas=range(len(prefill), len(sim.replicas)))
    summary["disaggregation"] = observer.summary(end, dis.describe(), {p.role: _pool_figures(p) for p in (dis.prefill, dis.decode)})
    if source.closed_loop:
        _clients_figures(summary, source)
    summary["verdict"] = judge(summary).as_dict()
    _error_bars(summary, pool_basis(dis.decode), settings,
                unlike(dis.decode.model, dis.decode.gpu.name, dis.decode.scenario.hardware.tensor_parallel_size,
                       disaggregated=True))
    return summary, sim


def _pool_figures(pool) -> dict:
    hw = pool.scenario.hardware
    return {"gpu": pool.gpu.name, "tensor_parallel_size": hw.tensor_parallel_size, "num_replicas": hw.num_replicas,
            "router": hw.router, "max_num_seqs": pool.limits.max_num_seqs,
            "max_num_batched_tokens": pool.limits.max_num_batched_tokens,
            "num_blocks_per_replica": pool.capacity.num_blocks, "bytes_per_block": pool.capacity.bytes_per_block}


def _run_figures(sim: Simulation, settings: EngineSettings, policy, described: dict) -> dict:
    """summary.json's figures of the engine that ran (beside the metrics'); with speculative decoding,
    its plan and vLLM's spec-decode figures (kvsim.results.speculative)."""
    figures = {
        "engine_events": sim.num_steps,
        "engine_steps": sim.num_decode_steps,
        "preemptions": sum(rep.scheduler.num_preemptions for rep in sim.replicas),
        "backend": described,
        "kv_cache_dtype": policy.kv_cache_dtype,
        "max_num_seqs": settings.max_num_seqs,  # per replica
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "allocator": settings.allocator,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "max_model_len": settings.max_model_len,
        "num_replicas": settings.num_replicas,
        "async_scheduling": settings.async_scheduling,
    }
    if settings.speculation is not None:
        figures["speculative"] = speculative_summary(settings.speculation, [rep.scheduler.counters for rep in sim.replicas])
    return figures


def check_deployments(scenario, model, gpu, policies) -> None:
    """One line, before any output, when a policy's deployment cannot run: an aggregated one on
    [hardware] (kvsim.perf.memory.check_fits), a disaggregated one on its pools
    (kvsim.perf.disaggregation)."""
    aggregated = [p for p in policies if not scenario.disaggregated(p)]
    if aggregated:
        check_fits(scenario, model, gpu, aggregated)
    for p in aggregated:
        if scenario.offloaded(p):  # the offload tiers' keys, checked before any output
            offload_settings(scenario, p, model, gpu, resolve_policy(scenario, p, model, gpu)[0])
    if len(aggregated) < len(policies):
        if scenario.backend.name != "analytic":
            raise KvsimError(f"{scenario.source}: backend.name: disaggregated serving is simulated on the analytic "
                             f"backend only, not {scenario.backend.name!r}")
        for p in policies:
            if scenario.disaggregated(p):
                disaggregation(scenario, p)


def chosen_policies(scenario, names=None) -> list:
    """The scenario's policies named in `names` (all when None), in the scenario's order; an unknown name
    is one line."""
    if names is None:
        return list(scenario.policies)
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise KvsimError(f"--policy: expected a list of policy names, got {names!r}")
    unknown = set(names) - {p.name for p in scenario.policies}
    if unknown:
        raise KvsimError(f"--policy: no policy named {', '.join(sorted(unknown))} in {scenario.source}")
    return [p for p in scenario.policies if p.name in names]


@one_read_per_call  # a trace is read once per run, shared by every policy
def run_scenario(scenario, out_dir: Optional[Path] = None, policies: Optional[list[str]] = None,
                 progress: Optional[Callable[[str, Optional[int]], Callable[[int], None]]] = None,
                 write: bool = True, force: bool = False, workers: Optional[int] = 1, observe=None) -> ScenarioResult:
    """Simulate the scenario's policies (or the named ones) and write the results folder.

    The folder (default `<output.dir>/<name>`) may be new, empty, or an earlier kvsim results folder;
    `force` replaces any other folder (never one that holds the working directory or an input).
    `workers`: policies simulated at once, on forked worker processes (module docstring; None: one
    per policy, up to the cores). `observe`: see simulate_policy (one worker only)."""
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    chosen = chosen_policies(scenario, policies)
    workers = min(len(chosen), os.cpu_count() or 1) if workers is None else workers
    check_int(workers, "--workers", 1, MAX_WORKERS)
    check_deployments(scenario, model, gpu, chosen)  # a model that does not fit fails before any output
    total = expected_count(scenario)  # reads a trace now, so a bad one fails before any output
    interval = timeseries_interval(scenario)
    basis = pricing_basis(scenario, model, gpu)
    overhead = request_overhead_s(scenario, basis, gpu)  # the API server, on TTFT and E2E (measured pricing)
    if out_dir is None:
        out_dir = results_dir(scenario)
    out_dir = user_path(out_dir, "out_dir")
    writer = ResultsWriter(out_dir, force=force, inputs=input_paths(scenario)) if write else None
    result = ScenarioResult(out_dir if write else None, {}, meta={**run_meta(scenario, model, gpu, basis),
                                                                  "timeseries_interval_s": interval})
    try:
        for policy, out in zip(chosen, _simulate_all(scenario, chosen, model, gpu, (interval, overhead, basis), writer,
                                                     progress, total, workers, observe)):
            result.summaries[policy.name] = out.summary
            result.runs.append(PolicyRun(policy.name, out.summary, out.wall_s, out.events))
            if writer:
                writer.add_timeseries(policy.name, out.timeseries)
                writer.add_latencies(policy.name, out.latencies)
        if writer:
            writer.commit(scenario.name or "scenario", result.summaries, result.meta,
                          report_html=scenario.output.report_html)
    except BaseException:
        if writer:
            writer.abort()
        raise
    return result


def simulate_one(scenario, policy, model, gpu, common: tuple, requests_file=None,
                 tick: Optional[Callable[[int], None]] = None, observe=None) -> PolicyOutcome:
    """One policy's simulation, its requests.csv rows streamed into `requests_file`; `common`: what every
    policy shares: the time series' interval, the API server's seconds per request (kvsim.perf.measured)
    and the PricingBasis."""
    interval, overhead, basis = common
    metrics = Metrics(policy.name, scenario.slo, interval, requests_file, request_overhead_s=overhead)
    t0 = time.perf_counter()
    summary, sim = simulate_policy(scenario, policy, model, gpu, metrics, tick, basis, observe)
    wall = time.perf_counter() - t0
    return PolicyOutcome(summary, metrics.timeseries_rows(), metrics.latencies(), wall, sim.num_steps)


def _simulate_all(scenario, chosen: list, model, gpu, common: tuple, writer: Optional[ResultsWriter],
                  progress, total, workers: int, observe=None):
    """Each chosen policy's PolicyOutcome, in order: one after the other, or side by side (module docstring)."""
    workers = min(workers, len(chosen))
    if workers <= 1 or observe is not None or not can_fork() or getattr(
            load_backend(scenario.backend.name, scenario.source), "holds_device", True):  # one from before holds_device
        for policy in chosen:
            tick = progress(policy.name, total) if progress else None
            yield simulate_one(scenario, policy, model, gpu, common, writer.requests_file if writer else None, tick,
                               observe)
        return
    ticks = [progress(p.name, total) if progress else None for p in chosen]
    reads = trace_reads()

    def task(i: int, report) -> PolicyOutcome:
        part = writer.requests_part(i) if writer else None
        with reading(reads):
            out = simulate_one(scenario, chosen[i], model, gpu, common, part, report)
        if part is not None:
            part.close()
        return out

    outcomes = run_forked(task, len(chosen), workers, (lambda i, n: ticks[i](n)) if progress else None)
    for i, out in enumerate(outcomes):
        if writer:
            writer.add_requests_part(i)
        yield out
