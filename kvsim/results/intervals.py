"""Error bars: how far real runs like this one fell from kvsim's predictions, looked up for any figure.

`prediction_intervals.json` (beside this module; written by `python benchmarks/serving_groundtruth.py
intervals` from the validation residuals, with its provenance) holds, per pricing basis ("measured":
kernels timed on the GPU; "estimated": the basis kvsim labels so), load band and metric (TTFT, TPOT, ITL,
E2E; central figures, mean and median, apart from tail ones, p90 and p99), the range in which the real
figure fell relative to kvsim's prediction on runs held out of every fit: `real / predicted - 1`, the
10th to 90th percentile of the residuals where there are ten or more, else their least and greatest.

`interval(metric, stat, basis, band)` looks one up (a band or stat without residuals of its own takes the
metric's pooled row, and says so); `load_band(...)` says which band a run is in; `unlike(...)` how a run
differs from the held-out runs (the table's "domain": their GPU, dense 16-bit models, TP range, one engine),
so that a range is not claimed for runs unlike them; every surface (the terminal, summary.json, `plan`, the
report, the dashboard) asks this module and shows `Interval.text()`: "-12 to +9% on 24 held-out runs like
this", or "-12 to +9% on 24 held-out runs (dense 16-bit Llama-2 ... on H100-SXM ...); this run differs (MoE,
H200-SXM): its error may be larger".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

DATA = Path(__file__).with_name("prediction_intervals.json")
BANDS = ("light", "busy")
BUSY = 0.5  # a run whose sequences or KV blocks fill half their limit on average is "busy"
STAT_GROUP = {"mean": "central", "p50": "central", "p90": "tail", "p95": "tail", "p99": "tail"}
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True, slots=True)
class Interval:
    """Where the real figure fell relative to the prediction on held-out runs like this: real is in
    [predicted x (1 + low), predicted x (1 + high)] for the share of runs the table states."""

    low: float
    high: float
    n: int  # held-out runs (load stages) behind it
    metric: str
    stat: str
    basis: str
    band: str
    pooled: bool = False  # no residuals of this band or stat: the metric's over every band and stat
    unlike: tuple[str, ...] = ()  # how the run differs from the held-out runs (`unlike`)

    def bounds(self, predicted: float) -> tuple[float, float]:
        return predicted * (1 + self.low), predicted * (1 + self.high)

    def text(self, brief: bool = False) -> str:
        """`brief`: without what the held-out runs were and how this run differs (said once elsewhere)."""
        span = f"{self.low * 100:+.0f} to {self.high * 100:+.0f}%"  # no ellipsis: a piped line is never cut
        if self.unlike:
            which = ([f"{self.basis}, any load"] if self.pooled else []) + ([] if brief else [runs_text()])
            return (f"{span} on {self.n} held-out runs" + (f" ({'; '.join(which)})" if which else "")
                    + ("" if brief else unlike_text(self.unlike)))
        like = "runs like this" if not self.pooled else f"runs ({self.basis}, any load)"
        return f"{span} on {self.n} held-out {like}"

    def to_dict(self) -> dict:
        return {"low": round(self.low, 4), "high": round(self.high, 4), "n": self.n, "pooled": self.pooled}


@lru_cache(maxsize=1)
def table() -> dict:
    """The shipped residual table (`{}` when missing: no intervals are stated)."""
    try:
        return json.loads(DATA.read_text())
    except (OSError, ValueError):
        return {}


def provenance() -> str:
    return table().get("provenance", "")


def runs_text() -> str:
    """What the held-out runs were, e.g. 'dense 16-bit Llama-2 7B-70B on H100-SXM, TP 1-4, one engine'."""
    return (table().get("domain") or {}).get("runs", "")


def unlike_text(unlike) -> str:
    """'; this run differs (MoE, H200-SXM): its error may be larger', '' for a run like the held-out ones."""
    return f"; this run differs ({', '.join(unlike)}): its error may be larger" if unlike else ""


def unlike(model, gpu: str, tp: int, disaggregated: bool = False) -> tuple[str, ...]:
    """How a run (its kvsim.scenario.models.ModelSpec, GPU name, tensor parallelism, pools) differs from the
    held-out runs behind the table (its "domain"); () when like them or when the table names no domain."""
    dom = table().get("domain")
    if not dom:
        return ()
    out = [] if gpu in dom["gpus"] else [gpu]
    out += [name for name, on in (("MoE", model.moe), ("MLA", model.mla),
                                  ("windowed attention", model.sliding_window or model.attention_chunk_size)) if on]
    weights = model.quantization or (model.dtype if model.dtype not in dom["weights"] else "")
    if weights:
        out.append(f"{weights} weights")
    low, high = dom["tensor_parallel"]
    if not low <= tp <= high:
        out.append(f"TP {tp}")
    if disaggregated:
        out.append("disaggregated prefill and decode")
    return tuple(out)


def load_band(occupancy: float, kv_fraction: float = 0.0) -> str:
    """'busy' when the running sequences (a share of max_num_seqs) or the KV cache in use average half
    their limit or more, else 'light'."""
    return "busy" if max(occupancy, kv_fraction) >= BUSY else "light"


def summary_band(summary: dict, max_num_seqs: int, replicas: int = 1) -> str:
    """The load band of a policy's summary (summary.json): Little's law for the mean running sequences
    (finished requests a second x mean E2E), and the KV cache's mean use."""
    rps = (summary.get("throughput") or {}).get("requests_per_s") or 0.0
    e2e = (summary.get("e2e_s") or {}).get("mean") or 0.0
    kv = (summary.get("kv") or {}).get("mean_used_fraction") or 0.0
    verdict = summary.get("verdict") or {}
    if verdict and not verdict.get("stable", True):
        return "busy"
    return load_band(rps * e2e / max(1, max_num_seqs * replicas), kv)


