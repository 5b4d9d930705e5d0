"""`kvsim plan --speculative-k`: speculation's worth, and `--rank energy`.

For each chosen policy the plan searches the safe rate of the policy without speculative decoding
and with each k in the list (policies named `<policy> k=off`, `<policy> k=3`, ... in a derived
scenario, each `policies[].num_speculative_tokens`), so the usual capacity search (kvsim.planning.
capacity.plan: seeds, intervals, ties, the safe rate's long run) answers "which k?" and "does it
raise capacity?" together. Then, at fractions of the speculation-free safe rate (`LOADS`), the best
k and no speculation are simulated side by side on the first seed: the time per output token at the
SLO's percentile (what speculation is for), output tokens/s and, with [energy], joules per output
token. Speculation *stops paying* at the lowest load where its TPOT is no better than without
(linear between the loads that bracket it); when it pays at every load up to the knee, the
capacity comparison says whether it also pays there. Answers are typed records (`SpeculationPlan`,
a PlanResult with its payoff curve).

`energy_ranking` orders a plan's answers by joules per output token at their safe rates (energy
figures come with an [energy] section; `plan --rank energy` adds one with its defaults when absent).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from kvsim.errors import KvsimError
from kvsim.planning.capacity import PlanResult, default_requests, plan
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.points import base_rate, evaluate_point, load_unit

LOADS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)  # fractions of the speculation-free safe rate the payoff is checked at
OFF = "off"


def label(policy: str, k) -> str:
    return f"{policy} k={k}"


def variants(scenario, policies: list[str], ks: list[int]):
    """The scenario with each chosen policy as its speculation-free and its k-draft variants (one set for
    policies that differ only in their speculation, e.g. a policy and its speculative = false copy)."""
    if scenario.speculative is None:
        raise KvsimError(f"{scenario.source}: --speculative-k needs a [speculative] section (its method and "
                         "acceptance; the k searched replace num_speculative_tokens)")
    if scenario.speculative.acceptance is not None and max(ks) > len(scenario.speculative.acceptance):
        raise KvsimError(f"--speculative-k: k = {max(ks)} but speculative.acceptance gives "
                         f"{len(scenario.speculative.acceptance)} positions")
    data = scenario.model_dump()
    out, seen = [], []
    for p in data["policies"]:
        # a policy that differs from an earlier one only in its speculation has the same variants
        same = {k: v for k, v in p.items() if k not in ("name", "speculative", "num_speculative_tokens")}
        if p["name"] not in policies or same in seen:
            continue
        seen.append(same)
        out.append({**p, "name": label(p["name"], OFF), "speculative": False, "num_speculative_tokens": None})
        out += [{**p, "name": label(p["name"], k), "speculative": True, "num_speculative_tokens": k} for k in ks]
    data["policies"] = out
    from kvsim.scenario.config import scenario_from_dict

    return scenario_from_dict(data, scenario.source, scenario.base_dir)


@dataclass(slots=True)
class Payoff:
    """One policy's comparison at fractions of its speculation-free safe rate."""

    policy: str
    best_k: int  # the k with the highest safe rate (ties: the smaller k)
    safe_rate_off: float
    safe_rate_best: float
    loads: list[dict]  # rate, fraction, and for off and best: tpot_ms_at_pct, output_tokens_per_s, ...
    stops_paying_rate: Optional[float]  # None: speculation's TPOT is better at every load checked
    verdict: str


@dataclass(slots=True)
class SpeculationPlan(PlanResult):
    """A PlanResult over the speculation variants, with each policy's payoff."""

    ks: list = field(default_factory=list)
    payoffs: list = field(default_factory=list)

    def to_dict(self) -> dict:
        out = PlanResult.to_dict(self)
        out["speculation"] = {"num_speculative_tokens": self.ks, "loads": list(LOADS),
                              "payoffs": [asdict(p) for p in self.payoffs]}
        return out


