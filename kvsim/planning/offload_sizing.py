"""`kvsim plan --offload-gib G1,G2,...`: how much host DRAM each replica's CPU offload tier should get,
and whether a tier pays for itself at all.

For each size (GiB of CPU tier per replica, as vLLM's --kv-offloading-size reads it; 0: no tier, the
same policy served from HBM alone) the policy's safe rate is searched as `kvsim plan` searches it
(kvsim.planning.capacity: seeds, bisection, the long-run check), on the same seeds and requests. Each
size is priced per hour: the deployment's GPUs at their hourly price (kvsim.scenario.layout) and the
tier's DRAM at a $/GiB-hour (default: the catalog's HOST_DRAM_PRICE, with its source) — host DRAM
the servers already have is still DRAM another tenant cannot use, so it is charged either way. The
figure of merit is $ per million requests served at the safe rate (for a closed loop: at the
requests/s completed at the safe concurrency).

The verdict: the size with the fewest $ per million requests is the one to buy; a tier *pays* when
that size is not 0 and its safe rate's interval lies above the no-tier's (overlapping intervals: the
data cannot tell the gain from noise, and the verdict says so). `enough_gib` is the smallest size
whose safe-rate interval overlaps the best size's: past it more DRAM buys nothing measurable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from kvsim.errors import KvsimError
from kvsim.planning.capacity import Frames, PolicyCapacity, plan, served_rps
from kvsim.planning.points import CLIENTS
from kvsim.scenario.catalog import HOST_DRAM_PRICE

MAX_SIZES = 16


@dataclass(slots=True)
class OffloadSize:
    """One CPU-tier size: its safe rate (a PolicyCapacity) and what it costs."""

    gib: float  # CPU tier per replica (0: none)
    capacity: PolicyCapacity
    tier_tokens: Optional[int]  # tokens the tier holds per replica (None: no tier)
    gpu_usd_per_hour: Optional[float]  # every GPU of the deployment (None: no price for the GPU)
    dram_usd_per_hour: float  # the tiers of every replica
    served_rps: float  # requests/s served at the safe load
    usd_per_million_requests: Optional[float]  # (GPUs + DRAM) / served requests; None: no safe load or no price

    def row(self) -> dict:
        out = {"offload_gib": self.gib, "tier_tokens": self.tier_tokens, "safe_rate": self.capacity.safe_rate,
               "ci_low": self.capacity.ci_low, "ci_high": self.capacity.ci_high, "served_rps": self.served_rps,
               "gpu_usd_per_hour": self.gpu_usd_per_hour, "dram_usd_per_hour": self.dram_usd_per_hour,
               "usd_per_million_requests": self.usd_per_million_requests, "binding": self.capacity.binding}
        out.update({f"at_safe_{k}": v for k, v in self.capacity.at_safe_rate.items()})
        return out


@dataclass(slots=True)
class OffloadPlan(Frames):
    """`plan --offload-gib`'s answer: one OffloadSize per size, the verdict, and every point simulated."""

    scenario: str
    policy: str
    meta: dict  # plan's meta, plus the prices and their sources
    sizes: list[OffloadSize]
    best_gib: Optional[float]  # the size with the fewest $ per million requests (None: none priced)
    enough_gib: Optional[float]  # the smallest size tied with the best on safe rate
    pays: Optional[bool]  # the best size has a tier and beats no tier beyond the intervals (None: undecided)
    verdict: str
    points: list[dict] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [s.row() for s in self.sizes]

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "policy": self.policy, "meta": self.meta, "best_gib": self.best_gib,
                "enough_gib": self.enough_gib, "pays": self.pays, "verdict": self.verdict,
                "sizes": [{**s.row(), "capacity": asdict(s.capacity)} for s in self.sizes], "points": self.points}


def parse_sizes(text: str) -> list[float]:
    """'0,50,100' -> [0.0, 50.0, 100.0] (sorted, distinct, finite, >= 0); one line naming the flag otherwise."""
    try:
        sizes = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise KvsimError(f"--offload-gib: not a list of GiB: {text!r} (e.g. 0,50,100,200)") from None
    if not sizes or any(not 0 <= s < float("inf") for s in sizes):
        raise KvsimError(f"--offload-gib: sizes are GiB per replica, 0 or more (got {text!r})")
    if len(sizes) > MAX_SIZES:
        raise KvsimError(f"--offload-gib: at most {MAX_SIZES} sizes (got {len(sizes)})")
    return sizes


