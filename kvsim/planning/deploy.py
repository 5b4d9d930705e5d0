"""`kvsim plan --target-rate R`: the cheapest deployments (GPU, tensor parallelism, replicas and KV
policy) that meet the scenario's SLO at R requests/s, with their cost per hour and per million tokens.

1. Layouts: every candidate GPU × tensor-parallel degree × policy (default: every policy of the
   scenario that `vllm serve` can run, kvsim.scenario.layout.serve_problem: the answer is a
   deployment to start) whose KV cache holds one max_model_len sequence beside the weights
   (kvsim.perf.memory.kv_capacity) and that splits the attention heads evenly; the rest are listed
   with the reason and its kind (`SKIP_KINDS`). When none is left there is nothing to simulate: the
   request is bad input (one line naming the flags), not an answer.
2. One replica of each layout: its maximum sustainable rate r1 (the plan search,
   kvsim/planning/capacity.py, with the first seed only and a coarse `SCOUT_RESOLUTION`). Each GPU
   and TP degree keeps the policy with the highest r1 (the scenario's order breaks ties); r1 also
   picks where step 3 starts. A layout whose one replica sustains no rate at all is dropped (more
   replicas serve each request no faster); one that would need more than `max_replicas` replicas by
   r1 (R / r1 > max_replicas) too, as an estimate.
3. Replicas: simulate n replicas at R; n *passes* when every seed and a run `LONG_RUN` times longer
   are sustainable (kvsim/planning/safe.py). More replicas never lower the maximum rate, so a failure
   at n rules out every count below it and a pass every count above: starting at n = ceil(R / r1),
   step down while passing, up while failing, until the fewest passing count is pinned. Layouts are
   taken by estimated cost (price × TP × ceil(R / r1)) first; once `top` layouts pass, the `top`-th
   cheapest cost is a cutoff: a layout jumps straight to the most replicas within it, and is pruned
   only when a failure proves it dearer (price × TP × (failing n + 1) > cutoff). The result lists
   the passing deployments that cost no more than the cutoff, so nothing pruned can be cheaper than
   a deployment shown; dearer passing ones are listed with the skipped layouts.
4. The `top` cheapest passing deployments get their own safe rate (the plan's, searched from R), so
   headroom is measured, not extrapolated.

A closed loop (arrival process immediate with `max_concurrency` clients) is planned as the open
loop of its requests at R, Poisson, as `vllm bench serve --request-rate R` runs without
--max-concurrency (`rate_based`); vllm bench's semaphore over an arrival process keeps its clients;
multi-turn sessions are refused (plan their concurrency instead).

Cost: `$/hour` is the GPU price × every GPU (kvsim.scenario.layout: replicas × TP × DP).
`$/M input` and `$/M output` charge that hour to the input (resp. output) tokens served at R:
hourly cost / (R × mean tokens per request × 3600) × 10^6, each on its own (they are not shares of
one bill). Every point at the target replays `REQUEST_SCALE_CAP` × the per-point request count,
whatever the layout: the runs are as long for one replica as for many, so no layout passes a
shorter check than another (a longer run queues longer: one replica passing 4,000 requests could
fail the 8,000 a larger layout was checked with). Each deployment carries the `vllm serve` flags
of its replicas (`vllm_flags`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Callable, Iterable, Optional

import numpy as np

from kvsim.errors import KvsimError, check_int
from kvsim.planning.capacity import (Frames, PolicyCapacity, Ticker, capacity_search, check_search_args,
                                     default_requests, mean_figures, point_row)
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.parallel import Parallel, candidates, hardware_keys
from kvsim.planning.points import at_load, base_rate, evaluate_point, replications, run_length
from kvsim.planning.sensitivity import check_scale, with_step_scale
from kvsim.planning.replicas import ReplicaCount
from kvsim.planning.safe import LONG_RUN
from kvsim.planning.search import expected_points
from kvsim.scenario.catalog import GPUS, GpuSpec, gpu_price, gpu_spec, model_spec, tp_problem
from kvsim.scenario.layout import deployment_text, layout_cost, layout_text, serve_flags, serve_problem
from kvsim.scenario import limits
from kvsim.scenario.config import HardwareConfig, scenario_from_dict

TP_DEGREES = (1, 2, 4, 8)
MAX_REPLICAS = 64
REQUEST_SCALE_CAP = 2
SCOUT_RESOLUTION = 0.1
SCOUT_REQUESTS = 1000  # the scout only picks the policy and where step 3 starts: its knee may be a little high
# Layouts whose replica counts are simulated side by side in a round of step 3. A constant, not the
# worker count: which layouts a round visits decides what the cost cutoff prunes, so the points
# simulated (points.csv) would otherwise depend on the machine.
LAYOUTS_PER_ROUND = 4
# Why a layout was left out, by kind (a skipped entry's "kind"), as the summary line counts them.
SKIP_KINDS = {"tensor_parallel": "split the model's heads unevenly", "no_price": "have no price",
              "not_vllm": "use a policy vllm serve cannot run", "does_not_fit": "do not fit",
              "no_rate": "meet the SLO at no rate", "max_replicas": "need more than --max-replicas",
              "dearer": "cost more than those listed"}
# the [hardware] keys that override a GPU preset's datasheet figures
_GPU_OVERRIDES = tuple(f for f in GpuSpec.__dataclass_fields__ if f != "name" and f in HardwareConfig.model_fields)


@dataclass(slots=True)
class Deployment:
    """One layout at the fewest replicas that meet the SLO at the target rate."""

    gpu: str
    tensor_parallel_size: int
    num_replicas: int
    num_gpus: int
    policy: str
    meets_target: bool
    replica_rate: float  # one replica's knee, coarse (the scout)
    safe_rate: Optional[float]  # the deployment's own (searched for the `top` cheapest; else None)
    mean_rate: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    headroom: Optional[float]  # safe_rate / target - 1
    usd_per_hour: float
    usd_per_m_input: float
    usd_per_m_output: float
    price_source: str
    binding: Optional[str] = None  # at the deployment's knee (else at one replica's)
    binding_detail: Optional[str] = None
    at_target: dict = field(default_factory=dict)  # mean point figures at the target rate
    pricing: str = ""  # "measured" or "estimated" (kvsim.perf.basis.PricingBasis.label)
    pricing_why: str = ""
    data_parallel_size: int = 1  # a MoE model's DP attention ranks a replica (kvsim.planning.parallel)
    enable_expert_parallel: bool = False
    vllm_flags: str = ""  # `vllm serve` flags of one replica (kvsim.scenario.layout.serve_flags)

    def __post_init__(self):
        if isinstance(self.tensor_parallel_size, Parallel):
            par = self.tensor_parallel_size
            self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel = par.tp, par.dp, par.ep

    @property
    def layout(self):
        """The replica's parallel layout as the search knows it."""
        return Parallel(self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel) \
            if self.data_parallel_size > 1 or self.enable_expert_parallel else self.tensor_parallel_size

    @property
    def label(self) -> str:
        return f"{self.gpu} TP{self.layout}×{self.num_replicas}"

    @property
    def layout_name(self) -> str:
        """The replica's layout, e.g. 'TP 4', 'TP 1 × DP 2 + EP'."""
        return layout_text(self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel)

    def answer(self, policy: Optional[str] = None) -> str:
        """e.g. '12 × H100-SXM as TP 4 × 3 replicas, $35.88/h (policy paged-fp8)' (`policy`: its label, if not the name)."""
        where = deployment_text(self.gpu, self.tensor_parallel_size, self.num_replicas, self.data_parallel_size,
                                self.enable_expert_parallel)
        return f"{where}, ${self.usd_per_hour:,.2f}/h (policy {policy or self.policy})"

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "at_target"}
        out.update({f"at_target_{k}": v for k, v in self.at_target.items()})
        return out


