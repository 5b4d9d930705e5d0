"""`kvsim plan --autoscale`: an autoscaler's settings searched for the cheapest that meets an SLO
attainment target over the scenario's day, beside what a static pool and perfect scaling would cost.

1. Windows: the arrivals' span cut into `autoscaling.window_s` windows (requests counted exactly,
   by one pass over the workload).
2. The lower bound: per window, the fewest replicas that meet the target on that window's own
   requests (`workload.start_s` / `duration_s`: the same requests as the day's) starting empty, as
   instant, perfect scaling would have them: a fixed pool of n from the window's start, every
   request followed to its end. More replicas never serve a request later, so a window's answer is
   the first n that passes: the peak window is searched up from 1 (x2, then bisection), every other
   window from the peak's answer scaled by its requests, one step at a time down while passing and
   up while failing. Windows are independent tasks on the executor (processes or Ray). A window no
   count up to `max_replicas` serves is reported as such.
3. The static pool: the lower bound's largest count N (the fewest replicas that meet the target in
   every window: at the peak), simulated over the whole day as a fixed pool for its own attainment.
4. Candidates: `--grid autoscaling.KEY=v1,v2` axes (or a default grid of the autoscaler's main knob
   and min_replicas), each setting a whole day on the autoscaled pool. A day stops early once more
   requests missed than the target allows (the setting cannot pass; its figures are then partial).
5. The answer: the cheapest setting meeting the target (by $, then replica-hours).

Every task is a pure function of its arguments; results are keyed by task, so the answer is the same
bytes from one worker, many, or Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.sweep import grid_points
from kvsim.results.metrics import Metrics
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.overrides import apply_overrides

MAX_SETTINGS = 200
DEFAULT_KNOBS = {  # the autoscaler's main knob: multipliers of its own value, or values
    "hpa": ("hpa.target", (0.5, 1.0, 2.0, 4.0)),
    "keda": ("keda.threshold", (0.5, 1.0, 2.0, 4.0)),
    "wva": ("wva.queue_spare_trigger", (1.0, 2.0, 3.0, 4.0)),
    "slo_aware": ("slo_aware.scale_up_threshold", (0.4, 0.55, 0.7, 0.85)),
}


class Hopeless(Exception):
    """A day's simulation stopped: more requests missed the SLO than the target allows."""


# ---- tasks (pure: any worker gives the same record) -----------------------------------------------

def static_scenario(scenario, replicas: int):
    """The scenario on a fixed pool of `replicas` (its [autoscaling] windows, target and prices kept)."""
    data = scenario.model_dump()
    auto = data["autoscaling"]
    for key in ("hpa", "keda", "wva", "slo_aware", "behavior"):
        auto[key] = None
    auto.update(policy="fixed", fixed={"replicas": replicas}, min_replicas=1, initial_replicas=None,
                max_replicas=max(auto["max_replicas"], 1))
    return scenario_from_dict(data, scenario.source, scenario.base_dir)


def window_attainment(scenario, policy: str, start: float, end: float, replicas: int) -> tuple[float, int]:
    """(attainment, requests) of the window [start, end)'s requests on a fixed pool of `replicas`."""
    from kvsim.pipeline import run_scenario

    data = scenario.model_dump()
    data["autoscaling"] = None
    data["hardware"]["num_replicas"] = replicas
    data["workload"].update(start_s=start, duration_s=math.nextafter(end, -math.inf))
    data["policies"] = [p for p in data["policies"] if p["name"] == policy]
    data["output"]["report_html"] = False
    sc = scenario_from_dict(data, scenario.source, scenario.base_dir)
    summary = run_scenario(sc, write=False).summaries[policy]
    attainment = summary["slo_attainment"]
    return 1.0 if attainment is None else attainment, summary["requests"]["received"]


