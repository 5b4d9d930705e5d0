"""`kvsim plan --target-rate R` for disaggregated serving: how many prefill and decode instances,
on which GPU at which tensor parallelism each, meet the SLO at R for the least money, beside the
cheapest aggregated deployment of the same GPUs (kvsim/planning/deploy.py).

1. Pool layouts: every candidate policy (`policies`, default every policy the scenario serves
   disaggregated, else its paged ones; only those `vllm serve` can run) × every candidate (GPU, TP)
   for the prefill pool × every one for the decode pool whose decode TP is a multiple of the prefill
   TP (vLLM v0.11.0's NixlConnector) and whose pools fit (kvsim.perf.disaggregation); the rest are
   listed with the reason. Candidates default to the scenario's own pools' GPUs and TP degrees
   (`gpus`, `tensor_parallel` widen them). No layout left: bad input, one line.
2. Counts: a layout's (P, D) passes at R when every seed and a run `LONG_RUN` times longer are
   sustainable there, under the aggregated search's rule (kvsim/planning/deploy.py): every step
   STEP_COST_MARGIN dearer than priced (kvsim/planning/sensitivity.py) and every point as long
   whatever the counts (REQUEST_SCALE_CAP × the per-point requests), so a tie stays a tie. More instances of either pool never lower what a deployment sustains, so the
   passing counts form a staircase, and the cheapest passing (P, D) lies on its corners
   (`Staircase`): B doubles until (B, B) passes, then a walk from P = 1 steps down in D while the
   point passes and right in P while it fails, simulating only points cheaper than the best found
   and stopping once (P, 1) is no cheaper: the cheapest of the grid up to `max_replicas` per pool,
   as brute force over it finds (tests/test_disagg_plan.py).
3. Each layout's cheapest (P, D), priced ($/hour: GPU price x TP x instances, both pools; $/M input
   and output tokens at R, each charging the whole hour), with each pool's binding constraint at R
   (what held its admission back, else its step time) and whether one instance fewer of it fails.
   Beside them, the aggregated search (kvsim/planning/deploy.py) over the same GPUs and TP degrees
   with every candidate policy served aggregated, so the comparison is of serving, not of KV settings
   (fp8 KV on one side only would make either look cheaper); an aggregated row names the policy it
   ran, "served aggregated" when the scenario serves that one disaggregated. `PDPlan.table()` is the
   comparison as records (the terminal's table and the dashboard's), with TTFT, TPOT and ITL at the
   SLO's percentile.

Rounds simulate every layout's next point at once, so the answer does not depend on the executor.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import product
from typing import Callable, Iterable, Optional

from kvsim.errors import KvsimError, check_int
from kvsim.planning.capacity import Frames, Ticker, check_search_args, default_requests, mean_figures, point_row
from kvsim.planning.deploy import (REQUEST_SCALE_CAP, DeployResult, check_target_rate, deploy, layout_basis,
                                   rate_based, tokens_per_request)
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.points import at_load, base_rate, point_record, replications, run_length
from kvsim.planning.safe import LONG_RUN
from kvsim.planning.sensitivity import check_scale, with_step_scale
from kvsim.results.verdict import LABELS, percentile_label
from kvsim.scenario import limits
from kvsim.scenario.catalog import GPUS, gpu_price, model_spec
from kvsim.scenario.disaggregation import ROLES, pool_view
from kvsim.scenario.layout import layout_cost, serve_problem

MAX_INSTANCES = 64  # per pool


def aggregated(scenario):
    """The scenario with every policy served aggregated on [hardware] (no pools)."""
    policies = [p.model_copy(update={"disaggregated": None}) for p in scenario.policies]
    return scenario.model_copy(update={"disaggregation": None, "policies": policies}).located(
        scenario.source, scenario.base_dir)


def pools_section(scenario) -> dict:
    """The scenario's [disaggregation] section as a dict (its defaults when it has none)."""
    from kvsim.scenario.config import DisaggregationConfig

    return (scenario.disaggregation or DisaggregationConfig()).model_dump()


