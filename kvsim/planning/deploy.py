"""`kvsim plan --target-rate R`: the cheapest deployments (GPU, tensor parallelism, replicas) that
meet the scenario's SLO at R requests/s, with their cost per hour and per million tokens.

1. Layouts: every candidate GPU × tensor-parallel degree whose KV cache holds one max_model_len
   sequence beside the weights (kvsim.perf.memory.kv_capacity) and that splits the attention heads
   evenly; the rest are listed with the reason.
2. One replica of each layout: its maximum sustainable rate r1 (the plan search, kvsim/planning/capacity.py,
   with the first seed only and a coarse `SCOUT_RESOLUTION`: r1 only picks where step 3 starts).
   A layout that would need more than `max_replicas` replicas (R / r1 > max_replicas) is dropped.
3. Replicas: start at n = ceil(R / r1) and simulate n replicas at R (every seed must be
   sustainable); step down while n - 1 still passes, up until one passes (more replicas never
   lower the maximum rate, so the first n that passes from below is the fewest). Layouts are
   taken cheapest lower bound (price × TP × n) first, and one whose lower bound already costs more
   than `top` verified deployments is not simulated further.
4. The `top` cheapest passing deployments get their own maximum rate (the search from R), so
   headroom is measured, not extrapolated.

Cost: `$/hour` is the GPU price (kvsim.scenario.catalog.gpu_price: the scenario's [cost], else the
presets) × GPUs. `$/M input` and `$/M output` charge that hour to the input (resp. output) tokens
served at R: hourly cost / (R × mean tokens per request × 3600) × 10^6, each on its own (they are
not shares of one bill). Points with n replicas replay min(n, 2) × the per-point request count:
more requests for more replicas, within a bounded cost.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Callable, Iterable, Optional

import numpy as np

from kvsim.errors import KvsimError, check_int
from kvsim.planning.capacity import (Frames, PolicyCapacity, Ticker, capacity_search, check_search_args,
                                     default_requests, mean_figures, point_row)
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.points import at_load, base_rate, evaluate_point
from kvsim.planning.search import expected_points
from kvsim.scenario.catalog import GPUS, GpuSpec, gpu_price, gpu_spec, model_spec, tp_problem
from kvsim.scenario import limits
from kvsim.scenario.config import HardwareConfig

TP_DEGREES = (1, 2, 4, 8)
MAX_REPLICAS = 64
REQUEST_SCALE_CAP = 2
SCOUT_RESOLUTION = 0.1
# Layouts whose replica counts are simulated side by side in a round of step 3. A constant, not the
# worker count: which layouts a round visits decides what the cost cutoff prunes, so the points
# simulated (points.csv) would otherwise depend on the machine.
LAYOUTS_PER_ROUND = 4
# the [hardware] keys that override a GPU preset's datasheet figures
_GPU_OVERRIDES = tuple(f for f in GpuSpec.__dataclass_fields__ if f != "name" and f in HardwareConfig.model_fields)


@dataclass(slots=True)
class Deployment:
    """One layout at the fewest replicas that meet the SLO at the target rate (or the reason it cannot)."""

    gpu: str
    tensor_parallel_size: int
    num_replicas: int
    num_gpus: int
    policy: str
    meets_target: bool
    replica_max_rate: float  # one replica's maximum sustainable rate
    max_rate: Optional[float]  # the deployment's (searched for the `top` cheapest; else None)
    ci_low: Optional[float]
    ci_high: Optional[float]
    headroom: Optional[float]  # max_rate / target - 1
    usd_per_hour: float
    usd_per_m_input: float
    usd_per_m_output: float
    price_source: str
    binding: Optional[str] = None  # at the deployment's knee (else at one replica's)
    binding_detail: Optional[str] = None
    at_target: dict = field(default_factory=dict)  # mean point figures at the target rate

    @property
    def label(self) -> str:
        return f"{self.gpu} TP{self.tensor_parallel_size}×{self.num_replicas}"

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "at_target"}
        out.update({f"at_target_{k}": v for k, v in self.at_target.items()})
        return out


@dataclass(slots=True)
class DeployResult(Frames):
    """`kvsim.deploy`'s answer: passing deployments cheapest first, then the layouts that failed."""

    target_rate: float
    meta: dict
    deployments: list[Deployment]  # meets_target first, by $/hour
    skipped: list[dict] = field(default_factory=list)  # {gpu, tensor_parallel_size, reason}
    points: list[dict] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [d.row() for d in self.deployments]

    def to_dict(self) -> dict:
        return {"target_rate": self.target_rate, "meta": self.meta,
                "deployments": [{**asdict(d), "label": d.label} for d in self.deployments],
                "skipped": self.skipped, "points": self.points}


