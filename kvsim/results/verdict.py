"""Does a run meet its SLO, by how much, and what binds? One judgement for every table and page.

`judge(summary)` reads a policy's summary (as written to summary.json) and returns a `Verdict`:

- **meets the SLO**: at the SLO's percentile P, every bounded figure (`summary["slo"]["at_percentile"]`:
  TTFT, TPOT and E2E by nearest rank over all requests received, rejected ones infinitely late;
  token-level ITL from its histogram) is within its bound, and at least P% of the requests were
  served. The margin of a bound is `1 - figure / bound` (0.25: 25% to spare; negative: over).
- **stable**: the engine kept up with the arrivals: when the last request arrived, at most
  `STABILITY_TOLERANCE` (5%) of the requests received were still waiting to be scheduled for the
  first time. A queue that grows over the arrival window leaves far more than that.
- **sustainable** (what `kvsim plan` searches for): meets the SLO and stable.
- **binding constraint**: what held the engine back. When requests were rejected (they can never
  run: longer than `max_model_len`, or more KV blocks than the cache holds) and so few were served
  that the SLO cannot be met at its percentile, the rejections bind: `max_model_len` or `kv_cache`,
  whichever rejected more. Otherwise, when the figure with the least margin is a
  pace of decoding (TPOT or token ITL) and the engine kept up, admission limits only delay first
  tokens: preemptions mean the KV cache binds, else the engine's own step time (`step_time`:
  compute or HBM bandwidth). Otherwise waiting requests are held back by one limit at a time
  (`Scheduler.admission_limit`) and the summary adds up for how long (`admission_blocked_s`,
  replica-seconds): when some limit held requests back for at least 1% of the replica time, the one
  that held them longest binds (`kv_cache`, `max_num_seqs` or `token_budget`); else preemptions
  mean the KV cache binds; else it is the step time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

STABILITY_TOLERANCE = 0.05  # share of requests still unscheduled at the last arrival
BLOCKED_SHARE = 0.01  # share of replica time a limit must hold requests back to bind
LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E"}
BINDING_NAMES = {
    "kv_cache": "KV cache",
    "max_num_seqs": "max_num_seqs",
    "token_budget": "token budget (max_num_batched_tokens)",
    "step_time": "step time (compute/bandwidth)",
    "max_model_len": "max_model_len (requests too long are rejected)",
    "compute": "compute (step time)",  # named by kvsim plan's what-if at the knee
    "bandwidth": "HBM bandwidth (step time)",
}


def percentile_label(q: float) -> str:
    return f"p{q:g}"


@dataclass(frozen=True, slots=True)
class Check:
    """One bound of the SLO against its figure at the percentile (milliseconds)."""

    key: str  # ttft_ms, tpot_ms, itl_ms, e2e_ms
    label: str  # e.g. "TTFT p99"
    bound: float
    value: Optional[float]  # None: beyond every finite value (too many requests rejected)
    met: bool

    @property
    def margin(self) -> Optional[float]:
        """1 - value / bound: the share of the bound to spare (negative when over); None when unbounded."""
        return None if self.value is None else 1.0 - self.value / self.bound

    def text(self) -> str:
        value = "∞" if self.value is None else f"{self.value:,.0f}"
        return f"{self.label} {value} {'≤' if self.met else '>'} {self.bound:,.0f} ms"


@dataclass(frozen=True, slots=True)
class Verdict:
    met: bool  # every bound met at the percentile and enough requests served
    stable: bool
    percentile: float
    checks: tuple[Check, ...]
    served_fraction: Optional[float]
    backlog_fraction: Optional[float]
    binding: str  # kv_cache, max_num_seqs, token_budget or step_time
    binding_detail: str

    @property
    def sustainable(self) -> bool:
        return self.met and self.stable

    @property
    def margin(self) -> Optional[float]:
        """The smallest margin over the bounds (None: a figure is unbounded, or there is no bound)."""
        margins = [c.margin for c in self.checks]
        if not margins or any(m is None for m in margins):
            return None
        return min(margins)

    @property
    def worst(self) -> Optional[Check]:
        """The bound with the least to spare (the one that fails first)."""
        if not self.checks:
            return None
        return min(self.checks, key=lambda c: -float("inf") if c.margin is None else c.margin)

    def summary_text(self) -> str:
        """One line: met or not, by how much, and against which figure."""
        q = self.percentile
        if not self.stable:
            head = f"unstable (backlog {self.backlog_fraction:.0%} of requests at the last arrival)"
        elif self.met:
            head = "meets the SLO"
        else:
            head = "misses the SLO"
        worst = self.worst
        parts = [head]
        if worst is not None:
            margin = worst.margin
            how = ("unbounded" if margin is None else
                   f"{margin:.0%} to spare" if margin >= 0 else f"{-margin:.0%} over")
            parts.append(f"{worst.text()} ({how})")
        served = self.served_fraction
        if served is not None and served < q / 100.0:
            parts.append(f"only {served:.1%} of requests served (SLO: {q:g}%)")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["checks"] = [{**asdict(c), "margin": c.margin} for c in self.checks]
        out.update(sustainable=self.sustainable, margin=self.margin)
        return out


def checks(summary: dict) -> tuple[Check, ...]:
    """The SLO's bounds against the summary's figures at its percentile."""
    slo = summary.get("slo") or {}
    q = slo.get("percentile", 99.0)
    out = []
    for key, bound in (slo.get("bounds") or {}).items():
        if bound is None:
            continue
        value = (slo.get("at_percentile") or {}).get(key)
        out.append(Check(key, f"{LABELS.get(key, key)} {percentile_label(q)}", float(bound), value,
                         value is not None and value <= bound))
    return tuple(out)


def rejection_binding(summary: dict) -> tuple[str, str] | None:
    """(name, evidence) when rejections alone keep the SLO from being met, else None."""
    req = summary.get("requests") or {}
    rejected, received = req.get("rejected") or 0, req.get("received") or 0
    slo = summary.get("slo") or {}
    q = float(slo.get("percentile", 99.0))
    if not rejected or not received or (received - rejected) / received >= q / 100.0 - 1e-12:
        return None
    by_kind: dict[str, int] = {}
    for reason, n in (req.get("rejected_by_reason") or {}).items():
        kind = "max_model_len" if "max_model_len" in reason else "kv_cache" if "KV blocks" in reason else "other"
        by_kind[kind] = by_kind.get(kind, 0) + n
    name = max(sorted(by_kind), key=by_kind.get) if by_kind else "max_model_len"
    name = "max_model_len" if name == "other" else name
    example = next((r for r in sorted(req.get("rejected_by_reason") or {}) if
                    (name == "max_model_len") == ("max_model_len" in r)), "")
    held = (f"{rejected:,} of {received:,} requests rejected ({rejected / received:.1%}), so at most "
            f"{(received - rejected) / received:.1%} can be served against the SLO's {q:g}%"
            + (f"; e.g. {example}" if example else ""))
    why = ("raise engine.max_model_len or cut the longest requests" if name == "max_model_len"
           else "a bigger KV cache (more memory, fp8 KV or a higher tensor_parallel_size)")
    return name, f"{BINDING_NAMES.get(name, name)}: {held} ({why})"


def binding_constraint(summary: dict, pace: bool = False) -> tuple[str, str]:
    """(name, one-line evidence) of the limit that held the engine back; `pace`: the tightest SLO
    figure is a decoding pace (TPOT, ITL) and the engine kept up. See the module docstring."""
    rejections = rejection_binding(summary)
    if rejections is not None:
        return rejections
    replicas = summary.get("num_replicas") or 1
    span = (summary.get("duration_s") or 0.0) * replicas
    blocked = summary.get("admission_blocked_s") or {}
    kv_peak = (summary.get("kv") or {}).get("peak_used_fraction")
    max_seqs = summary.get("max_num_seqs")
    running = summary.get("peak_running", 0)
    preemptions = summary.get("preemptions", 0)
    context = [f"peak running {running}" + (f" of {max_seqs * replicas}" if max_seqs else "")]
    if kv_peak is not None:
        context.append(f"KV peak {kv_peak:.0%}")
    if preemptions:
        context.append(f"{preemptions} preemptions")
    shares = {k: v / span for k, v in blocked.items() if span > 0}
    if pace and preemptions:
        name, held = "kv_cache", "preemptions slow the decoding pace, the tightest figure"
    elif pace:
        name, held = "step_time", "the decoding pace, the tightest figure, is the engine's step time"
    elif shares and max(shares.values()) >= BLOCKED_SHARE:
        name = max(sorted(shares), key=shares.get)
        held = f"held waiting requests back {shares[name]:.0%} of the time"
    elif preemptions:
        name, held = "kv_cache", "preempted running requests"
    else:
        name, held = "step_time", "nothing held admission back: latency is the engine's step time"
    return name, f"{BINDING_NAMES.get(name, name)}: {held} ({', '.join(context)})"


def judge(summary: dict, stability_tolerance: float = STABILITY_TOLERANCE) -> Verdict:
    """The verdict on one policy's summary; see the module docstring."""
    slo = summary.get("slo") or {}
    q = float(slo.get("percentile", 99.0))
    cks = checks(summary)
    served = slo.get("served_fraction")
    enough_served = served is not None and served >= q / 100.0 - 1e-12
    backlog = (summary.get("arrivals") or {}).get("backlog_fraction")
    stable = backlog is None or backlog <= stability_tolerance
    worst = min(cks, key=lambda c: -float("inf") if c.margin is None else c.margin, default=None)
    name, detail = binding_constraint(summary, stable and worst is not None and worst.key in ("tpot_ms", "itl_ms"))
    return Verdict(all(c.met for c in cks) and enough_served, stable, q, cks, served, backlog, name, detail)