def evaluate_pd(scenario, policy: str, rate: float, seed: int, num_requests: int, trace_rate, overrides) -> dict:
    """One disaggregated point: its flat record (kvsim.results.verdict.FIGURES) and each pool's binding."""
    from kvsim.pipeline import run_scenario

    sc = at_load(scenario, rate, seed, num_requests, [policy], trace_rate, overrides)
    summary = run_scenario(sc, write=False).summaries[policy]
    record, d = point_record(summary), summary["disaggregation"]
    for role in ROLES:
        record[f"{role}_binding"] = d["pools"][role]["binding"]
    record["link_busy_fraction"] = d["transfers"]["link_busy_fraction"]
    return record


@dataclass(slots=True)
class Staircase:
    """The cheapest passing (P, D) of one layout pair (module docstring, step 2). `results[(P, D)]` is
    True when the point passed; `next()` names the point to decide next, None when done.

    Growing: (B, B) for B = 1, 2, 4... (capped at `max_count`) until one passes: the first answer.
    Walking: from P = 1 and the largest D cheaper than the best so far, one step down in D when the
    point passes, one to the right in P when it fails: the corners of the passing region. A point no
    cheaper than the best (on equal cost: fewer GPUs, then fewer prefill instances) is stepped past
    as if it passed without being simulated (if it fails, every point to its right is dearer still),
    and the walk ends once (P, 1) is no cheaper."""

    cost_p: float  # $/hour of one prefill instance
    cost_d: float
    max_count: int
    bound: int = 1
    growing: bool = True
    p: int = 1
    d: int = 0
    results: dict = field(default_factory=dict)

    def cost(self, point: tuple[int, int]) -> float:
        return point[0] * self.cost_p + point[1] * self.cost_d

    def key(self, point: tuple[int, int]) -> tuple:
        return round(self.cost(point), 9), point[0] + point[1], point

    @property
    def best(self) -> Optional[tuple[int, int]]:
        return min((pt for pt, ok in self.results.items() if ok), key=self.key, default=None)

    def next(self) -> Optional[tuple[int, int]]:
        if self.growing:
            return (self.bound, self.bound) if (self.bound, self.bound) not in self.results else None
        best = self.key(self.best)
        while self.p <= self.max_count and self.d >= 1 and self.key((self.p, 1)) < best:
            known = self.results.get((self.p, self.d))
            if known is None and self.key((self.p, self.d)) < best:
                return self.p, self.d
            self._walk(True if known is None else known)
        return None

    def record(self, point: tuple[int, int], passed: bool) -> None:
        self.results[point] = passed
        if not self.growing:
            self._walk(passed)
        elif passed:
            self.growing, self.p, self.d = False, 1, self.max_count
        elif self.bound < self.max_count:
            self.bound = min(2 * self.bound, self.max_count)

    def _walk(self, passed: bool) -> None:
        if passed:
            self.d -= 1
        else:
            self.p += 1


@dataclass(slots=True)
class PDDeployment:
    """One pool layout at its cheapest passing prefill and decode instance counts."""

    prefill_gpu: str
    prefill_tp: int
    num_prefill: int
    decode_gpu: str
    decode_tp: int
    num_decode: int
    policy: str
    num_gpus: int
    usd_per_hour: float
    usd_per_m_input: float
    usd_per_m_output: float
    price_source: str
    prefill_binding: Optional[str]  # at the target, what binds the prefill pool (kvsim.results.disaggregation)
    decode_binding: Optional[str]
    prefill_tight: bool  # one prefill instance fewer fails at the target
    decode_tight: bool
    link_busy_fraction: Optional[float]
    at_target: dict = field(default_factory=dict)
    pricing: str = ""  # "measured" or "estimated": the pools' step prices (kvsim.perf.basis), estimated if either is
    pricing_why: str = ""

    @property
    def label(self) -> str:
        return (f"{self.num_prefill}P {self.prefill_gpu} TP{self.prefill_tp} : "
                f"{self.num_decode}D {self.decode_gpu} TP{self.decode_tp}")

    def answer(self) -> str:
        return (f"{self.num_prefill} prefill × {self.prefill_gpu} TP {self.prefill_tp} + {self.num_decode} decode × "
                f"{self.decode_gpu} TP {self.decode_tp} ({self.num_gpus} GPUs), ${self.usd_per_hour:,.2f}/h")

    def row(self) -> dict:
        out = {"kind": "disaggregated", "label": self.label,
               **{k: v for k, v in asdict(self).items() if k != "at_target"}}
        out.update({f"at_target_{k}": v for k, v in self.at_target.items()})
        return out