def offload_policy(scenario, policies: Optional[list[str]]):
    """The policy whose tier is sized: the one --policy names, else the first served with the tiers."""
    if scenario.kv_offload is None:
        raise KvsimError(f"--offload-gib: {scenario.source} has no [kv_offload] section (the tier's backend and "
                         "links; see scenarios/multi_turn_offload.toml)")
    if policies:
        if len(policies) > 1:
            raise KvsimError("--offload-gib sizes one policy's tier: give one --policy")
        chosen = [p for p in scenario.policies if p.name == policies[0]]
        if not chosen:
            raise KvsimError(f"--policy: no policy {policies[0]!r} in {scenario.source}")
        policy = chosen[0].model_copy(update={"kv_offload": None})
        if not scenario.offloaded(policy):
            raise KvsimError(f"--policy: {policy.name} cannot be served with offload tiers (the paged allocator "
                             "and aggregated serving are needed)")
        return policy
    for p in scenario.policies:
        if scenario.offloaded(p):
            return p
    raise KvsimError(f"--offload-gib: no policy of {scenario.source} is served with the [kv_offload] tiers")


def variant(scenario, policy, gib: float):
    """The scenario with one policy: `policy` with a CPU tier of `gib` per replica (0: without tiers)."""
    if gib == 0:
        return scenario.model_copy(update={"policies": [policy.model_copy(update={"kv_offload": False})]})
    tiers = scenario.kv_offload.model_copy(update={"kv_offloading_size": gib, "optimal_bound": False})
    return scenario.model_copy(update={"kv_offload": tiers,
                                       "policies": [policy.model_copy(update={"kv_offload": True})]})


def check_sizes(scenario, policy, sizes: list[float]) -> dict:
    """Each size with a tier resolved now (a tier larger than the host fails before any simulation);
    returns the tokens each holds per replica."""
    from kvsim.perf.offload import offload_settings
    from kvsim.pipeline import resolve_policy
    from kvsim.scenario.catalog import gpu_spec, model_spec

    model, gpu = model_spec(scenario), gpu_spec(scenario)
    tokens = {}
    for gib in sizes:
        if gib == 0:
            continue
        v = variant(scenario, policy, gib)
        try:
            settings = offload_settings(v, v.policies[0], model, gpu, resolve_policy(v, v.policies[0], model, gpu)[0])
        except KvsimError as e:
            raise KvsimError(f"--offload-gib {gib:g}: {str(e).split(': ', 1)[-1]}") from None
        tokens[gib] = settings.tokens
    return tokens


def offload_plan(scenario, sizes: list[float], *, policies: Optional[list[str]] = None,
                 dram_usd_gib_hour: Optional[float] = None, workers: Optional[int] = None, ray: Optional[str] = None,
                 executor=None, **common) -> OffloadPlan:
    """The policy's safe rate and cost at every CPU-tier size; see the module docstring. `common`: plan's
    seeds, resolution, num_requests, progress."""
    from kvsim.planning.executors import make_executor
    from kvsim.scenario.layout import hourly_cost

    policy = offload_policy(scenario, policies)
    tokens = check_sizes(scenario, policy, sizes)
    dram = HOST_DRAM_PRICE.usd_per_hour if dram_usd_gib_hour is None else dram_usd_gib_hour
    dram_source = (f"{HOST_DRAM_PRICE.source} ({HOST_DRAM_PRICE.date})" if dram_usd_gib_hour is None
                   else "--dram-usd-gib-hour")
    gpus = hourly_cost(scenario)
    replicas = scenario.hardware.num_replicas
    own = executor is None
    executor = executor or make_executor(workers, ray)
    sized, points, meta = [], [], {}
    try:
        for gib in sizes:
            result = plan(variant(scenario, policy, gib), executor=executor, **common)
            answer = result.policies[0]
            meta = result.meta
            served = served_rps(answer) if meta.get("load_unit") == CLIENTS else answer.safe_rate
            dram_hour = dram * gib * replicas
            cost = None if gpus is None or served <= 0 else (gpus.usd_per_hour + dram_hour) / (served * 3600) * 1e6
            sized.append(OffloadSize(gib, answer, tokens.get(gib), None if gpus is None else gpus.usd_per_hour,
                                     dram_hour, served, cost))
            points += [{**row, "offload_gib": gib} for row in result.points]
    finally:
        if own:
            executor.close()
    meta = {**meta, "policy_order": [policy.name], "dram_usd_per_gib_hour": dram, "dram_price_source": dram_source,
            "gpu_usd_per_hour": None if gpus is None else gpus.usd_per_hour,
            "gpu_price_source": None if gpus is None else gpus.source, "offload_backend": scenario.kv_offload.backend}
    best, enough, pays, verdict = judge(sized)
    return OffloadPlan(scenario.name or "scenario", policy.name, meta, sized, best, enough, pays, verdict, points)


