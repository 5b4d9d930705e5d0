"""The headline figures of a policy's run, shared by the terminal table, the HTML table, the bar
charts and the dashboard: each names where it lives in a summary, its unit and whether the SLO
judges it."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.results.metrics import SLO_KEYS
from kvsim.results.verdict import LABELS, percentile_label


@dataclass(frozen=True, slots=True)
class _Figure:
    label: str
    path: tuple[str, ...]  # keys into a policy's summary
    scale: float = 1.0
    digits: int = 1
    unbounded: bool = False  # None means "beyond every finite value" (an SLO figure: too many rejected)
    slo_key: str = ""  # the SLO bound it is judged against (ttft_ms, ...), if any
    latency: bool = False  # a latency: drawn on a log axis (a few slow policies squash the rest)

    def value(self, summary: dict):
        x = summary
        for key in self.path:
            if not isinstance(x, dict) or x.get(key) is None:
                return None
            x = x[key]
        return x * self.scale

    def text(self, summary: dict) -> str:
        v = self.value(summary)
        if v is None:
            return "∞" if self.unbounded and (summary.get("requests") or {}).get("received") else "–"
        return f"{v:,.{self.digits}f}"


HEAD_FIGURES = (
    _Figure("completed req/s", ("throughput", "requests_per_s"), digits=2),  # finished / the whole run (drain too)
    _Figure("out tok/s", ("throughput", "output_tokens_per_s"), digits=0),
    _Figure("goodput req/s", ("goodput_rps",), digits=2),
    _Figure("SLO attain %", ("slo_attainment",), 100.0),
    _Figure("TTFT p50 ms", ("ttft_s", "p50"), 1e3, latency=True),
)
TAIL_FIGURES = (
    _Figure("ITL p99 ms", ("itl_s", "p99"), 1e3, latency=True),
    _Figure("E2E p99 s", ("e2e_s", "p99"), digits=2, latency=True),
    _Figure("peak KV %", ("kv", "peak_used_fraction"), 100.0),
    _Figure("preemptions", ("preemptions",), digits=0),
    _Figure("prefix hit %", ("prefix_hit_rate",), 100.0),
)
FIGURES = HEAD_FIGURES + TAIL_FIGURES  # and, between them, the SLO's figures (slo_figures)
BAR_EXCLUDED = ("E2E p99 s", "prefix hit %", "SLO attain %")


def slo_figures(summaries: dict[str, dict]) -> tuple[_Figure, ...]:
    """The figures the SLO judges, at its percentile (ms), labelled with their bounds; TTFT and
    TPOT at p99 when the SLO bounds neither."""
    first = next(iter(summaries.values()), {})
    slo = first.get("slo") or {}
    q, bounds = slo.get("percentile", 99.0), slo.get("bounds") or {}
    keys = [k for k in SLO_KEYS if bounds.get(k) is not None] or ["ttft_ms", "tpot_ms"]
    return tuple(_Figure(f"{LABELS[k]} {percentile_label(q)} ms" + (f" (≤{bounds[k]:g})" if bounds.get(k) else ""),
                         ("slo", "at_percentile", k), unbounded=True, slo_key=k if bounds.get(k) else "",
                         latency=True) for k in keys)


def table_figures(summaries: dict[str, dict]) -> tuple[_Figure, ...]:
    return HEAD_FIGURES + slo_figures(summaries) + TAIL_FIGURES


def slo_bounds(summaries: dict[str, dict]) -> dict:
    """The SLO's bounds (ms) by key, from the first summary."""
    first = next(iter(summaries.values()), {})
    return dict((first.get("slo") or {}).get("bounds") or {})