@dataclass(slots=True)
class PDPlan(Frames):
    """`kvsim.deploy(..., disaggregated=True)`'s answer: each pool layout's cheapest counts (cheapest
    first) beside the aggregated search's answer."""

    target_rate: float
    meta: dict
    deployments: list[PDDeployment]
    aggregated: DeployResult
    skipped: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)

    @property
    def best(self) -> Optional[PDDeployment]:
        return self.deployments[0] if self.deployments else None

    def rows(self) -> list[dict]:
        agg = [{"kind": "aggregated", "label": d.label, **d.row()} for d in self.aggregated.deployments[:1]]
        return [d.row() for d in self.deployments] + agg

    def table(self) -> list[dict]:
        """The comparison as the terminal and the dashboard show it: a record per row (the best
        disaggregated layouts, cheapest first, then the cheapest aggregated deployment), its keys the
        column headers in order, latencies at the SLO's percentile at the target (the seeds' mean,
        with every step STEP_COST_MARGIN dearer, as checked)."""
        slo = self.meta["slo"]
        q = percentile_label(slo.get("percentile", 99.0))
        shown = ["ttft_ms", "tpot_ms", "itl_ms"] + (["e2e_ms"] if slo.get("e2e_ms") is not None else [])
        out = []
        for d in self.deployments:
            out.append({"serving": "disaggregated", "policy": d.policy,
                        "prefill": f"{d.num_prefill} × {d.prefill_gpu} TP {d.prefill_tp}",
                        "decode": f"{d.num_decode} × {d.decode_gpu} TP {d.decode_tp}",
                        **_common(d, shown, q),
                        "prefill binds": (d.prefill_binding or "–") + (" (one fewer fails)" if d.prefill_tight else ""),
                        "decode binds": (d.decode_binding or "–") + (" (one fewer fails)" if d.decode_tight else ""),
                        "priced": d.pricing or "–"})
        for a in self.aggregated.deployments[:1]:
            out.append({"serving": "aggregated", "policy": self.aggregated_label(a.policy),
                        "prefill": f"{a.num_replicas} × {a.gpu} {a.layout_name} (both phases)", "decode": "",
                        **_common(a, shown, q), "prefill binds": a.binding or "–", "decode binds": "",
                        "priced": a.pricing or "–"})
        return out

    def estimated_note(self) -> str:
        """A warning when the answer's layout (the cheaper of the best of each kind) rests on estimated step
        prices, else ''."""
        best, agg = self.best, self.aggregated.deployments[0] if self.aggregated.deployments else None
        chosen = agg if best is None or (agg is not None and agg.usd_per_hour <= best.usd_per_hour) else best
        if chosen is None or chosen.pricing != "estimated":
            return ""
        return f"ESTIMATED: the answer rests on {chosen.pricing_why}; treat it as a lead to measure, not an answer"

    def aggregated_label(self, policy: str) -> str:
        """An aggregated row's policy: its name, and "served aggregated" when the scenario serves it disaggregated."""
        return policy + (", served aggregated" if policy in self.meta.get("served_disaggregated", ()) else "")

    def verdict(self) -> str:
        """Aggregated or disaggregated at the target, and by how much."""
        best, agg = self.best, self.aggregated.deployments[0] if self.aggregated.deployments else None
        if best is None and agg is None:
            return "neither a disaggregated nor an aggregated layout meets the SLO at the target rate"
        if best is not None and agg is not None and math.isclose(agg.usd_per_hour, best.usd_per_hour):
            return (f"a tie at ${agg.usd_per_hour:,.2f}/h: aggregated {agg.answer(self.aggregated_label(agg.policy))}, or disaggregated "
                    f"{best.num_prefill}:{best.num_decode}: {best.answer()} (compare their latencies)")
        if best is None or (agg is not None and agg.usd_per_hour <= best.usd_per_hour):
            cheaper = "" if best is None else f", {1 - agg.usd_per_hour / best.usd_per_hour:.0%} cheaper than {best.answer()}"
            return f"aggregated: {agg.answer(self.aggregated_label(agg.policy))}{cheaper}"
        other = "" if agg is None else f", {1 - best.usd_per_hour / agg.usd_per_hour:.0%} cheaper than aggregated {agg.answer(self.aggregated_label(agg.policy))}"
        return f"disaggregated, {best.num_prefill}:{best.num_decode}: {best.answer()}{other}"

    def to_dict(self) -> dict:
        return {"target_rate": self.target_rate, "meta": self.meta, "verdict": self.verdict(),
                "deployments": [{**asdict(d), "label": d.label} for d in self.deployments],
                "aggregated": {k: v for k, v in self.aggregated.to_dict().items() if k != "points"},
                "skipped": self.skipped, "points": self.points + self.aggregated.points}


