"""`kvsim plan`: each policy's safe arrival rate under the scenario's SLO (a closed loop: its safe
concurrency, the most clients; kvsim/planning/points.py `load_unit`).

Per policy and seed a `Search` (kvsim/planning/search.py) brackets and bisects the rate; a rate is
*sustainable* when the SLO is met at its percentile and the engine is stable
(kvsim/results/verdict.py). Seeds are independent replications of the workload, so the seeds'
knees k_1..k_n describe the knee: `mean_rate` is their mean and the interval is
mean ± t(0.975, n-1) · s / sqrt(n), widened by the search resolution (± res · mean). The knee is a
cliff, so the headline is the *safe rate* (kvsim/planning/safe.py): the highest rate at which every
seed and a run four times longer were each simulated and found sustainable. The SLO figures are
given at the safe rate (the mean over the seeds, and the worst of the seeds and the long run), and
the binding constraint at the knee is the one named most often by the seeds' first unsustainable
rate. Headroom is safe_rate / r0 - 1 for the scenario's own rate r0. When nothing held admission
back there (the engine's step time binds), the first seed's first unsustainable rate is simulated
once more as it is, once with twice the GPU's FLOP/s and once with twice its HBM bandwidth: the one
that helps the SLO more names the bound, `compute` or `bandwidth`, and the detail gives all three
margins.

The step price itself may be off (kvsim/planning/sensitivity.py): the safe rate is checked with
every step 5% slower than priced, and the interval is widened by how far the first seed's knee
moves when every step costs 5% less or more (`knee_faster_steps`, `knee_slower_steps`).

Two policies *tie* when their 95% intervals overlap: the data cannot tell them apart, and `ties`
says so rather than naming a winner. Within a group of ties the first (`best`) is the one that gives
the user most: the highest safe rate, or for a closed loop (tied concurrencies are a tie of whole
clients) the most requests/s completed at its safe concurrency.

Requests per point: the scenario's own count, capped at `DEFAULT_REQUESTS` (3000). A short
window hides overload (the first requests find an empty engine, and a queue needs time to grow
before the TTFT tail or the backlog shows it), so a knee found on N requests is high by roughly
c / N: on chat.toml, against 6000 requests, 1000 put it 9-17% high, 2000 2-6%, 3000 2-4%, 4000
1-2% (benchmarks/results/plan_speed.md). 3000 keeps the chat plan near 17 CPU-seconds; `--requests`
trades time for that bias, and the safe rate's long run checks it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Callable, Optional

import numpy as np

from kvsim.errors import check_int
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.points import (CLIENTS, FIGURES, REQ_RATE, base_rate, check_fits, evaluate_point, is_stopped,
                                   load_unit, mean_or_none, replications, run_length, windowed)
from kvsim.results.verdict import OPTIONAL_FIGURES
from kvsim.planning.safe import LONG_RUN, SafeCheck, first_candidate, safe_rates, safe_rates_guided
from kvsim.planning.search import Guided, Search, expected_points, run_guided, run_searches
from kvsim.planning.sensitivity import KNEE_GROWTH, STEP_COST_MARGIN, check_scale, scalable, widen, with_step_scale
from kvsim.results.intervals import rate_interval
from kvsim.scenario.workload import expected_count

DEFAULT_REQUESTS = 3000
# t(0.975, df) for df = 1..10; larger df: the normal quantile plus a small correction.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def interval(knees: list[float], resolution: float) -> tuple[float, float, float]:
    """(mean, low, high) of the seeds' knees: t interval of the mean, widened by the resolution."""
    mean = float(np.mean(knees))
    half = resolution * mean
    if len(knees) > 1:
        half += t975(len(knees) - 1) * float(np.std(knees, ddof=1)) / math.sqrt(len(knees))
    return mean, max(0.0, mean - half), mean + half