def speculation_plan(scenario, ks: list[int], *, policies: Optional[list[str]] = None, seeds: int = 3,
                     resolution: float = 0.02, num_requests: Optional[int] = None, workers: Optional[int] = None,
                     ray: Optional[str] = None, progress=None) -> SpeculationPlan:
    """Safe rates without speculation and with each k, and where speculation stops paying (module docstring)."""
    from kvsim.pipeline import chosen_policies

    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise KvsimError(f"--speculative-k: draft token counts of at least 1, got {ks}")
    chosen = [p.name for p in chosen_policies(scenario, policies)]
    derived = variants(scenario, chosen, sorted(set(ks)))
    executor = make_executor(workers, ray)
    try:
        result = plan(derived, seeds=seeds, resolution=resolution, num_requests=num_requests, executor=executor,
                      progress=progress)
        n = num_requests or default_requests(scenario)
        payoffs = [_payoff(executor, derived, p, sorted(set(ks)), result, n) for p in chosen]
    finally:
        executor.close()
    return SpeculationPlan(result.scenario, {**result.meta, "speculative": scenario.speculative.model_dump()},
                           result.policies, result.points, result.tuning, sorted(set(ks)), payoffs)


def _payoff(executor, scenario, policy: str, ks: list[int], result: PlanResult, n: int) -> Payoff:
    answers = {a.policy: a for a in result.policies}
    off = answers[label(policy, OFF)]
    best = max(ks, key=lambda k: (answers[label(policy, k)].safe_rate, -k))
    knee = off.safe_rate or off.first_unsustainable_rate or base_rate(scenario, n)
    integer = load_unit(scenario) == "clients"
    rates = sorted({max(1, round(f * knee)) if integer else f * knee for f in LOADS})
    seed = scenario.workload.seed
    trace_rate = base_rate(scenario, n) if scenario.workload.arrival.process == "trace" else None
    tasks = [(scenario, label(policy, k), r, seed, n, trace_rate) for r in rates for k in (OFF, best)]
    records = run_all(executor, evaluate_point, tasks)
    loads = []
    for i, r in enumerate(rates):
        a, b = records[2 * i], records[2 * i + 1]
        loads.append({"rate": r, "fraction_of_knee": r / knee if knee else None,
                      **{f"off_{k}": a.get(k) for k in _COMPARED}, **{f"spec_{k}": b.get(k) for k in _COMPARED}})
    stop = _crossing(loads)
    best_answer = answers[label(policy, best)]
    verdict = _verdict(policy, best, off.safe_rate, best_answer.safe_rate, stop, load_unit(scenario),
                       loads[0]["rate"] if loads else None)
    if best != OFF and _overlap(off, best_answer):
        verdict += " (within the seeds' noise: the knees' 95% intervals overlap)"
    return Payoff(policy, best, off.safe_rate, best_answer.safe_rate, loads, stop, verdict)


def _overlap(a, b) -> bool:
    """Whether two answers' knee intervals overlap (the plan's 'tied with')."""
    if None in (a.ci_low, a.ci_high, b.ci_low, b.ci_high):
        return False
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high


_COMPARED = ("tpot_ms_at_pct", "tpot_p99_ms", "ttft_ms_at_pct", "output_tokens_per_s", "sustainable",
             "joules_per_output_token", "gpu_joules_per_output_token", "mean_acceptance_length")


def _crossing(loads: list[dict]) -> Optional[float]:
    """The lowest load where speculation's TPOT (at the SLO's percentile) is no better than without:
    linear between the two loads that bracket the sign change; the first load when it never helps."""
    prev = None
    for row in loads:
        off, spec = row["off_tpot_ms_at_pct"], row["spec_tpot_ms_at_pct"]
        if off is None or spec is None:
            continue
        gain = off - spec
        if gain <= 0:
            if prev is None:
                return row["rate"]
            (r0, g0), r1 = prev, row["rate"]
            return r0 + (r1 - r0) * g0 / (g0 - gain)
        prev = (row["rate"], gain)
    return None


