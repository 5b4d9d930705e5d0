"""What the Answer page says, computed from the library's answers (`kvsim.plan`, `kvsim.deploy`): a
card per policy and the line that answers a target rate, each $ figure for every GPU the layout takes
(TP x DP a replica, every replica: kvsim.scenario.layout.hourly_cost) and said at which rate it is
priced. What to change when the scenario cannot run is kvdash.diagnosis. No Streamlit here but the
caches: the page draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from kvdash import plans
from kvsim.scenario import layout
from kvsim.scenario.config import scenario_from_toml

CLI = plans.DEFAULT  # `kvsim plan`'s own defaults: the page's numbers are the command line's


@dataclass(frozen=True, slots=True)
class Card:
    """One policy's answer in a few lines."""

    policy: str
    color: str
    best: bool
    meets: bool  # every seed sustainable at the scenario's rate
    safe_rate: float
    headroom: float
    knee: str  # "23.8 (95% CI 22.0–25.6)"
    tied: tuple[str, ...]
    usd_per_hour: float | None  # every GPU of the layout
    usd_per_m_output: float | None  # at the safe rate (a closed loop: the req/s its safe clients get)
    binding: str
    binding_detail: str
    note: str = ""  # a label for the figures' provenance (e.g. measured or estimated), when there is one
    unit: str = "req/s"  # what safe_rate counts: req/s, sessions/s, or clients (a closed loop's concurrency)
    throughput: float | None = None  # requests/s at the safe load (a closed loop's: what its clients get)
    gpus: str = ""  # what the $/hour pays for, e.g. "2 × H100-SXM"
    real_range: str = ""  # where the real safe rate would fall, from held-out runs (kvsim.results.intervals)


def cards(result, colors: dict, tied: dict, usd_per_hour: float | dict | None, output_tokens: float,
          gpus: dict | None = None) -> list[Card]:
    """A card per policy of a `kvsim.plan` result; the best is the first of the highest safe rates (a
    closed loop: concurrencies), $ per million output tokens at the requests/s served there.
    `usd_per_hour`: one figure, or one per policy (a disaggregated policy's GPUs are its pools');
    `gpus`: per policy, what that pays for."""
    best = max(result.policies, key=lambda p: (p.safe_rate, p.mean_rate), default=None)
    note = basis_note(result.meta.get("pricing_basis"))
    unit = result.meta.get("load_unit") or "req/s"
    costs = usd_per_hour if isinstance(usd_per_hour, dict) else {}
    out = []
    for p in result.policies:
        usd = costs.get(p.policy) if costs else usd_per_hour
        rps = p.safe_rate if unit == "req/s" else (p.at_safe_rate.get("throughput_rps") if p.safe_rate > 0 else None)
        per_m = usd / (rps * 3600 * output_tokens) * 1e6 if usd and rps and output_tokens else None
        out.append(Card(p.policy, colors[p.policy], p is best and p.safe_rate > 0, p.sustainable_at_scenario_rate,
                        p.safe_rate, p.headroom, f"{p.mean_rate:.3g} (95% CI {p.ci_low:.3g}–{p.ci_high:.3g})",
                        tuple(tied.get(p.policy, ())), usd, per_m, p.binding or "–",
                        p.binding_detail or "", note, unit=unit, throughput=rps,
                        gpus=(gpus or {}).get(p.policy, ""), real_range=real_range(p, unit)))
    return out


def real_range(p, unit: str) -> str:
    """'on real runs like this 11.2–13.0 req/s (...)' of a plan answer (kvsim.results.intervals), '' without one."""
    iv = p.safe_rate_interval
    if not iv or p.safe_rate <= 0:
        return ""
    from kvsim.results.intervals import real_runs_words

    return f"{real_runs_words(iv)} {iv['low']:.3g}–{iv['high']:.3g} {unit} ({iv['text']})"


def basis_note(basis: dict | None) -> str:
    """'Measured: why' or 'Estimated: why' (kvsim.perf.basis.PricingBasis.to_dict()), '' when unknown."""
    if not basis:
        return ""
    return f"{basis['label'].capitalize()}: {basis['why']}"


def load_label(unit: str, value: float) -> str:
    """e.g. '14 req/s', '64 clients'."""
    return f"{value:.3g} {unit}"


def _views(scenario, policy=None) -> list:
    """The scenario as each of its pools runs it: itself, or a disaggregated policy's prefill and decode pools."""
    if policy is not None and scenario.disaggregated(policy):
        from kvsim.scenario.disaggregation import ROLES, pool_view

        return [pool_view(scenario, policy, role)[0] for role in ROLES]
    return [scenario]


def hourly_cost(scenario, policy=None) -> tuple[float, str] | None:
    """($/hour of every GPU the scenario takes, the price's source), or None without a price: the
    library's one figure (kvsim.scenario.layout.hourly_cost: TP x DP a replica, every replica; for a
    policy served disaggregated, its prefill and decode pools' GPUs)."""
    cost = layout.hourly_cost(scenario, policy)
    return None if cost is None else (cost.usd_per_hour, cost.source)


def gpus_text(scenario, policy=None) -> str:
    """What `hourly_cost` pays for: '2 × H100-SXM'; a disaggregated policy's pools: '1 × H100-SXM + 2 × H200'."""
    return " + ".join(f"{layout.hardware_gpus(v.hardware)} × {v.hardware.gpu}" for v in _views(scenario, policy))


@st.cache_data(max_entries=32, show_spinner=False)
def mean_tokens(toml_text: str, source: str, base_dir: str, inputs_digest: str) -> tuple[float, float]:
    """Mean prompt and output tokens of the requests a plan point replays (as `kvsim.deploy` prices them)."""
    from kvsim.planning.capacity import default_requests
    from kvsim.planning.deploy import tokens_per_request

    scenario = scenario_from_toml(toml_text, source, Path(base_dir))
    return tokens_per_request(scenario, default_requests(scenario))