@dataclass(slots=True)
class DeployResult(Frames):
    """`kvsim.deploy`'s answer: passing deployments cheapest first, then the layouts left out."""

    target_rate: float
    meta: dict
    deployments: list[Deployment]  # cheapest first; every one meets the target
    skipped: list[dict] = field(default_factory=list)  # {gpu, tensor_parallel_size, policy, reason}
    points: list[dict] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [d.row() for d in self.deployments]

    def to_dict(self) -> dict:
        return {"target_rate": self.target_rate, "meta": self.meta,
                "deployments": [{**asdict(d), "label": d.label} for d in self.deployments],
                "skipped": self.skipped, "skipped_by_kind": skip_counts(self.skipped), "points": self.points}


def skip_counts(skipped: list[dict]) -> dict[str, int]:
    """How many layouts were left out of each kind (SKIP_KINDS), most first."""
    return dict(Counter(s.get("kind", "other") for s in skipped).most_common())


def _hardware(scenario, gpu: str, tp: int, replicas: int) -> dict:
    """[hardware] updates for a layout: the scenario's datasheet overrides apply to its own GPU only."""
    out = {"gpu": gpu, **hardware_keys(tp), "num_replicas": replicas}
    if gpu.lower() != scenario.hardware.gpu.lower():
        out.update({f: None for f in _GPU_OVERRIDES})
    return out