def day_record(scenario, policy: str, miss_budget: Optional[int]) -> dict:
    """The scenario's day on its autoscaled (or fixed) pool: summary.json's `autoscaling` figures, or
    {"stopped_early": True, ...} once more than `miss_budget` requests missed."""
    from kvsim.pipeline import chosen_policies, simulate_policy
    from kvsim.perf.basis import pricing_basis
    from kvsim.perf.measured import request_overhead_s
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.scenario.workload import timeseries_interval

    model, gpu = model_spec(scenario), gpu_spec(scenario)
    pol = chosen_policies(scenario, [policy])[0]
    basis = pricing_basis(scenario, model, gpu)
    metrics = BudgetMetrics(pol.name, scenario.slo, timeseries_interval(scenario),
                            request_overhead_s=request_overhead_s(scenario, basis, gpu), miss_budget=miss_budget)
    try:
        summary, _ = simulate_policy(scenario, pol, model, gpu, metrics, None, basis)
    except Hopeless:
        missed = metrics.num_finished - metrics.num_good + sum(metrics.rejected_by_reason.values())
        return {"stopped_early": True, "missed": missed, "finished": metrics.num_finished}
    auto = summary["autoscaling"]
    return {"stopped_early": False, **{k: v for k, v in auto.items() if k not in ("autoscaler", "startup")},
            "autoscaler": auto["autoscaler"], "startup": auto["startup"]}