def _common(d, shown: list[str], q: str) -> dict:
    """The columns a disaggregated and an aggregated row share: GPUs, prices, latencies at the target."""
    return {"GPUs": d.num_gpus, "$/hour": d.usd_per_hour, "$/M in": d.usd_per_m_input, "$/M out": d.usd_per_m_output,
            **{f"{LABELS[k]} {q} ms": d.at_target.get(f"{k}_at_pct") for k in shown}}


def pool_layouts(scenario, policy: str, gpus, tps) -> tuple[list[tuple], list[dict]]:
    """(feasible (prefill gpu, tp, decode gpu, tp) layouts, skipped ones with the reason)."""
    from kvsim.perf.disaggregation import pool

    fits, skipped = {}, []
    for role, gpu, tp in product(ROLES, gpus, tps):  # the rate does not matter: 1 req/s, a trace as it is
        trial = at_load(scenario, 1.0, policies=[policy], trace_rate=1.0, overrides=_pools(scenario, {role: (gpu, tp, 1)}))
        kind = "no_price"
        try:
            if gpu_price(scenario, gpu) is None:
                raise KvsimError(f"{gpu}: no price (set cost.gpu_hour_usd)")
            kind = "does_not_fit"
            pool(trial, trial.policies[0], role)
            fits[(role, gpu, tp)] = True
        except KvsimError as exc:
            skipped.append({"pool": role, "gpu": gpu, "tensor_parallel_size": tp, "policy": policy,
                            "reason": str(exc).split(": ", 1)[-1], "kind": kind})
    ok = [(gp, tp_p, gd, tp_d) for gp, tp_p, gd, tp_d in product(gpus, tps, gpus, tps)
          if fits.get(("prefill", gp, tp_p)) and fits.get(("decode", gd, tp_d)) and tp_d % tp_p == 0]
    return ok, skipped


def _pools(scenario, layout: dict) -> dict:
    """Overrides setting each named pool's (gpu, tp, instances), the rest of the section as the scenario's."""
    section = pools_section(scenario)
    for role, (gpu, tp, count) in layout.items():
        section[role].update(gpu=gpu, tensor_parallel_size=tp, num_replicas=count)
    return {"disaggregation": section, "policies": {"disaggregated": True}}