def _overlap(a: PolicyCapacity, b: PolicyCapacity) -> bool:
    return a.ci_high >= b.ci_low and a.ci_low <= b.ci_high


def judge(sizes: list[OffloadSize]) -> tuple:
    """(best_gib, enough_gib, pays, verdict line); see the module docstring."""
    priced = [s for s in sizes if s.usd_per_million_requests is not None]
    if not priced:
        return None, None, None, ("no size has a safe load with a price: nothing to compare (a GPU without a "
                                  "price: set cost.gpu_hour_usd)")
    best = min(priced, key=lambda s: (s.usd_per_million_requests, s.gib))
    enough = min((s for s in sizes if s.capacity.safe_rate > 0 and _overlap(s.capacity, best.capacity)),
                 key=lambda s: s.gib).gib
    none = next((s for s in sizes if s.gib == 0), None)
    usd = f"${best.usd_per_million_requests:,.2f} per million requests"
    if best.gib == 0:
        return 0.0, enough, False, f"offload does not pay: no CPU tier is cheapest ({usd} at the safe load)"
    if none is None:
        return best.gib, enough, None, (f"{best.gib:g} GiB per replica is the cheapest size tried ({usd}); add 0 to "
                                        "--offload-gib to compare with no tier")
    gain = (f"safe rate {best.capacity.safe_rate:.3g} against {none.capacity.safe_rate:.3g} without a tier"
            if none.capacity.safe_rate > 0 else "a safe load where no tier has none")
    if none.capacity.safe_rate > 0 and _overlap(best.capacity, none.capacity):
        return best.gib, enough, None, (f"undecided: {best.gib:g} GiB per replica is cheapest ({usd}, {gain}) but "
                                        "its safe rate's interval overlaps no tier's: more seeds or requests")
    saved = ("" if none.usd_per_million_requests is None else
             f", {1 - best.usd_per_million_requests / none.usd_per_million_requests:.0%} less than without")
    return best.gib, enough, True, (f"offload pays: {best.gib:g} GiB of CPU tier per replica ({usd}{saved}; "
                                    f"{gain}); {enough:g} GiB already reaches that safe rate")


def offload_lines(result: OffloadPlan) -> list[str]:
    """The verdict and what the prices rest on, for the terminal."""
    m = result.meta
    gpu = ("GPUs unpriced" if m.get("gpu_usd_per_hour") is None else
           f"GPUs ${m['gpu_usd_per_hour']:,.2f}/h ({m['gpu_price_source']})")
    return [f"kvsim plan --offload-gib: {result.scenario}, policy {result.policy}, {m.get('num_replicas')} x "
            f"{m.get('gpu')} (TP {m.get('tensor_parallel_size')}), {m.get('offload_backend')} offload",
            f"prices: {gpu}; host DRAM ${m['dram_usd_per_gib_hour']:.6g}/GiB-hour ({m['dram_price_source']})",
            f"verdict: {result.verdict}"]


def offload_table(result: OffloadPlan):
    from rich.table import Table

    closed = result.meta.get("load_unit") == CLIENTS
    unit = result.meta.get("load_unit") or "req/s"
    table = Table(title="CPU offload tier per replica: safe load and cost (every seed and a long run sustainable)")
    labels = ["CPU GiB / replica", "tier tokens", f"safe {unit}", "knee 95% CI", "served req/s", "$/hour",
              "of which DRAM", "$ / M requests", "binds at the knee"]
    for i, label in enumerate(labels):
        table.add_column(label, justify="left" if i == len(labels) - 1 else "right", no_wrap=i == 0)
    for s in result.sizes:
        c = s.capacity
        hour = None if s.gpu_usd_per_hour is None else s.gpu_usd_per_hour + s.dram_usd_per_hour
        mark = " *" if s.gib == result.best_gib else ""
        table.add_row(f"{s.gib:g}{mark}", "–" if s.tier_tokens is None else f"{s.tier_tokens:,}",
                      f"{c.safe_rate:,.{0 if closed else 2}f}", f"{c.ci_low:,.2f}–{c.ci_high:,.2f}",
                      f"{s.served_rps:,.2f}", "–" if hour is None else f"{hour:,.2f}", f"{s.dram_usd_per_hour:,.2f}",
                      "–" if s.usd_per_million_requests is None else f"{s.usd_per_million_requests:,.2f}",
                      c.binding or "–")
    return table