def check_search_args(seeds: int, resolution: float, num_requests: Optional[int]) -> None:
    """One line for search settings that cannot work."""
    from kvsim.errors import KvsimError
    from kvsim.scenario.limits import MAX_SEEDS, MIN_RESOLUTION

    check_int(seeds, "seeds", 1, MAX_SEEDS)
    if not (isinstance(resolution, (int, float)) and MIN_RESOLUTION <= resolution < 0.5):
        raise KvsimError(f"resolution must be in [{MIN_RESOLUTION:g}, 0.5), got {resolution!r}")
    if num_requests is not None and not (isinstance(num_requests, int) and num_requests >= 1):
        raise KvsimError(f"requests per point must be a positive integer, got {num_requests!r}")


def default_requests(scenario) -> int:
    count = expected_count(scenario)
    return DEFAULT_REQUESTS if count is None else max(1, min(count, DEFAULT_REQUESTS))


@dataclass(slots=True)
class PolicyCapacity:
    """One policy's (or deployment layout's) answer. Rates in requests/s, figures as point records."""

    policy: str
    safe_rate: float  # every seed and a LONG_RUN x longer run sustainable there (0: none found)
    mean_rate: float  # mean of the seeds' knees
    ci_low: float
    ci_high: float
    seed_max_rates: list[float]
    censored: bool  # some seed was still sustainable at the highest rate tried
    scenario_rate: float  # the scenario's own rate r0
    headroom: float  # safe_rate / scenario_rate - 1 (negative: r0 is beyond what is safe)
    sustainable_at_scenario_rate: bool  # every seed sustainable at r0
    binding: Optional[str]  # at the knee: kv_cache, max_num_seqs, token_budget, step_time, max_model_len...
    binding_detail: Optional[str]
    at_safe_rate: dict  # mean over seeds of the point figures at safe_rate, plus worst_* (seeds and long run)
    long_run_requests: int = 0  # requests of the long run that checked safe_rate
    first_unsustainable_rate: Optional[float] = None  # mean over seeds (None: censored)
    # the first seed's knee with every step STEP_COST_MARGIN cheaper / dearer (None: not searched)
    knee_faster_steps: Optional[float] = None
    knee_slower_steps: Optional[float] = None
    # where the real safe rate would fall, given real steps' error near the knee (kvsim.results.intervals)
    safe_rate_interval: Optional[dict] = None
    # seeds whose knees make the interval; 1: no seed-to-seed variance behind it (kvsim.planning.points.replications),
    # [ci_low, ci_high] is then only the search's resolution and the step-cost band
    replications: int = 0

    def row(self) -> dict:
        """A flat row: the answer and the SLO figures at safe_rate."""
        nested = ("at_safe_rate", "seed_max_rates", "safe_rate_interval")
        out = {k: v for k, v in asdict(self).items() if k not in nested}
        iv = self.safe_rate_interval or {}
        out.update(safe_rate_real_low=iv.get("low"), safe_rate_real_high=iv.get("high"),
                   safe_rate_interval=iv.get("text"))
        out["seed_max_rates"] = " ".join(f"{r:.6g}" for r in self.seed_max_rates)
        out.update({f"at_safe_{k}": v for k, v in self.at_safe_rate.items()})
        return out


def served_rps(answer) -> float:
    """Requests/s completed at the answer's safe load (the safe check's seeds' mean; 0 when unknown)."""
    return (getattr(answer, "at_safe_rate", None) or {}).get("throughput_rps") or 0.0


def ties(answers: list, unit: str = REQ_RATE) -> list[list]:
    """The answers ranked by safe rate (then mean), grouped where 95% intervals overlap with the
    group's first: the data cannot tell those apart. Within a group, what the user gets ranks them:
    for a closed loop (`unit` clients) the requests/s completed at the safe concurrency first. Works
    on PolicyCapacity and on Deployment."""
    ranked = sorted(answers, key=lambda a: (-a.safe_rate, -a.mean_rate))
    groups: list[list] = []
    for a in ranked:
        if groups and a.ci_high >= groups[-1][0].ci_low and a.ci_low <= groups[-1][0].ci_high:
            groups[-1].append(a)
        else:
            groups.append([a])
    if unit == CLIENTS:
        groups = [sorted(g, key=lambda a: (-served_rps(a), -a.safe_rate, -a.mean_rate)) for g in groups]
    return groups