def pd_deploy(scenario, target_rate: float, *, gpus: Optional[list[str]] = None,
              tensor_parallel: Optional[Iterable[int]] = None, policy=None, seeds: int = 3,
              resolution: float = 0.02, num_requests: Optional[int] = None, max_replicas: int = MAX_INSTANCES,
              workers: Optional[int] = None, ray: Optional[str] = None, executor=None,
              progress: Optional[Callable[[int, int], None]] = None, exhaustive: bool = False) -> PDPlan:
    """The cheapest prefill:decode counts per pool layout and policy meeting the SLO at `target_rate`,
    and the cheapest aggregated deployment of the same GPUs and TP degrees (module docstring);
    `policy`: a name or a list of the candidates (default: every policy served disaggregated)."""
    from kvsim.pipeline import chosen_policies

    check_target_rate(target_rate)
    check_search_args(seeds, resolution, num_requests)
    check_int(max_replicas, "--max-replicas", 1, limits.MAX_REPLICAS)
    names, agg_names, skipped = _policies(scenario, [policy] if isinstance(policy, str) else policy, chosen_policies)
    closed = scenario.workload.arrival.process == "immediate"
    scenario = rate_based(scenario)  # a closed loop as its open loop at the rate (deploy's rule)
    gpus, tps = _candidates(scenario, gpus, tensor_parallel)
    n_req = num_requests or default_requests(scenario)
    trace_rate = base_rate(scenario, n_req) if scenario.workload.arrival.process == "trace" else None
    kept, why = replications(scenario, n_req * REQUEST_SCALE_CAP, seeds)  # a replayed trace: its windows
    seed_list = [scenario.workload.seed + i for i in range(kept)]
    ok = []
    for name in names:
        fit, left_out = pool_layouts(scenario, name, gpus, tps)
        ok += [(*lay, name) for lay in fit]
        skipped += left_out
    if not ok:
        raise KvsimError(f"--gpu {' '.join(gpus)} --tp {' '.join(map(str, tps))}: no prefill and decode pools can "
                         "serve the model, nothing to simulate: "
                         + "; ".join(dict.fromkeys(f"{s['pool']} {s['gpu']} TP {s['tensor_parallel_size']}: "
                                                   f"{s['reason']}" for s in skipped if s.get("pool"))))
    own = executor is None
    executor = executor or make_executor(workers, ray)
    tick = Ticker(progress, len(ok) * 4 * (seeds + 1))
    try:
        search = _PDSearch(executor, scenario, target_rate, seed_list, n_req, trace_rate, max_replicas, tick)
        found = search.run(ok)
        agg = deploy(aggregated(scenario), target_rate, gpus=gpus, tensor_parallel=tps, policy=agg_names, seeds=seeds,
                     resolution=resolution, num_requests=num_requests, top=1, max_replicas=max_replicas,
                     executor=executor, progress=lambda done, total: tick(), headroom=False, exhaustive=exhaustive)
    finally:
        if own:
            executor.close()
    prompt, output = tokens_per_request(at_load(scenario, target_rate, num_requests=n_req, trace_rate=trace_rate), n_req)
    for d in found:
        d.pricing, d.pricing_why = _pools_basis(scenario, d)
        d.usd_per_m_input = d.usd_per_hour / (target_rate * 3600 * prompt) * 1e6 if prompt else math.inf
        d.usd_per_m_output = d.usd_per_hour / (target_rate * 3600 * output) * 1e6 if output else math.inf
    found.sort(key=lambda d: (d.usd_per_hour, d.num_gpus, d.label, names.index(d.policy)))
    meta = {"model": model_spec(scenario).name, "policies": names, "aggregated_policies": agg_names,
            "served_disaggregated": [p.name for p in scenario.policies if scenario.disaggregated(p)],
            "safe_check_step_time_scale": check_scale(scenario), "slo": scenario.slo.model_dump(), "seeds": seed_list,
            "num_requests": n_req * REQUEST_SCALE_CAP,
            "long_run_requests": run_length(scenario, LONG_RUN * REQUEST_SCALE_CAP * n_req),
            "gpus": gpus, "tensor_parallel": tps,
            "mean_prompt_tokens": prompt, "mean_output_tokens": output, "link": pools_section(scenario)["link"],
            "kv_transfer": pools_section(scenario)["kv_transfer"], "from_closed_loop": closed, "seeds_asked": seeds,
            "replications_note": why}
    return PDPlan(target_rate, meta, found, agg, skipped + search.skipped, search.points)