def interval(metric: str, stat: str, basis: str, band: str) -> Optional[Interval]:
    """The interval of `metric` (ttft, tpot, itl, e2e) at `stat` (mean, p50, p90, p95, p99) for runs of
    `basis` ("measured" or "estimated") in `band`; None when the table holds nothing for the metric."""
    rows = table().get("intervals", {}).get(basis, {})
    group = STAT_GROUP.get(stat)
    cell = rows.get(band, {}).get(metric, {}).get(group)
    if cell:
        return Interval(cell["low"], cell["high"], cell["runs"], metric, stat, basis, band)
    pooled = rows.get("any", {}).get(metric, {}).get("any")
    if pooled:
        return Interval(pooled["low"], pooled["high"], pooled["runs"], metric, stat, basis, band, pooled=True)
    return None


def figure_intervals(basis: str, band: str, stats=("mean", "p50", "p90", "p99")) -> dict:
    """summary.json's "prediction_intervals" for one policy: {metric_s: {stat: interval dict}}."""
    out = {}
    for metric in METRICS:
        cells = {s: iv.to_dict() for s in stats if (iv := interval(metric, s, basis, band)) is not None}
        if cells:
            out[f"{metric}_s"] = cells
    return out


def residual_interval(errors: list[float], runs: int) -> dict:
    """A table cell from predicted / real - 1 errors of `runs` held-out runs: where real / predicted - 1
    fell (module docstring)."""
    import numpy as np

    real = np.array([1.0 / (1.0 + e) - 1.0 for e in errors])
    if len(real) >= 10:
        low, high = np.percentile(real, 10), np.percentile(real, 90)
    else:
        low, high = real.min(), real.max()
    return {"low": round(float(low), 4), "high": round(float(high), 4), "figures": len(real), "runs": runs}


def basis_key(basis: Optional[dict]) -> Optional[str]:
    """The residual table's basis for a run's pricing basis (kvsim.perf.basis.PricingBasis.to_dict()):
    "measured" for steps priced from kernels timed on the GPU (what the measured residuals are of),
    "estimated" for any other analytic pricing (a roofline, a datasheet, another GPU's calibration), None
    for a backend that runs the steps on the device (its figures are timed, not predicted)."""
    if not basis or basis.get("pricing") not in ("measured", "roofline"):
        return None
    return "measured" if basis["pricing"] == "measured" and basis.get("label") == "measured" else "estimated"