def best(result) -> Optional[PolicyCapacity]:
    """The plan's answer: the first of the first group of `ties` among policies with a safe rate (None
    when no policy has one). The terminal's "best" and the dashboard's starred card."""
    groups = ties([p for p in result.policies if p.safe_rate > 0], result.meta.get("load_unit") or REQ_RATE)
    return groups[0][0] if groups else None


class Frames:
    """`to_frame()` (a row per answer, `rows()`) and `points_frame()` (a row per simulated point) as pandas DataFrames."""

    __slots__ = ()

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows())

    def points_frame(self):
        import pandas as pd

        return pd.DataFrame(self.points)


@dataclass(slots=True)
class PlanResult(Frames):
    """`kvsim.plan`'s answer: one `PolicyCapacity` per policy and every point simulated."""

    scenario: str
    meta: dict  # model, gpu, tensor_parallel_size, num_replicas, slo, seeds, num_requests, resolution
    policies: list[PolicyCapacity]
    points: list[dict] = field(default_factory=list)  # policy, seed, rate, phase + point figures
    tuning: list = field(default_factory=list)  # kvsim.planning.tune.Tuned per policy, with --tune

    def rows(self) -> list[dict]:
        return [p.row() for p in self.policies]

    def to_dict(self) -> dict:
        out = {"scenario": self.scenario, "meta": self.meta,
               "policies": [asdict(p) for p in self.policies], "points": self.points}
        if self.tuning:
            out["tuning"] = [t.as_dict() for t in self.tuning]
        return out


def _public(record: dict) -> dict:
    return {**{k: record[k] for k in FIGURES}, **{k: record[k] for k in OPTIONAL_FIGURES if k in record}}


def point_row(label: str, seed: int, rate: float, phase: str, record: dict, key: str = "policy") -> dict:
    return {key: label, "seed": seed, "rate": rate, "phase": phase, **_public(record)}


def mean_figures(records: list[dict]) -> dict:
    """Mean of each numeric point figure over seeds; the share of sustainable ones."""
    out = {"sustainable_share": sum(bool(r["sustainable"]) for r in records) / len(records)}
    for k in FIGURES:
        if k in ("sustainable", "slo_met", "stable", "binding", "binding_detail"):
            continue
        out[k] = mean_or_none(r[k] for r in records)
    for k in OPTIONAL_FIGURES:  # energy and speculation figures, when the runs have them
        if all(k in r for r in records):
            out[k] = mean_or_none(r[k] for r in records)
    return out


WORST = ("ttft_ms_at_pct", "tpot_ms_at_pct", "itl_ms_at_pct", "e2e_ms_at_pct", "backlog_fraction")


def safe_figures(check: SafeCheck) -> dict:
    """The figures at the safe rate: the seeds' mean, and `worst_*`, the highest of each SLO figure
    over the seeds and the long run (what the SLO was checked against there)."""
    if not check.records:
        return {}
    out = mean_figures(check.records)
    every = check.records + ([check.long_record] if check.long_record else [])
    for k in WORST:
        vals = [r[k] for r in every]
        out[f"worst_{k}"] = None if any(v is None for v in vals) else max(vals)
    return out


def knee_binding(searches: list[Search]) -> tuple[Optional[str], Optional[str]]:
    """The binding constraint named most often at the seeds' first unsustainable rates."""
    records = [s.hi_record for s in searches if s.hi_record is not None]
    if not records:
        return None, None
    name = Counter(r["binding"] for r in records).most_common(1)[0][0]
    return name, next(r["binding_detail"] for r in records if r["binding"] == name)