def _hardware(scenario, gpu: str, tp: int, replicas: int) -> dict:
    """[hardware] updates for a layout: the scenario's datasheet overrides apply to its own GPU only."""
    out = {"gpu": gpu, "tensor_parallel_size": tp, "num_replicas": replicas}
    if gpu.lower() != scenario.hardware.gpu.lower():
        out.update({f: None for f in _GPU_OVERRIDES})
    return out


def layouts(scenario, policy: str, gpus, tps) -> tuple[list[tuple[str, int]], list[dict]]:
    """(feasible (gpu, tp) layouts, skipped ones with the reason)."""
    from kvsim.perf.memory import kv_capacity

    ok, skipped = [], []
    base = model_spec(scenario.model_copy(update={"hardware": scenario.hardware.model_copy(
        update={"tensor_parallel_size": 1})}))
    for gpu in gpus:
        for tp in tps:
            reason = tp_problem(base, tp)
            if not reason and gpu_price(scenario, gpu) is None:
                reason = "no price (set cost.gpu_hour_usd)"
            if not reason:
                sc = at_load(scenario, base_rate(scenario), policies=[policy],
                             overrides={"hardware": _hardware(scenario, gpu, tp, 1)})
                try:
                    kv_capacity(sc, sc.policies[0], model_spec(sc), gpu_spec(sc))
                except KvsimError as exc:
                    reason = str(exc).split(": ", 1)[-1]
            if reason:
                skipped.append({"gpu": gpu, "tensor_parallel_size": tp, "reason": reason})
            else:
                ok.append((gpu, tp))
    return ok, skipped


def tokens_per_request(scenario, n: int) -> tuple[float, float]:
    """Mean prompt and output tokens of the first n requests of the scenario's workload."""
    from kvsim.scenario.workload import generate_requests

    reqs = list(islice(generate_requests(scenario), n))
    if not reqs:
        return 0.0, 0.0
    return (float(np.mean([r.prompt_len for r in reqs])), float(np.mean([r.output_len for r in reqs])))