def summary_intervals(summary: dict, basis: Optional[dict], max_num_seqs: int, replicas: int = 1,
                      differs: tuple[str, ...] = ()) -> Optional[dict]:
    """A policy's "prediction_intervals" for summary.json: its band and basis, and per metric and stat the
    range the real figure fell in on held-out runs like it (None: no table, or a timed backend); `differs`
    (`unlike`): how the run differs from those runs, stated beside them ("unlike")."""
    key = basis_key(basis)
    if key is None or not table():
        return None
    band = summary_band(summary, max_num_seqs, replicas)
    out = {"basis": key, "band": band, "source": "kvsim/results/prediction_intervals.json",
           "figures": figure_intervals(key, band)}
    if differs:
        out["heldout_runs"], out["unlike"] = runs_text(), list(differs)
    return out


def figure_text(summary: dict, metric: str, stat: str, brief: bool = False) -> Optional[str]:
    """e.g. 'TTFT p99 180 ms, -12 to +9% on 24 held-out runs like this' from a summary that has intervals
    (`brief`: Interval.text's)."""
    iv = ((summary.get("prediction_intervals") or {}).get("figures") or {}).get(f"{metric}_s", {}).get(stat)
    value = (summary.get(f"{metric}_s") or {}).get(stat)
    if iv is None or value is None:
        return None
    label = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}[metric]
    unit, scale = ("s", 1.0) if metric == "e2e" else ("ms", 1e3)
    pi = summary["prediction_intervals"]
    text = Interval(iv["low"], iv["high"], iv["n"], metric, stat, pi["basis"], pi["band"], iv["pooled"],
                    tuple(pi.get("unlike", ()))).text(brief)
    shown = value * scale
    return f"{label} {stat} {f'{shown:,.0f}' if shown >= 1000 else f'{shown:.3g}'} {unit}, {text}"


def rate_interval(safe: float, k0: float, fast: float, slow: float, basis: Optional[dict],
                  margin: float, differs: tuple[str, ...] = ()) -> Optional[dict]:
    """Where the real safe rate would fall given how far real steps fell from kvsim's near the knee
    (TPOT, busy load, held out): the knee's elasticity to the step price comes from the plan's own
    re-searches with every step `margin` cheaper (knee `fast`) and dearer (`slow`) than at k0; `differs`
    (`unlike`): how the plan's runs differ from the held-out ones ("like": False, said in the text)."""
    import math

    key = basis_key(basis)
    iv = interval("tpot", "mean", key, "busy") if key else None
    if iv is None or not (safe > 0 and k0 > 0 and fast > 0 and slow > 0):
        return None
    e_slow = math.log(slow / k0) / math.log(1 + margin)  # knee change per unit log step price (<= 0)
    e_fast = math.log(fast / k0) / math.log(1 - margin)
    low = safe * (1 + iv.high) ** e_slow if iv.high > 0 else safe * (1 + iv.high) ** e_fast
    high = safe * (1 + iv.low) ** e_fast if iv.low < 0 else safe * (1 + iv.low) ** e_slow
    low, high = min(low, high), max(low, high)
    like = "like this" if not differs else f"({runs_text()})"
    return {"low": low, "high": high, "step_time": iv.to_dict(), "like": not differs,
            "text": f"{(low / safe - 1) * 100:+.0f} to {(high / safe - 1) * 100:+.0f}%: real steps "
                    f"{iv.low * 100:+.0f} to {iv.high * 100:+.0f}% of kvsim's on {iv.n} held-out runs {like} "
                    f"({iv.basis} pricing, {iv.band} load){unlike_text(differs)}"}


def real_runs_words(iv: dict) -> str:
    """How a plan line or card introduces a safe rate's range: 'on real runs like this', or, for a run
    unlike the held-out ones, 'by the held-out real runs'."""
    return "on real runs like this" if iv.get("like", True) else "by the held-out real runs"