class BudgetMetrics(Metrics):
    """Metrics that give up (`Hopeless`) once more than `miss_budget` requests missed the SLO."""

    def __init__(self, *args, miss_budget: Optional[int] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.miss_budget = math.inf if miss_budget is None else miss_budget
        self.num_rejected = 0

    def on_finish(self, seq) -> None:
        super().on_finish(seq)
        if self.num_finished - self.num_good + self.num_rejected > self.miss_budget:
            raise Hopeless()

    def on_reject(self, seq) -> None:
        super().on_reject(seq)
        self.num_rejected += 1
        if self.num_finished - self.num_good + self.num_rejected > self.miss_budget:
            raise Hopeless()


# ---- the search ------------------------------------------------------------------------------------

@dataclass(slots=True)
class WindowSearch:
    """The lower bound's search in one window: the first count that passes lies in (lo, hi]."""

    index: int
    start: float
    end: float
    requests: int
    guess: int = 1
    lo: int = 0  # largest count seen to fail
    hi: Optional[int] = None  # smallest count seen to pass
    tried: dict = field(default_factory=dict)  # count -> attainment

    def next_count(self, most: int, doubling: bool) -> Optional[int]:
        if self.requests == 0:
            return None
        if self.hi is not None and self.hi == self.lo + 1:
            return None
        if self.lo >= most:
            return None  # even the most replicas fail
        if self.hi is None:
            if not self.tried:
                return min(max(self.guess, 1), most)
            return min(most, self.lo * 2 if doubling else self.lo + 1)
        if doubling:
            return (self.lo + self.hi) // 2
        return self.hi - 1

    def done(self, n: int, attainment: float, target: float) -> None:
        self.tried[n] = attainment
        if attainment >= target:
            self.hi = n if self.hi is None else min(self.hi, n)
        else:
            self.lo = max(self.lo, n)

    @property
    def replicas(self) -> Optional[int]:
        """The fewest replicas that meet the target (0: no request; None: none up to the most)."""
        return 0 if self.requests == 0 else self.hi


def window_counts(scenario, window_s: float) -> tuple[np.ndarray, float, float]:
    """Requests arriving in each window from the workload's start (workload.start_s), and the
    arrivals' start and end (one pass over the workload)."""
    from kvsim.scenario.workload import arrival_window, generate_requests

    start = scenario.workload.start_s or 0.0
    times = np.fromiter((r.arrival_time for r in generate_requests(scenario)), dtype=np.float64)
    end = max(arrival_window(scenario), float(times[-1]) if len(times) else 0.0)
    n = max(1, math.ceil((end - start) / window_s - 1e-9))
    idx = np.clip(((times - start) // window_s).astype(np.int64), 0, n - 1)
    return np.bincount(idx, minlength=n), start, end


def lower_bound(executor, scenario, policy: str, counts: np.ndarray, window_s: float, start: float, end: float,
                target: float, most: int, tick: Callable[[], None]) -> list[WindowSearch]:
    """Every window's fewest passing replica count (module docstring, step 2)."""
    searches = [WindowSearch(i, start + i * window_s, end if i == len(counts) - 1 else start + (i + 1) * window_s,
                             int(c)) for i, c in enumerate(counts)]
    peak = max(searches, key=lambda s: (s.requests, -s.index))
    _search(executor, scenario, policy, [peak], target, most, tick, doubling=True)
    base = peak.replicas or most
    for s in searches:
        if s is not peak:
            s.guess = max(1, math.ceil(base * s.requests / max(peak.requests, 1)))
    _search(executor, scenario, policy, [s for s in searches if s is not peak], target, most, tick, doubling=False)
    return searches


def _search(executor, scenario, policy, searches, target, most, tick, doubling: bool) -> None:
    while True:
        todo = [(s, s.next_count(most, doubling)) for s in searches]
        todo = [(s, n) for s, n in todo if n is not None]
        if not todo:
            return
        results = run_all(executor, window_attainment, [(scenario, policy, s.start, s.end, n) for s, n in todo],
                          lambda i, r: tick())
        for (s, n), (attainment, _) in zip(todo, results):
            s.done(n, attainment, target)


def candidate_points(scenario, grid: list[str]) -> tuple[list[str], list[list[str]]]:
    """The settings searched: `--grid` axes (autoscaling.* keys), else the default grid."""
    auto = scenario.autoscaling
    if grid:
        keys, points = grid_points(grid)
        bad = [k for k in keys if not k.startswith("autoscaling.")]
        if bad:
            raise KvsimError(f"--grid {bad[0]}: plan --autoscale searches autoscaling.* keys")
    else:
        if auto.policy not in DEFAULT_KNOBS:
            raise KvsimError(f"autoscaling.policy: a {auto.policy!r} pool has no setting to search; give --grid")
        key, values = DEFAULT_KNOBS[auto.policy]
        section, name = key.split(".")
        own = getattr(getattr(auto, section) or _defaults(auto.policy), name)
        scaled = values if auto.policy in ("wva", "slo_aware") else [own * v for v in values]
        mins = sorted({max(1, auto.min_replicas), max(1, auto.min_replicas) + 1})
        keys, points = grid_points([f"autoscaling.{key}=" + ",".join(f"{v:g}" for v in scaled),
                                    "autoscaling.min_replicas=" + ",".join(str(m) for m in mins)])
    if len(points) > MAX_SETTINGS:
        raise KvsimError(f"--grid: {len(points):,} settings, more than {MAX_SETTINGS}: narrow the grid")
    return keys, points


def _defaults(policy: str):
    from kvsim.scenario.autoscaling import SloAwareConfig, WvaConfig

    return {"wva": WvaConfig(), "slo_aware": SloAwareConfig()}[policy]


def point_scenario(scenario, point: list[str], max_replicas: int):
    """The scenario with one setting's overrides (validated: a bad value is one line naming its key)."""
    data = apply_overrides(scenario.model_dump(), point)
    auto = data["autoscaling"]
    if not any(p.startswith("autoscaling.max_replicas=") for p in point):
        auto["max_replicas"] = max(auto["max_replicas"], max_replicas)
    if auto["policy"] == "slo_aware" and any(p.startswith("autoscaling.slo_aware.scale_up_threshold=") for p in point):
        s = auto.get("slo_aware") or {}
        if not any(p.startswith("autoscaling.slo_aware.scale_down_boundary=") for p in point):
            s["scale_down_boundary"] = min(s.get("scale_down_boundary") or 0.40, s["scale_up_threshold"])
        auto["slo_aware"] = s
    return scenario_from_dict(data, scenario.source, scenario.base_dir)


@dataclass(slots=True)
class AutoscalePlan:
    policy: str
    target: float
    window_s: float
    requests: int
    keys: list
    candidates: list  # one dict per setting
    windows: list  # one dict per window (lower bound)
    static: dict  # the static pool at the peak
    lower: dict  # the lower bound's totals
    best: Optional[int]  # index into candidates
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def plan_autoscale(scenario, policy: Optional[str] = None, grid: Optional[list[str]] = None,
                   attainment: Optional[float] = None, workers: Optional[int] = None, ray: Optional[str] = None,
                   progress: Optional[Callable[[int, int], None]] = None) -> AutoscalePlan:
    """The cheapest autoscaler setting meeting the attainment target, beside the static pool at the
    peak and the lower bound (module docstring)."""
    from kvsim.autoscaled import attainment_target
    from kvsim.pipeline import chosen_policies
    from kvsim.planning.points import check_fits

    if scenario.autoscaling is None:
        raise KvsimError(f"{scenario.source}: plan --autoscale needs an [autoscaling] section")
    pol = chosen_policies(scenario, [policy] if policy else None)[0].name
    check_fits(scenario, [pol])
    target = attainment if attainment is not None else attainment_target(scenario)
    auto = scenario.autoscaling
    keys, points = candidate_points(scenario, grid or [])
    for p in points:  # every setting validated before anything runs
        point_scenario(scenario, p, auto.max_replicas)
    counts, start, span = window_counts(scenario, auto.window_s)
    total = int(counts.sum())
    most = max(auto.max_replicas, 1) * 2
    done, planned = [0], len(points) + 1 + 3 * len(counts)
    tick = (lambda: (done.__setitem__(0, done[0] + 1), progress(done[0], max(planned, done[0])))) if progress \
        else (lambda: None)
    executor = make_executor(workers, ray)
    try:
        windows = lower_bound(executor, scenario, pol, counts, auto.window_s, start, span, target, most, tick)
        static_n = max((w.replicas or most for w in windows), default=1) or 1
        budget = math.floor((1 - target) * total + 1e-9)
        tasks = [(point_scenario(scenario, p, static_n), pol, budget) for p in points]
        fixed = static_scenario(scenario, static_n)
        records = run_all(executor, day_record, tasks + [(fixed, pol, None)], lambda i, r: tick())
    finally:
        close = getattr(executor, "close", None)
        if close:
            close()
    return _answer(pol, target, auto.window_s, total, keys, points, records, windows, static_n, span - start, scenario)


def _answer(pol, target, window_s, total, keys, points, records, windows, static_n, span, scenario) -> AutoscalePlan:
    from kvsim.results.fleet import cost_figures
    from kvsim.scenario.catalog import gpu_price

    static_day = records[-1]
    candidates = []
    for point, rec in zip(points, records[:-1]):
        settings = {p.partition("=")[0]: p.partition("=")[2] for p in point}
        meets = not rec["stopped_early"] and rec["attainment"] is not None and rec["attainment"] >= target
        candidates.append({"settings": settings, "meets_target": meets, **rec})
    passing = [i for i, c in enumerate(candidates) if c["meets_target"]]
    best = min(passing, key=lambda i: (candidates[i]["usd"] or 0.0, candidates[i]["replica_hours"], i)) if passing else None
    price = gpu_price(scenario, scenario.hardware.gpu)
    tp = scenario.hardware.tensor_parallel_size
    lb_hours = sum((w.replicas or 0) * (w.end - w.start) for w in windows) / 3600.0
    lower = {"replica_hours": lb_hours, **{k: v for k, v in cost_figures(lb_hours, tp, price, 0, 0).items()
                                           if k in ("gpu_hours", "usd")},
             "complete": all(w.replicas is not None for w in windows)}
    static = {"replicas": static_n, **{k: static_day.get(k) for k in
                                       ("attainment", "replica_hours", "gpu_hours", "usd", "usd_per_m_tokens")}}
    wins = [{"start_s": w.start, "end_s": w.end, "requests": w.requests, "replicas": w.replicas,
             "tried": {str(k): v for k, v in sorted(w.tried.items())}} for w in windows]
    return AutoscalePlan(pol, target, window_s, total, keys, candidates, wins, static, lower, best,
                         meta={"span_s": span, "scenario": scenario.name})