def summarize(label: str, searches: list[Search], check: Optional[SafeCheck], r0: float, resolution: float,
              long_requests: int = 0) -> PolicyCapacity:
    knees = [s.knee for s in searches]
    mean, low, high = interval(knees, resolution)
    binding, detail = knee_binding(searches)
    at_r0 = [rec["sustainable"] for s in searches for rate, rec in s.tried if rate == s.start]
    at_r0 += [s.implied[s.start] for s in searches if s.start in s.implied and all(r != s.start for r, _ in s.tried)]
    his = [s.hi for s in searches if s.hi is not None]
    safe = check.safe_rate if check is not None else first_candidate(searches)
    return PolicyCapacity(label, safe, mean, low, high, knees, any(s.censored for s in searches), r0,
                          safe / r0 - 1.0 if r0 else math.inf, all(at_r0),
                          binding, detail, safe_figures(check) if check is not None and check.done and safe else {},
                          long_requests if check is not None else 0,
                          float(np.mean(his)) if len(his) == len(searches) else None, replications=len(searches))


class Ticker:
    """Counts points done against an estimate, for a `progress(done, total)` callback."""

    def __init__(self, progress: Optional[Callable[[int, int], None]], total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, *_):
        self.done += 1
        self.total = max(self.total, self.done)
        if self.progress is not None:
            self.progress(self.done, self.total)


def capacity_search(executor, scenario, labels: list, seeds: list[int], resolution: float, tick, *,
                    start: float, num_requests: Callable, trace_rate=None, overrides_of=lambda label: None,
                    policy_of=lambda label: label, headroom_rate: Optional[float] = None,
                    confirm: bool = True, key: str = "policy", growth_of=lambda label: 2.0,
                    known=lambda label, seed: (), floor=lambda label: 0.0,
                    start_of=None, check_scale: float = 1.0, integer: bool = False, fast: bool = False,
                    guess_of=lambda label: None, exact_binding: bool = True,
                    implied_by=lambda label, seed: ()) -> tuple[list[PolicyCapacity], list[dict]]:
    """The search for each label (a policy, or a deployment layout) over seeds, starting at `start`
    req/s with `num_requests(label)` requests a point (`known(label, seed)`: (rate, record) pairs
    already simulated, `growth_of(label)`: the search's step up, `start_of(label)`: its own start); with `confirm`, each label's safe
    rate (kvsim/planning/safe.py; `floor(label)`: a rate known to pass it), else the lowest of the
    seeds' highest sustainable rates, unchecked; `check_scale`: the step_time_scale of the safe
    check's points (kvsim/planning/sensitivity.py).
    `fast` (kvsim plan without --exhaustive): overloaded runs stop once their verdict is certain
    (kvsim/results/early_stop.py) and each label's seeds after the first are `Guided` from the first's knee
    (`guess_of(label)`: a guess for the first's); with `exact_binding`, each search's first unsustainable
    point, when it was stopped, is simulated whole (the binding constraint is read from it);
    `implied_by(label, seed)`: (rate, record) of points simulated elsewhere with the very same settings, whose
    verdicts the fast search may take as implying others (not its own points: not in its rows).
    Returns the answers (headroom against `headroom_rate`, default `start`) and the point rows."""
    start_of = start_of or (lambda label: start)
    searches = {label: [Search((label, seed), start_of(label), resolution, growth_of(label), integer) for seed in seeds]
                for label in labels}
    for label, group in searches.items():
        for seed, search in zip(seeds, group):
            for rate, record in known(label, seed):
                search.update(rate, record)

    def point(label, rate: float, seed: int, long: bool = False, scale: float = 1.0, stop: bool = fast) -> tuple:
        n = num_requests(label) * (LONG_RUN if long else 1)
        return (scenario, policy_of(label), rate, seed, n, trace_rate, with_step_scale(overrides_of(label), scale),
                stop)

    def task(search: Search, rate: float, whole: bool = False) -> tuple:
        return (evaluate_point, *point(search.key[0], rate, search.key[1], stop=fast and not whole))

    if fast:
        guided = {label: [Guided(s, guess_of(label) if i == 0 else None) for i, s in enumerate(group)]
                  for label, group in searches.items()}
        for label, group in guided.items():
            for seed, g in zip(seeds, group):
                g.known.update(implied_by(label, seed))
                g.known.update(known(label, seed))
        run_guided(executor, list(guided.values()), task, tick)
        if exact_binding:
            whole_knee_points(executor, [s for group in searches.values() for s in group], point, tick)
    else:
        run_searches(executor, [s for group in searches.values() for s in group], task, tick)
    checks = {}
    if confirm:
        checks = (safe_rates_guided if fast else safe_rates)(
            executor, {label: first_candidate(group) for label, group in searches.items()}, seeds, resolution,
            lambda *a: point(*a, scale=check_scale), tick, floor, integer)
    rows = []
    for label, group in searches.items():
        for seed, s in zip(seeds, group):
            given = [id(rec) for _, rec in known(label, seed)]
            rows += [point_row(label, seed, rate, "search", rec, key) for rate, rec in s.tried if id(rec) not in given]
    for label, check in checks.items():
        rows += [point_row(label, seeds[0] if seed is None else seed, rate,
                           "safe_check_long" if seed is None else "safe_check", rec, key)
                 for rate, seed, rec in check.tried]
    r0 = start if headroom_rate is None else headroom_rate
    answers = [summarize(label, searches[label], checks.get(label), r0, resolution,
                         run_length(scenario, LONG_RUN * num_requests(label))) for label in labels]
    return answers, rows