def _pools_basis(scenario, d: PDDeployment) -> tuple[str, str]:
    """The deployment's label and why: its pools' (deploy's layout_basis each), estimated if either is."""
    from kvsim.perf.basis import PricingBasis
    from kvsim.perf.disaggregation import combined_basis

    basis = combined_basis({f"{role} pool": PricingBasis("", *layout_basis(scenario, gpu, tp))
                            for role, gpu, tp in (("prefill", d.prefill_gpu, d.prefill_tp),
                                                  ("decode", d.decode_gpu, d.decode_tp))})
    return basis.label, basis.why


def _policies(scenario, names, chosen) -> tuple[list[str], list[str], list[dict]]:
    """(the policies searched disaggregated, those searched aggregated, the ones left out): the named
    ones for both, else every policy the scenario serves disaggregated (else its paged ones) and every
    policy served aggregated (the scenario's aggregated ones and those, like for like); only what
    `vllm serve` can run, the rest left out with the reason."""
    if names is not None:
        pd = agg = chosen(scenario, names)
    else:
        pd = [p for p in scenario.policies if scenario.disaggregated(p)] or \
            [p for p in scenario.policies if p.allocator == "paged"]
        agg = list(scenario.policies)
    skipped = [{"gpu": "*", "tensor_parallel_size": "*", "policy": p.name, "reason": serve_problem(p), "kind": "not_vllm"}
               for p in dict.fromkeys(pd + agg) if serve_problem(p)]
    pd = [p.name for p in pd if not serve_problem(p)]
    if not pd:
        raise KvsimError(("--policy" if names is not None else f"{scenario.source}: policies") + ": disaggregated "
                         "serving needs a policy vllm serve runs with its NixlConnector (paged allocator, a vLLM "
                         "--kv-cache-dtype): " + ("; ".join(f"{s['policy']}: {s['reason']}" for s in skipped)
                                                 or "none given"))
    return pd, [p.name for p in agg if not serve_problem(p)] or pd, skipped


def _candidates(scenario, gpus, tensor_parallel) -> tuple[list[str], list[int]]:
    """Candidate GPUs and TP degrees: the given ones, else the scenario's pools' own."""
    views = [pool_view(scenario, scenario.policies[0], role)[0].hardware for role in ROLES] \
        if scenario.disaggregation is not None else [scenario.hardware]
    known = {g.lower(): g for g in GPUS}
    unknown = [g for g in (gpus or []) if g.lower() not in known]
    if unknown:
        raise KvsimError(f"--gpu: unknown GPU {', '.join(unknown)} (presets: {', '.join(GPUS)})")
    gpus = [known[g.lower()] for g in gpus] if gpus else list(dict.fromkeys(known[v.gpu.lower()] for v in views))
    if tensor_parallel is None:
        tps = sorted({v.tensor_parallel_size for v in views})
    elif isinstance(tensor_parallel, (str, bytes)) or not isinstance(tensor_parallel, Iterable):
        raise KvsimError(f"--tp: expected a list of tensor-parallel degrees, got {tensor_parallel!r}")
    else:
        tps = sorted(set(tensor_parallel))
    for tp in tps:
        check_int(tp, "--tp", 1, limits.MAX_TENSOR_PARALLEL)
    return gpus, tps