def layouts(scenario, policies: list[str], gpus, tps) -> tuple[list[tuple[str, int, str]], list[dict]]:
    """(feasible (gpu, tp, policy) layouts, skipped ones with the reason and its kind)."""
    from kvsim.perf.memory import kv_capacity

    ok, skipped = [], []
    base = model_spec(scenario.model_copy(update={"hardware": scenario.hardware.model_copy(
        update={"tensor_parallel_size": 1})}))
    for gpu in gpus:
        for tp in candidates(base, tps):  # a MoE model's: TP x DP x EP
            reason, kind = tp_problem(base, getattr(tp, "tp", tp)), "tensor_parallel"
            if not reason and gpu_price(scenario, gpu) is None:
                reason, kind = "no price (set cost.gpu_hour_usd)", "no_price"
            if reason:
                skipped.append({"gpu": gpu, **hardware_keys(tp), "policy": "*", "reason": reason, "kind": kind})
                continue
            for policy in policies:
                sc = at_load(scenario, base_rate(scenario), policies=[policy],
                             overrides={"hardware": _hardware(scenario, gpu, tp, 1)})
                try:
                    kv_capacity(sc, sc.policies[0], model_spec(sc), gpu_spec(sc))
                    ok.append((gpu, tp, policy))
                except KvsimError as exc:
                    skipped.append({"gpu": gpu, **hardware_keys(tp), "policy": policy,
                                    "reason": str(exc).split(": ", 1)[-1], "kind": "does_not_fit"})
    return ok, skipped


def served_policies(scenario, names) -> tuple[list[str], list[dict]]:
    """The candidate policies `vllm serve` can run (of `names`, default every policy of the scenario),
    and the others as skipped entries; one line naming --policy when none is left."""
    from kvsim.pipeline import chosen_policies

    chosen = chosen_policies(scenario, names)  # an unknown name is one line
    ok = [p.name for p in chosen if not serve_problem(p)]
    skipped = [{"gpu": "*", "tensor_parallel_size": "*", "policy": p.name, "reason": serve_problem(p),
                "kind": "not_vllm"} for p in chosen if serve_problem(p)]
    if not ok:
        raise KvsimError("--policy: no candidate policy vllm serve can run, so no deployment to recommend: "
                         + "; ".join(f"{s['policy']}: {s['reason']}" for s in skipped))
    return ok, skipped


def no_layout(skipped: list[dict], gpus, tps) -> KvsimError:
    """The one-line error when no candidate layout is left to simulate: the flags and why."""
    reasons = list(dict.fromkeys(s["reason"] for s in skipped))
    flags = (f"--gpu {' '.join(gpus)} " if gpus else "") + f"--tp {' '.join(str(t) for t in tps)}"
    return KvsimError(f"{flags}: no candidate layout can serve the model, nothing to simulate: "
                      + "; ".join(reasons[:4]) + (f"; and {len(reasons) - 4} more" if len(reasons) > 4 else ""))