def whole_knee_points(executor, searches: list[Search], point: Callable, tick) -> None:
    """Each search's first unsustainable point simulated whole where its run was stopped early (its binding
    constraint and figures are read), in place of the stopped record."""
    todo = [s for s in searches if s.hi_record is not None and is_stopped(s.hi_record)]
    records = run_all(executor, evaluate_point, [point(s.key[0], s.hi, s.key[1], stop=False) for s in todo],
                      lambda i, r: tick())
    for s, record in zip(todo, records):
        s.tried = [(rate, record if rec is s.hi_record else rec) for rate, rec in s.tried]
        s.hi_record = record


def step_cost_knees(executor, scenario, answers: list[PolicyCapacity], seed: int, resolution: float,
                    num_requests: int, trace_rate, tick, integer: bool = False, fast: bool = False,
                    rows: list = ()) -> list[dict]:
    """The first seed's knee re-searched with every step STEP_COST_MARGIN cheaper and dearer, from the
    knee it found; each answer's interval widened by the knees' ratios (kvsim/planning/sensitivity.py).
    `fast`: the dearer search also reads the verdicts of the safe check's points of this seed (`rows`:
    the plan's, run with the same steps and requests)."""
    todo = [a for a in answers if a.seed_max_rates and a.seed_max_rates[0] > 0 and not a.censored]
    if not todo or not scalable(scenario):
        return []
    knees, rows = {}, []
    for scale in (1.0 - STEP_COST_MARGIN, 1.0 + STEP_COST_MARGIN):
        found, points = capacity_search(
            executor, scenario, [a.policy for a in todo], [seed], resolution, tick, start=todo[0].seed_max_rates[0],
            start_of=lambda label: next(a.seed_max_rates[0] for a in todo if a.policy == label),
            num_requests=lambda label: num_requests, trace_rate=trace_rate, confirm=False,
            overrides_of=lambda label: with_step_scale(None, scale), growth_of=lambda label: KNEE_GROWTH,
            integer=integer, fast=fast, exact_binding=False,
            guess_of=lambda label: next(a.seed_max_rates[0] for a in todo if a.policy == label) / scale,
            implied_by=lambda label, _: [(r["rate"], {"sustainable": r["sustainable"]}) for r in rows
                                         if r["policy"] == label and r["phase"] == "safe_check" and r["seed"] == seed
                                         and scale == check_scale(scenario)])
        knees[scale] = [f.mean_rate for f in found]
        rows += [{**r, "phase": f"step_cost_x{scale:g}"} for r in points]
    basis, differs = _basis_dict(scenario)
    for i, a in enumerate(todo):
        fast, slow = knees[1.0 - STEP_COST_MARGIN][i], knees[1.0 + STEP_COST_MARGIN][i]
        widen(a, a.seed_max_rates[0], fast, slow)
        a.safe_rate_interval = rate_interval(a.safe_rate, a.seed_max_rates[0], fast, slow, basis, STEP_COST_MARGIN,
                                             differs(a.policy))
    return rows