class _PDSearch:
    """Step 2 over every layout at once, then step 3."""

    def __init__(self, executor, scenario, target, seeds, n_req, trace_rate, max_count, tick):
        self.executor, self.scenario, self.target, self.seeds = executor, scenario, target, seeds
        self.n_req, self.trace_rate, self.max_count, self.tick = n_req, trace_rate, max_count, tick
        self.points: list[dict] = []
        self.skipped: list[dict] = []
        self.records: dict = {}  # (layout, P, D) -> {"seeds": [...], "long": record}

    def overrides(self, lay: tuple, p: int, d: int) -> dict:
        return _pools(self.scenario, {"prefill": (lay[0], lay[1], p), "decode": (lay[2], lay[3], d)})

    def run(self, layouts: list[tuple]) -> list[PDDeployment]:
        """`layouts`: (prefill gpu, tp, decode gpu, tp, policy) each."""
        stairs = {lay: Staircase(*(layout_cost(self.scenario, g, tp).usd_per_hour for g, tp in (lay[:2], lay[2:4])),
                                 self.max_count) for lay in layouts}
        active = dict(stairs)
        while active:
            todo = {lay: st.next() for lay, st in active.items()}
            for lay in [lay for lay, pt in todo.items() if pt is None]:
                del active[lay]
            if todo := {lay: pt for lay, pt in todo.items() if pt is not None}:
                self.decide(todo, stairs)
        return [self.deployment(lay, st) for lay, st in stairs.items() if self._found(lay, st)]

    def _found(self, lay, st: Staircase) -> bool:
        if st.best is None:
            self.skipped.append({"pool": "both", "gpu": f"{lay[0]}/{lay[2]}", "tensor_parallel_size": f"{lay[1]}/{lay[3]}",
                                 "policy": lay[4], "kind": "max_replicas",
                                 "reason": f"fails with {st.bound} prefill and {st.bound} decode instances (--max-replicas)"})
        return st.best is not None

    def decide(self, todo: dict, stairs: dict) -> None:
        """Simulate each layout's point: its seeds, then (once they pass) its long run; record the verdict."""
        jobs = []
        for lay, (p, d) in todo.items():
            known = self.records.setdefault((lay, p, d), {})
            if "seeds" not in known:
                jobs += [(lay, p, d, seed, False) for seed in self.seeds]
            else:
                jobs.append((lay, p, d, self.seeds[0], True))
        recs = run_all(self.executor, evaluate_pd, [self.task(*job) for job in jobs], lambda i, r: self.tick())
        for (lay, p, d, seed, long), rec in zip(jobs, recs):
            known = self.records[(lay, p, d)]
            if long:
                known["long"] = rec
            else:
                known.setdefault("seeds", []).append(rec)
            self.points.append({**point_row(_label(lay), seed, self.target, "at_target_long" if long else "at_target",
                                            rec, "layout"), "num_prefill": p, "num_decode": d,
                                "policy": lay[4], "prefill_binding": rec["prefill_binding"],
                                "decode_binding": rec["decode_binding"]})
        for lay, (p, d) in todo.items():
            known = self.records[(lay, p, d)]
            seeds_ok = all(r["sustainable"] for r in known["seeds"])
            if not seeds_ok or "long" in known:
                stairs[lay].record((p, d), seeds_ok and known["long"]["sustainable"])

    def task(self, lay, p, d, seed, long) -> tuple:
        """One point at the target, as deploy's check runs it: as many requests whatever the counts, every
        step STEP_COST_MARGIN dearer than priced (module docstring, step 2)."""
        n = self.n_req * REQUEST_SCALE_CAP * (LONG_RUN if long else 1)
        return (self.scenario, lay[4], self.target, seed, n, self.trace_rate,
                with_step_scale(self.overrides(lay, p, d), check_scale(self.scenario)))

    def deployment(self, lay: tuple, st: Staircase) -> PDDeployment:
        p, d = st.best
        recs = self.records[(lay, p, d)]["seeds"]
        prefill, decode = layout_cost(self.scenario, lay[0], p * lay[1]), layout_cost(self.scenario, lay[2], d * lay[3])
        sources = dict.fromkeys((prefill.source, decode.source))
        link = [r["link_busy_fraction"] for r in recs if r["link_busy_fraction"] is not None]
        return PDDeployment(lay[0], lay[1], p, lay[2], lay[3], d, lay[4], prefill.num_gpus + decode.num_gpus,
                            prefill.usd_per_hour + decode.usd_per_hour,
                            math.nan, math.nan, "; ".join(sources), _most(recs, "prefill_binding"),
                            _most(recs, "decode_binding"), st.results.get((p - 1, d)) is False,
                            st.results.get((p, d - 1)) is False, sum(link) / len(link) if link else None,
                            mean_figures(recs))


def _label(lay: tuple) -> str:
    return f"{lay[0]} TP{lay[1]} / {lay[2]} TP{lay[3]}"  # the policy is a column of its own


def _most(records: list[dict], key: str) -> Optional[str]:
    return Counter(r[key] for r in records).most_common(1)[0][0] if records else None