def layout_basis(scenario, gpu: str, tp) -> tuple[str, str]:
    """Whether a layout's answers are measured or estimated, and why (kvsim.perf.basis)."""
    from kvsim.perf.basis import pricing_basis

    sc = at_load(scenario, base_rate(scenario), overrides={"hardware": _hardware(scenario, gpu, tp, 1)})
    basis = pricing_basis(sc, model_spec(sc), gpu_spec(sc))
    return basis.label, basis.why


def tokens_per_request(scenario, n: int) -> tuple[float, float]:
    """Mean prompt and output tokens of the first n requests of the scenario's workload."""
    from kvsim.scenario.workload import generate_requests

    reqs = list(islice(generate_requests(scenario), n))
    if not reqs:
        return 0.0, 0.0
    return (float(np.mean([r.prompt_len for r in reqs])), float(np.mean([r.output_len for r in reqs])))


def deploy(scenario, target_rate: float, *, gpus: Optional[list[str]] = None, tensor_parallel=TP_DEGREES,
           policy=None, seeds: int = 3, resolution: float = 0.02, num_requests: Optional[int] = None,
           top: int = 3, max_replicas: int = MAX_REPLICAS, workers: Optional[int] = None, ray: Optional[str] = None,
           executor=None, progress: Optional[Callable[[int, int], None]] = None, headroom: bool = True,
           exhaustive: bool = False) -> DeployResult:
    """The cheapest layouts meeting the SLO at `target_rate`; `policy`: a name or a list of the
    candidate policies (default: every policy of the scenario `vllm serve` can run); `headroom=False` skips step 4 (no
    deployment's own safe rate); `exhaustive`: every point simulated whole, every search in full
    (kvsim.planning.capacity.capacity_search's `fast`). See the module docstring."""
    check_target_rate(target_rate)
    check_search_args(seeds, resolution, num_requests)
    check_int(top, "--top", 1, limits.MAX_REPLICAS)
    check_int(max_replicas, "--max-replicas", 1, limits.MAX_REPLICAS)
    if isinstance(tensor_parallel, (str, bytes)) or not isinstance(tensor_parallel, Iterable):
        raise KvsimError(f"--tp: expected a list of tensor-parallel degrees, got {tensor_parallel!r}")
    tensor_parallel = tuple(tensor_parallel)
    for tp in tensor_parallel:
        check_int(tp, "--tp", 1, limits.MAX_TENSOR_PARALLEL)
    names = [policy] if isinstance(policy, str) else policy
    policies, not_served = served_policies(scenario, names)
    known = {g.lower(): g for g in GPUS}
    unknown = [g for g in (gpus or []) if g.lower() not in known]
    if unknown:
        raise KvsimError(f"--gpu: unknown GPU {', '.join(unknown)} (presets: {', '.join(GPUS)})")
    asked, gpus = gpus or [], [known[g.lower()] for g in gpus] if gpus else list(GPUS)
    closed = scenario.workload.arrival.process == "immediate"
    scenario = rate_based(scenario)
    n_req = num_requests or default_requests(scenario)
    trace_rate = base_rate(scenario, n_req) if scenario.workload.arrival.process == "trace" else None
    kept, why = replications(scenario, n_req * REQUEST_SCALE_CAP, seeds)  # a replayed trace: its windows
    seed_list = [scenario.workload.seed + i for i in range(kept)]
    ok, skipped = layouts(scenario, policies, gpus, tensor_parallel)
    if not ok:
        raise no_layout(skipped, asked, tensor_parallel)
    skipped = not_served + skipped
    per_check = seeds + LONG_RUN
    tick = Ticker(progress, len(ok) * expected_points(SCOUT_RESOLUTION)
                  + len({lay[:2] for lay in ok}) * 2 * per_check
                  + (top * (seeds * expected_points(resolution) + per_check) if headroom else 0))
    own = executor is None
    executor = executor or make_executor(workers, ray)
    try:
        search = _Search(executor, scenario, target_rate, seed_list, resolution, n_req, trace_rate, top,
                         max_replicas, tick, headroom, not exhaustive)
        deployments = search.run(ok)
        skipped += search.skipped
    finally:
        if own:
            executor.close()
    prompt, output = tokens_per_request(at_load(scenario, target_rate, num_requests=n_req, trace_rate=trace_rate), n_req)
    for d in deployments:
        per_hour = target_rate * 3600
        d.usd_per_m_input = d.usd_per_hour / (per_hour * prompt) * 1e6 if prompt else math.inf
        d.usd_per_m_output = d.usd_per_hour / (per_hour * output) * 1e6 if output else math.inf
    deployments.sort(key=lambda d: (d.usd_per_hour, -(d.safe_rate or 0.0), d.num_gpus, d.gpu, d.tensor_parallel_size))
    for d in deployments:
        d.pricing, d.pricing_why = layout_basis(scenario, d.gpu, d.layout)
        policy = next(p for p in scenario.policies if p.name == d.policy)
        d.vllm_flags = serve_flags(scenario, policy, d.tensor_parallel_size, d.data_parallel_size,
                                   d.enable_expert_parallel)
    meta = {"model": model_spec(scenario).name, "policies": policies, "slo": scenario.slo.model_dump(),
            "seeds": seed_list, "num_requests": n_req * REQUEST_SCALE_CAP,
            "long_run_requests": run_length(scenario, LONG_RUN * REQUEST_SCALE_CAP * n_req),
            "resolution": resolution, "gpus": gpus, "tensor_parallel": list(tensor_parallel),
            "mean_prompt_tokens": prompt, "mean_output_tokens": output, "top": top, "headroom": headroom,
            "scout": search.scout, "from_closed_loop": closed, "seeds_asked": seeds, "replications_note": why,
            "safe_check_step_time_scale": check_scale(scenario)}
    return DeployResult(target_rate, meta, deployments, skipped, search.points)