def deploy(scenario, target_rate: float, *, gpus: Optional[list[str]] = None, tensor_parallel=TP_DEGREES,
           policy: Optional[str] = None, seeds: int = 3, resolution: float = 0.02, num_requests: Optional[int] = None,
           top: int = 3, max_replicas: int = MAX_REPLICAS, workers: Optional[int] = None, ray: Optional[str] = None,
           executor=None, progress: Optional[Callable[[int, int], None]] = None) -> DeployResult:
    """The cheapest layouts meeting the SLO at `target_rate`; see the module docstring."""
    from kvsim.pipeline import chosen_policies

    if isinstance(target_rate, bool) or not isinstance(target_rate, (int, float)) or not target_rate > 0:
        raise KvsimError(f"--target-rate must be positive, got {target_rate!r}")
    check_search_args(seeds, resolution, num_requests)
    check_int(top, "--top", 1, limits.MAX_REPLICAS)
    check_int(max_replicas, "--max-replicas", 1, limits.MAX_REPLICAS)
    if isinstance(tensor_parallel, (str, bytes)) or not isinstance(tensor_parallel, Iterable):
        raise KvsimError(f"--tp: expected a list of tensor-parallel degrees, got {tensor_parallel!r}")
    tensor_parallel = tuple(tensor_parallel)
    for tp in tensor_parallel:
        check_int(tp, "--tp", 1, limits.MAX_TENSOR_PARALLEL)
    policy = policy or scenario.policies[0].name
    chosen_policies(scenario, [policy])  # an unknown name is one line
    known = {g.lower(): g for g in GPUS}
    unknown = [g for g in (gpus or []) if g.lower() not in known]
    if unknown:
        raise KvsimError(f"--gpu: unknown GPU {', '.join(unknown)} (presets: {', '.join(GPUS)})")
    gpus = [known[g.lower()] for g in gpus] if gpus else list(GPUS)
    n_req = num_requests or default_requests(scenario)
    trace_rate = base_rate(scenario, n_req) if scenario.workload.arrival.process == "trace" else None
    seed_list = [scenario.workload.seed + i for i in range(seeds)]
    ok, skipped = layouts(scenario, policy, gpus, tensor_parallel)
    tick = Ticker(progress, len(ok) * (expected_points(SCOUT_RESOLUTION) + 2 * seeds)
                  + top * seeds * expected_points(resolution))
    own = executor is None
    executor = executor or make_executor(workers, ray)
    try:
        deployments, points, pruned = _search(executor, scenario, policy, target_rate, ok, seed_list, resolution,
                                              n_req, trace_rate, top, max_replicas, tick)
        skipped += pruned
    finally:
        if own:
            executor.close()
    prompt, output = tokens_per_request(at_load(scenario, target_rate, num_requests=n_req, trace_rate=trace_rate), n_req)
    for d in deployments:
        per_hour = target_rate * 3600
        d.usd_per_m_input = d.usd_per_hour / (per_hour * prompt) * 1e6 if prompt else math.inf
        d.usd_per_m_output = d.usd_per_hour / (per_hour * output) * 1e6 if output else math.inf
    deployments.sort(key=lambda d: (not d.meets_target, d.usd_per_hour, -(d.max_rate or 0.0), d.num_gpus, d.gpu,
                                    d.tensor_parallel_size))
    meta = {"model": model_spec(scenario).name, "policy": policy, "slo": scenario.slo.model_dump(),
            "seeds": seed_list, "num_requests": n_req, "resolution": resolution, "gpus": gpus,
            "tensor_parallel": list(tensor_parallel), "mean_prompt_tokens": prompt, "mean_output_tokens": output,
            "top": top}
    return DeployResult(target_rate, meta, deployments, skipped, points)