def _verdict(policy: str, k: int, off: float, best: float, stop: Optional[float], unit: str,
             lowest: Optional[float] = None) -> str:
    if off and best:
        verb = "raises" if best > off else "lowers" if best < off else "leaves"
        cap = f"{verb} the safe rate {best / off - 1:+.0%} ({off:.3g} -> {best:.3g} {unit})"
    else:
        cap = "changes no safe rate found"
    if stop is None:
        return f"{policy}: k={k} shortens the time per token at every load up to the knee and {cap}"
    if stop == lowest:
        return (f"{policy}: k={k} does not pay at any load checked (its TPOT no better than without from {stop:.3g} "
                f"{unit} on); it {cap}")
    return f"{policy}: k={k} stops paying at about {stop:.3g} {unit} (its TPOT no better than without from there); it {cap}"


def speculation_lines(result: SpeculationPlan) -> list[str]:
    lines = [f"speculative decoding ({result.meta['speculative']['method']}), k searched: "
             f"{', '.join(map(str, result.ks))}; payoff at {', '.join(f'{f:.0%}' for f in LOADS)} of each policy's "
             "speculation-free safe rate (first seed)"]
    lines += [p.verdict for p in result.payoffs]
    return lines


def speculation_table(result: SpeculationPlan):
    from rich.table import Table

    table = Table(title="kvsim plan --speculative-k: speculation against none, at fractions of the knee")
    for col in ("policy", "k", "load", "TPOT at pct: off", "spec", "out tok/s: off", "spec", "J/token: off", "spec"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for p in result.payoffs:
        for row in p.loads:
            table.add_row(p.policy, str(p.best_k), f"{row['rate']:.3g}", *(_fmt(row[f"{side}_{key}"], d)
                          for key, d in (("tpot_ms_at_pct", 1), ("output_tokens_per_s", 0), ("joules_per_output_token", 3))
                          for side in ("off", "spec")))
    return table


def _fmt(x, digits: int) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def with_energy(scenario):
    """The scenario with an [energy] section (its defaults) when it has none: what --rank energy reads."""
    if scenario.energy is not None:
        return scenario
    from kvsim.scenario.config import EnergyConfig

    return scenario.model_copy(update={"energy": EnergyConfig()}).located(scenario.source, scenario.base_dir)


def energy_ranking(result: PlanResult, ranked: bool = True) -> list[str]:
    """The answers' energy at their safe rates: J per output token, kWh, energy $ and GPU-hour $ per million
    output tokens; lowest J first when `ranked` (--rank energy), else in the plan's order. [] when the
    plan's runs have no energy figures (no [energy] section)."""
    rows = [(p.policy, p.at_safe_rate.get("joules_per_output_token"), p.at_safe_rate.get("kwh_per_million_output_tokens"),
             p.at_safe_rate.get("energy_usd_per_million_output_tokens"),
             p.at_safe_rate.get("gpu_hour_usd_per_million_output_tokens"), p.safe_rate)
            for p in result.policies if p.safe_rate > 0]
    rows = [r for r in rows if r[1] is not None]
    if not rows:
        return []
    if ranked:
        rows.sort(key=lambda r: r[1])
    lines = [("ranked by energy" if ranked else "energy") +
             " at the safe rate (facility J per output token: GPU, host x PUE):"]
    for i, (name, j, kwh, usd, gpu_usd, rate) in enumerate(rows, 1):
        gpu_text = f", GPU-hours ${gpu_usd:.3g}" if gpu_usd is not None else ""
        lines.append(f"  {i}. {name}: {j:.3g} J/token; per million output tokens {kwh:.3g} kWh, energy ${usd:.3g}"
                     f"{gpu_text} (at {rate:.3g})")
    return lines