def check_target_rate(target_rate) -> None:
    """One line for a target rate no search can meet: not a finite positive number."""
    if isinstance(target_rate, bool) or not isinstance(target_rate, (int, float)) or not target_rate > 0:
        raise KvsimError(f"--target-rate must be positive, got {target_rate!r}")
    if target_rate == math.inf:
        raise KvsimError(f"--target-rate must be finite (requests/s), got {target_rate!r}")


def rate_based(scenario):
    """The scenario with requests at a rate: a closed loop (arrival process immediate, clients) is
    planned as the open loop `vllm bench serve --request-rate R` without --max-concurrency runs,
    Poisson arrivals of the same requests (its clients and think time dropped); multi-turn sessions
    are refused (their rate is in sessions and their turns wait on replies: plan their concurrency)."""
    wl = scenario.workload
    if wl.sessions is not None:
        raise KvsimError(f"{scenario.source}: --target-rate plans requests per second; a scenario of multi-turn "
                         "sessions is planned by its concurrency: kvsim plan without --target-rate")
    if wl.arrival.process != "immediate":
        return scenario
    data = scenario.model_dump()
    data["workload"].update(arrival={"process": "poisson", "rate": 1.0}, max_concurrency=None, think_time_s=None)
    return scenario_from_dict(data, scenario.source, scenario.base_dir)