# A flat record of one policy's run, in CSV column order: the verdict, then the figures.
FIGURES = (
    "sustainable", "slo_met", "stable", "slo_margin", "ttft_ms_at_pct", "tpot_ms_at_pct", "itl_ms_at_pct",
    "e2e_ms_at_pct", "served_fraction", "backlog_fraction", "offered_rps", "throughput_rps",
    "output_tokens_per_s", "input_tokens_per_s", "goodput_rps", "slo_attainment", "ttft_p50_ms", "ttft_p99_ms",
    "tpot_p99_ms", "itl_p99_ms", "e2e_p99_ms", "peak_running", "kv_peak_fraction", "preemptions", "rejected",
    "binding", "binding_detail",
)


# Figures a record carries only when the run has them (an [energy] section, speculative decoding): a
# plan's records and tables without them are as before.
OPTIONAL_FIGURES = ("gpu_joules_per_output_token", "joules_per_output_token", "kwh_per_million_output_tokens",
                    "energy_usd_per_million_output_tokens", "gpu_hour_usd_per_million_output_tokens",
                    "mean_acceptance_length")


def optional_figures(summary: dict) -> dict:
    """OPTIONAL_FIGURES present in the summary (energy per output token and its cost; vLLM's mean
    acceptance length of speculative decoding)."""
    out = {}
    energy = summary.get("energy")
    if energy is not None:
        out.update({k: energy[k] for k in OPTIONAL_FIGURES[:5]})
    spec = summary.get("speculative")
    if spec is not None:
        out["mean_acceptance_length"] = spec["mean_acceptance_length"]
    return out