def _basis_dict(scenario) -> tuple:
    """The run's pricing basis, and per policy how its runs differ from the held-out real ones
    (kvsim.results.intervals.unlike)."""
    from kvsim.pipeline import run_meta  # a disaggregated policy's basis is its pools'
    from kvsim.results.intervals import unlike
    from kvsim.scenario.catalog import gpu_spec, model_spec

    model, gpu = model_spec(scenario), gpu_spec(scenario)
    meta = run_meta(scenario, model, gpu)
    pooled = set((meta.get("disaggregation") or {}).get("policies") or ())
    return meta["pricing_basis"], lambda policy: unlike(model, gpu.name, scenario.hardware.tensor_parallel_size,
                                                        policy in pooled)


def _margin(record: dict) -> float:
    m = record["slo_margin"]
    return (1.0 if record["sustainable"] else 0.0) + (-1e9 if m is None else m)


def name_step_time(executor, scenario, answers: list[PolicyCapacity], seed: int, num_requests: int, trace_rate,
                   tick) -> list[dict]:
    """Compute or bandwidth, for each answer whose knee is bound by step time (module docstring)."""
    from kvsim.scenario.catalog import gpu_spec

    gpu = gpu_spec(scenario)
    variants = {"as_is": None,
                "compute": {"bf16_tflops": 2 * gpu.bf16_tflops, "fp8_tflops": 2 * gpu.fp8_tflops,
                            "fp32_tflops": 2 * gpu.fp32_tflops},
                "bandwidth": {"hbm_bandwidth_gbps": 2 * gpu.hbm_bandwidth_gbps}}
    todo = [a for a in answers if a.binding == "step_time" and a.first_unsustainable_rate]
    tasks = [(scenario, a.policy, a.first_unsustainable_rate, seed, num_requests, trace_rate,
              {"hardware": hw} if hw else None) for a in todo for hw in variants.values()]
    records = run_all(executor, evaluate_point, tasks, lambda i, r: tick())
    rows = []
    for i, a in enumerate(todo):
        by_kind = dict(zip(variants, records[3 * i:3 * i + 3]))
        for kind, rec in by_kind.items():
            rows.append(point_row(a.policy, seed, a.first_unsustainable_rate,
                                  "counterfactual_baseline" if kind == "as_is" else f"twice_{kind}", rec))
        gain = {k: _margin(by_kind[k]) for k in ("compute", "bandwidth")}
        if gain["compute"] == gain["bandwidth"]:
            continue
        kind = max(gain, key=gain.get)
        a.binding = kind
        a.binding_detail = (f"{'compute' if kind == 'compute' else 'HBM bandwidth'}: nothing held admission back, and at "
                            f"{a.first_unsustainable_rate:.3g} req/s (SLO margin {_text(by_kind['as_is'])} as it is) "
                            f"twice the {'FLOP/s' if kind == 'compute' else 'bandwidth'} helps the SLO most "
                            f"(margin {_text(by_kind['compute'])} with 2x FLOP/s, {_text(by_kind['bandwidth'])} with "
                            "2x bandwidth)")
    return rows


def _text(record: dict) -> str:
    m = record["slo_margin"]
    return "unbounded" if m is None else f"{m:+.0%}"