class _Search:
    """Steps 2-4 of the module docstring."""

    def __init__(self, executor, scenario, target, seeds, resolution, n_req, trace_rate, top, max_replicas, tick,
                 headroom: bool = True, fast: bool = False):
        self.executor, self.scenario, self.target, self.seeds = executor, scenario, target, seeds
        self.resolution, self.n_req, self.trace_rate, self.top = resolution, n_req, trace_rate, top
        self.max_replicas, self.tick, self.headroom, self.fast = max_replicas, tick, headroom, fast
        self.points: list[dict] = []
        self.skipped: list[dict] = []
        self.scout: list[dict] = []

    def hardware(self, lay, replicas: int = 1) -> dict:
        return {"hardware": _hardware(self.scenario, lay[0], lay[1], replicas)}

    def requests(self, n: int) -> int:
        """Requests a point at the target replays: the same for every replica count (module docstring)."""
        return self.n_req * REQUEST_SCALE_CAP

    def skip(self, lay, reason: str, kind: str) -> None:
        self.skipped.append({"gpu": lay[0], **hardware_keys(lay[1]), "policy": lay[2], "reason": reason,
                             "kind": kind})

    def run(self, ok: list) -> list[Deployment]:
        best = self.best_policies(ok)
        states = self.fewest_replicas(best)
        return self.search_top(states, best)

    def best_policies(self, ok: list) -> dict:
        """Step 2: {(gpu, tp, policy): one replica's scouted answer}, one policy per GPU and TP."""
        single, rows = capacity_search(
            self.executor, self.scenario, ok, self.seeds[:1], SCOUT_RESOLUTION, self.tick, start=self.target / 2,
            num_requests=lambda label: min(self.n_req, SCOUT_REQUESTS), trace_rate=self.trace_rate, overrides_of=self.hardware,
            policy_of=lambda label: label[2], confirm=False, key="layout", fast=self.fast)
        for row in rows:
            gpu, tp, policy = row["layout"]
            row.update(layout=f"{gpu} TP{tp}", policy=policy, num_replicas=1, phase="replica_scout")
        self.points += rows
        chosen: dict = {}
        for lay, ans in zip(ok, single):
            self.scout.append({"gpu": lay[0], **hardware_keys(lay[1]), "policy": lay[2],
                               "replica_rate": ans.mean_rate})
            held = chosen.get(lay[:2])
            if held is None or ans.mean_rate > held[1].mean_rate:
                chosen[lay[:2]] = (lay, ans)
        best = {}
        for lay, ans in chosen.values():
            if ans.mean_rate <= 0:
                self.skip(lay, "one replica meets the SLO at no rate tried, so no replica count can", "no_rate")
            elif self.target / ans.mean_rate > self.max_replicas:
                self.skip(lay, f"one replica sustains about {ans.mean_rate:.3g} req/s: more than "
                               f"{self.max_replicas} replicas needed", "max_replicas")
            else:
                best[lay] = ans
        return best

    def check(self, todo: list) -> None:
        """Simulate each (layout state, count, long) at the target: every seed (fast: the first, then the
        others where it passed; a count fails on any seed), or the long run."""
        scale = check_scale(self.scenario)  # the target must hold with steps dearer than priced

        def task(st, n, seed, long):
            return (self.scenario, st.lay[2], self.target, seed, self.requests(n) * (LONG_RUN if long else 1),
                    self.trace_rate, with_step_scale(self.hardware(st.lay, n), scale), self.fast)

        first = self.seeds[:1] if self.fast else self.seeds  # fast: the other seeds only where the first passed
        jobs = [(st, n, seed, long) for st, n, long in todo for seed in ([self.seeds[0]] if long else first)]
        recs = run_all(self.executor, evaluate_point, [task(*job) for job in jobs], lambda i, r: self.tick())
        if self.fast and len(self.seeds) > 1:
            more = [(st, n, seed, False) for (st, n, _, long), rec in zip(jobs, recs) if not long and rec["sustainable"]
                    for seed in self.seeds[1:]]
            jobs += more
            recs += run_all(self.executor, evaluate_point, [task(*job) for job in more], lambda i, r: self.tick())
        got: dict = {}
        for (st, n, seed, long), rec in zip(jobs, recs):
            got.setdefault((id(st), n, long), []).append(rec)
            self.points.append({**point_row(f"{st.lay[0]} TP{st.lay[1]}", seed, self.target,
                                            "at_target_long" if long else "at_target", rec, "layout"),
                                "policy": st.lay[2], "num_replicas": n})
        for st, n, long in todo:
            group = got[(id(st), n, long)]
            if long:
                st.long_done(n, group[0])
            else:
                st.seeds_done(n, group)

    def fewest_replicas(self, best: dict) -> list[ReplicaCount]:
        """Step 3: each layout's fewest passing replica count, or its proof of being dearer."""
        states = []
        for lay, ans in best.items():
            price = layout_cost(self.scenario, lay[0], int(lay[1])).usd_per_hour  # one replica: TP x DP GPUs
            states.append(ReplicaCount(lay, price, math.ceil(self.target / ans.mean_rate)))
        queue = sorted(states, key=lambda st: (st.price * st.guess, st.lay))
        active: list = []
        width = max(self.top, LAYOUTS_PER_ROUND)
        while queue or active:
            cutoff = self.cutoff(states)
            for st in [st for st in queue + active if st.prunable(cutoff)]:
                (queue if st in queue else active).remove(st)
                self.skip(st.lay, f"pruned: fails with {st.failed} replica{'s' if st.failed != 1 else ''}, so at least "
                                  f"${st.price * st.lo:,.2f}/h, dearer than {self.top} passing deployments"
                          if st.failed else f"pruned: at least ${st.price:,.2f}/h, dearer than {self.top} passing "
                                            "deployments", "dearer")
            while queue and len(active) < width:
                active.append(queue.pop(0))
            todo = [(st, st.next_check(cutoff, self.max_replicas)) for st in active]
            for st, nxt in todo:
                if nxt is None:
                    active.remove(st)
            todo = [(st, *nxt) for st, nxt in todo if nxt is not None]
            if todo:
                self.check(todo)
        return states

    def cutoff(self, states: list[ReplicaCount]) -> float:
        costs = sorted(st.price * st.passed for st in states if st.passed is not None)
        return costs[self.top - 1] if len(costs) >= self.top else math.inf

    def search_top(self, states: list[ReplicaCount], best: dict) -> list[Deployment]:
        """Step 4, and the deployments: pinned layouts within the cutoff (dearer ones are skipped)."""
        cutoff = self.cutoff(states)
        deployments = []
        for st in states:
            if not st.pinned:
                if st.passed is None and st.lo > self.max_replicas:
                    self.skip(st.lay, f"fails with {self.max_replicas} replicas (--max-replicas)", "max_replicas")
                continue
            cost = st.price * st.passed
            if cost > cutoff * (1 + 1e-12):
                self.skip(st.lay, f"passes with {st.passed} replicas at ${cost:,.2f}/h, dearer than {self.top} "
                                  "cheaper deployments", "dearer")
                continue
            price = layout_cost(self.scenario, st.lay[0], int(st.lay[1]) * st.passed)
            ans = best[st.lay]
            deployments.append(Deployment(
                st.lay[0], st.lay[1], st.passed, price.num_gpus, st.lay[2], True, ans.mean_rate, None, None,
                None, None, None, price.usd_per_hour, math.nan, math.nan, price.source,
                ans.binding, ans.binding_detail, mean_figures(st.records[st.passed])))
        chosen = sorted(deployments, key=lambda d: (d.usd_per_hour, d.num_gpus, d.gpu))[:self.top]
        if chosen and self.headroom:
            labels = [(d.gpu, d.layout, d.policy, d.num_replicas) for d in chosen]
            at_target = {(st.lay, st.passed): st.records[st.passed] for st in states if st.pinned}
            seed_index = {seed: i for i, seed in enumerate(self.seeds)}
            answers, rows = capacity_search(
                self.executor, self.scenario, labels, self.seeds, self.resolution, self.tick, start=self.target,
                num_requests=lambda label: self.requests(label[3]), trace_rate=self.trace_rate,
                overrides_of=lambda label: self.hardware(label, label[3]), policy_of=lambda label: label[2],
                key="layout", growth_of=lambda label: max(1.25, label[3] / (label[3] - 1)) if label[3] > 1 else 2.0,
                known=lambda label, seed: [(self.target, at_target[(label[:3], label[3])][seed_index[seed]])],
                floor=lambda label: self.target,  # every seed and the long run passed there in step 3
                check_scale=check_scale(self.scenario), fast=self.fast)
            for d, ans in zip(chosen, answers):
                _take(d, ans, self.target)
            for row in rows:
                gpu, tp, policy, n = row["layout"]
                phase = row["phase"]
                row.update(layout=f"{gpu} TP{tp}", policy=policy, num_replicas=n,
                           phase="deployment_search" if phase == "search" else f"deployment_{phase}")
            self.points += rows
        return deployments


def _take(d: Deployment, ans: PolicyCapacity, target: float) -> None:
    d.safe_rate, d.mean_rate, d.ci_low, d.ci_high = ans.safe_rate, ans.mean_rate, ans.ci_low, ans.ci_high
    d.headroom = ans.safe_rate / target - 1.0
    if ans.binding is not None:
        d.binding, d.binding_detail = ans.binding, ans.binding_detail