def _ms(x) -> Optional[float]:
    return None if x is None else x * 1e3


def flat_record(summary: dict) -> dict:
    """The figures of FIGURES from one policy's summary (times in ms): a plan's point, a row of
    `kvsim.run(...).to_frame()`."""
    v = judge(summary)
    slo = summary["slo"]["at_percentile"]
    thr = summary["throughput"]
    duration, finished = summary["duration_s"], summary["requests"]["finished"]
    input_tps = None
    if thr["total_tokens_per_s"] is not None and thr["output_tokens_per_s"] is not None:
        input_tps = thr["total_tokens_per_s"] - thr["output_tokens_per_s"]
    return {
        "sustainable": v.sustainable, "slo_met": v.met, "stable": v.stable, "slo_margin": v.margin,
        "ttft_ms_at_pct": slo["ttft_ms"], "tpot_ms_at_pct": slo["tpot_ms"], "itl_ms_at_pct": slo["itl_ms"],
        "e2e_ms_at_pct": slo["e2e_ms"], "served_fraction": v.served_fraction, "backlog_fraction": v.backlog_fraction,
        "offered_rps": summary["arrivals"]["offered_rps"], "throughput_rps": thr["requests_per_s"],
        "output_tokens_per_s": thr["output_tokens_per_s"], "input_tokens_per_s": input_tps,
        "goodput_rps": summary["goodput_rps"], "slo_attainment": summary["slo_attainment"],
        "ttft_p50_ms": _ms(summary["ttft_s"]["p50"]), "ttft_p99_ms": _ms(summary["ttft_s"]["p99"]),
        "tpot_p99_ms": _ms(summary["tpot_s"]["p99"]), "itl_p99_ms": _ms(summary["itl_s"]["p99"]),
        "e2e_p99_ms": _ms(summary["e2e_s"]["p99"]), "peak_running": summary["peak_running"],
        "kv_peak_fraction": summary["kv"]["peak_used_fraction"], "preemptions": summary["preemptions"],
        "rejected": summary["requests"]["rejected"], "binding": v.binding, "binding_detail": v.binding_detail,
        "_prompt_tokens_per_request": (input_tps * duration / finished) if input_tps is not None and finished else None,
        **optional_figures(summary),
    }


def summary_frame(summaries: dict[str, dict]):
    """A pandas DataFrame, a row per policy: `policy` and the figures of FIGURES."""
    import pandas as pd

    return pd.DataFrame([{"policy": name, **{k: flat_record(s)[k] for k in FIGURES}}
                         for name, s in summaries.items()], columns=["policy", *FIGURES])