def _search(executor, scenario, policy, target, ok, seeds, resolution, n_req, trace_rate, top, max_replicas, tick):
    def hardware(label, replicas=1):
        return {"hardware": _hardware(scenario, label[0], label[1], replicas)}

    def name(lay) -> str:
        return f"{lay[0]} TP{lay[1]}"

    # 2. one replica of each layout (one seed, coarse): where the replica count starts
    single, points = capacity_search(
        executor, scenario, ok, seeds[:1], SCOUT_RESOLUTION, tick, start=target / 2, num_requests=lambda label: n_req,
        trace_rate=trace_rate, overrides_of=hardware, policy_of=lambda label: policy, confirm=False, key="layout")
    r1 = dict(zip(ok, single))
    for row in points:
        row["layout"], row["num_replicas"], row["phase"] = name(row["layout"]), 1, "replica_scout"
    skipped = []
    state = {}
    for lay in ok:
        rate = r1[lay].max_rate
        n0 = math.ceil(target / rate) if rate > 0 else math.inf
        if n0 > max_replicas:
            skipped.append({"gpu": lay[0], "tensor_parallel_size": lay[1], "reason":
                            f"one replica sustains {rate:.3g} req/s: more than {max_replicas} replicas needed"})
            continue
        state[lay] = {"n": n0, "pass": None, "fail": None, "price": gpu_price(scenario, lay[0]).usd_per_hour * lay[1]}

    # 3. the fewest replicas that pass at the target rate, cheapest lower bound first
    def requests(n: int) -> int:
        return n_req * min(n, REQUEST_SCALE_CAP)

    def lower_bound(lay) -> float:
        st = state[lay]
        least = st["fail"] + 1 if st["fail"] is not None else max(1, st["n"] - 1)
        return st["price"] * least

    results: dict = {}
    queue = sorted(state, key=lambda lay: (lower_bound(lay), lay))
    active: list = []
    width = max(top, LAYOUTS_PER_ROUND)
    while queue or active:
        passed = sorted(state[lay]["price"] * state[lay]["pass"] for lay in state if state[lay]["pass"] is not None)
        cutoff = passed[top - 1] if len(passed) >= top else math.inf
        for lay in [lay for lay in queue + active if lower_bound(lay) > cutoff]:
            (queue if lay in queue else active).remove(lay)
            if state[lay]["pass"] is None:
                skipped.append({"gpu": lay[0], "tensor_parallel_size": lay[1], "reason":
                                f"pruned: at least ${lower_bound(lay):.2f}/h, dearer than {top} passing deployments"})
        while queue and len(active) < width:
            active.append(queue.pop(0))
        todo = [(lay, state[lay]["n"]) for lay in active]
        if not todo:
            continue
        tasks = [(scenario, policy, target, seed, requests(n), trace_rate, hardware(lay, n)) for lay, n in todo for seed in seeds]
        recs = run_all(executor, evaluate_point, tasks, lambda i, r: tick())
        for i, (lay, n) in enumerate(todo):
            group = recs[i * len(seeds):(i + 1) * len(seeds)]
            results[(lay, n)] = group
            points += [{**point_row(name(lay), seed, target, "at_target", rec, "layout"), "num_replicas": n}
                       for seed, rec in zip(seeds, group)]
            st = state[lay]
            if all(r["sustainable"] for r in group):
                st["pass"], st["n"] = n, (n - 1 if n > 1 and st["fail"] is None else None)
            else:
                st["fail"], st["n"] = n, (n + 1 if st["pass"] is None and n < max_replicas else None)
            if st["n"] is None:
                active.remove(lay)
    deployments = []
    for lay, st in state.items():
        n = st["pass"] if st["pass"] is not None else st["fail"]
        if n is None:
            continue  # pruned before any simulation
        price = gpu_price(scenario, lay[0])
        deployments.append(Deployment(
            lay[0], lay[1], n, lay[1] * n, policy, st["pass"] is not None, r1[lay].max_rate, None, None, None, None,
            st["price"] * n, math.nan, math.nan, f"{price.source} ({price.date})".replace(" ()", ""),
            r1[lay].binding, r1[lay].binding_detail, mean_figures(results[(lay, n)])))

    # 4. the deployment's own maximum rate for the cheapest that pass
    best = sorted((d for d in deployments if d.meets_target), key=lambda d: (d.usd_per_hour, d.num_gpus, d.gpu))[:top]
    if best:
        labels = [(d.gpu, d.tensor_parallel_size, d.num_replicas) for d in best]
        answers, rows = capacity_search(
            executor, scenario, labels, seeds, resolution, tick, start=target,
            num_requests=lambda label: requests(label[2]), trace_rate=trace_rate,
            overrides_of=lambda label: hardware(label[:2], label[2]), policy_of=lambda label: policy,
            confirm=False, key="layout")
        for d, ans in zip(best, answers):
            _take(d, ans, target)
        for row in rows:
            gpu, tp, n = row["layout"]
            row["layout"], row["num_replicas"], row["phase"] = f"{gpu} TP{tp}", n, "deployment_search"
        points += rows
    return deployments, points, skipped


def _take(d: Deployment, ans: PolicyCapacity, target: float) -> None:
    d.max_rate, d.ci_low, d.ci_high = ans.max_rate, ans.ci_low, ans.ci_high
    d.headroom = ans.max_rate / target - 1.0
    if ans.binding is not None:
        d.binding, d.binding_detail = ans.binding, ans.binding_detail