def trace_rows_of(scenario) -> Optional[int]:
    """Rows of a trace replayed with its times (None for other arrivals)."""
    from kvsim.planning.points import trace_rows

    return trace_rows(scenario) if scenario.workload.arrival.process == "trace" else None


def plan(scenario, *, policies: Optional[list[str]] = None, seeds: int = 3, resolution: float = 0.02,
         num_requests: Optional[int] = None, workers: Optional[int] = None, ray: Optional[str] = None,
         executor=None, progress: Optional[Callable[[int, int], None]] = None, tune: bool = False,
         exhaustive: bool = False) -> PlanResult:
    """Each policy's safe rate, with the mean and interval of its knee; see the module docstring.
    `tune`: then search each policy's max_num_seqs and max_num_batched_tokens (kvsim/planning/tune.py).
    `exhaustive`: every point simulated whole and every search run in full (`capacity_search`'s `fast`)."""
    from kvsim.pipeline import chosen_policies, run_meta  # run_meta: a disaggregated policy's basis is its pools'
    from kvsim.results.verdict import STABILITY_TOLERANCE
    from kvsim.scenario.catalog import gpu_spec, model_spec

    check_search_args(seeds, resolution, num_requests)
    chosen = [p.name for p in chosen_policies(scenario, policies)]
    check_fits(scenario, chosen)
    n = num_requests or default_requests(scenario)
    unit = load_unit(scenario)
    r0 = base_rate(scenario, n)  # a trace: the mean rate of the rows each point replays; a closed loop: its clients
    trace_rate = r0 if scenario.workload.arrival.process == "trace" else None
    integer = unit == CLIENTS
    kept, why = replications(scenario, n, seeds)  # a replayed trace: its windows; nothing random: one
    seed_list = [scenario.workload.seed + i for i in range(kept)]
    tick = Ticker(progress, len(chosen) * (seeds * (expected_points(resolution) + 1) + LONG_RUN + 8))
    own = executor is None
    executor = executor or make_executor(workers, ray)
    try:
        answers, rows = capacity_search(executor, scenario, chosen, seed_list, resolution, tick, start=r0,
                                        num_requests=lambda label: n, trace_rate=trace_rate,
                                        check_scale=check_scale(scenario), integer=integer, fast=not exhaustive)
        rows += step_cost_knees(executor, scenario, answers, seed_list[0], resolution, n, trace_rate, tick, integer,
                                not exhaustive, rows)
        rows += name_step_time(executor, scenario, answers, seed_list[0], n, trace_rate, tick)
        tuning = []
        if tune:
            from kvsim.planning.tune import tune as tune_engine

            tuning, more = tune_engine(executor, scenario, answers, seed_list, resolution, n, trace_rate, tick,
                                       partial(capacity_search, check_scale=check_scale(scenario), integer=integer,
                                               fast=not exhaustive))
            rows += more
    finally:
        if own:
            executor.close()
    hw = scenario.hardware
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    meta = {"model": model.name, "gpu": gpu.name, "pricing_basis": run_meta(scenario, model, gpu)["pricing_basis"],
            "safe_check_step_time_scale": check_scale(scenario), "step_cost_margin": STEP_COST_MARGIN,
            "tensor_parallel_size": hw.tensor_parallel_size, "data_parallel_size": hw.data_parallel_size,
            "enable_expert_parallel": hw.enable_expert_parallel, "num_replicas": hw.num_replicas,
            "arrival": scenario.workload.arrival.model_dump(), "scenario_rate": r0,
            "slo": scenario.slo.model_dump(), "seeds": seed_list, "num_requests": n, "resolution": resolution,
            "stability_tolerance": STABILITY_TOLERANCE, "policy_order": [p.name for p in scenario.policies],
            "long_run_requests": run_length(scenario, LONG_RUN * n), "load_unit": unit,
            "seeds_asked": seeds, "replications_note": why, "trace_rows": trace_rows_of(scenario),
            "trace_windows": windowed(scenario)}
    return PlanResult(scenario.name or "scenario", meta, answers, rows, tuning)
