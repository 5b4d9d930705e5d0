"""Fitting the step-time model's coefficients to observations, and judging the fit on data it did not see.

The fit is a robust least squares on log error (`scipy.optimize.least_squares`, soft-L1 loss, so a
few odd measurements do not drag the rest). Only coefficients the observations can move are fitted
(a coefficient whose change moves no prediction keeps its starting value). The fit is judged by
k-fold hold-out (each fold's observations predicted by a fit to the others) and, when the tables hold
shapes marked `heldout`, by those shapes, never fitted: `holdout_errors` returns one relative error
per observation, `slice_table` groups them by phase, batch band and tensor-parallel size.

Coefficients named `per_table` take one value per table (`Observation.table`): tables profiled on
different machines share what the GPU does but not what their host does (a CUDA-graph replay's
launch, an eager step's Python). The fit's calibration holds the first table's values; `Fit.tables`
the others'.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field, replace

import numpy as np

from kvsim.batch import Batch
from kvsim.calibrate.tables import BATCH_FIELDS, Observation
from kvsim.errors import KvsimError
from kvsim.perf.calibration import COEFFICIENTS, EFFICIENCIES, Calibration, coefficient_bounds
from kvsim.perf.roofline import StepModel, allreduce_seconds
from kvsim.scenario.catalog import GPUS

# Where each coefficient may go: efficiencies in (0, 1], the rest non-negative.
_UPPER = {"quantized_prefill_factor": 50.0, "dequant_flops_per_element": 1e4}
# Where a fit starts a coefficient whose starting value is zero (its usual magnitude).
_TYPICAL = {"prefill_key_s": 1e-8, "decode_key_s": 3e-8, "eager_attention_s": 3e-5, "eager_quantized_s": 3e-5,
            "eager_layer_s": 1e-4,
            "layer_overhead_s": 1e-5, "attention_floor_s": 5e-6, "per_seq_overhead_s": 1e-5,
            "graph_step_overhead_s": 5e-4, "step_overhead_s": 2e-3, "allreduce_latency_s": 2e-5,
            "dequant_flops_per_element": 2.0, "quantized_prefill_factor": 1.0, "quantized_prefill_token_s": 3e-8}
MAX_HOLDOUT_ERROR = 0.10  # refuse a fit whose hold-out median |error| is above this (see check_fit)


@dataclass(slots=True)
class Fit:
    calibration: Calibration
    free: list[str]  # the coefficients fitted; the others kept their starting values
    cost: float
    nfev: int
    tables: dict = field(default_factory=dict)  # table -> {per-table coefficient: value}, tables after the first


class Pricer:
    """Prices observations under one calibration (step models cached per shape of work)."""

    def __init__(self, calibration: Calibration):
        self.calibration = calibration
        self._models: dict[tuple, StepModel] = {}
        self._serving: dict[str, dict] = {}

    def step_model(self, o: Observation) -> StepModel:
        key = (o.model, o.gpu, o.tp, o.kv_cache_dtype, o.graph_batch, o.max_model_len)
        sm = self._models.get(key)
        if sm is None:
            graphs = (o.graph_batch,) if o.graph_batch else ()
            sm = StepModel(o.model, GPUS[o.gpu], o.tp, o.kv_cache_dtype, self.calibration, 16, graphs, o.max_model_len)
            self._models[key] = sm
        return sm

    def price(self, o: Observation) -> float:
        if o.kind == "step":
            return self.step_model(o).step_time(Batch(**dict(zip(BATCH_FIELDS, o.counts))))
        if o.kind == "gemm":
            return self.step_model(o).layer_gemm_time(o.counts[0])
        if o.kind == "elementwise":
            return self.step_model(o).layer_small_kernels_time(o.counts[0])
        if o.kind == "allreduce":
            return allreduce_seconds(o.counts[0], o.tp, GPUS[o.gpu], self.calibration)
        if o.kind == "serving":
            return self._serving_figure(o)
        raise ValueError(f"unknown observation kind {o.kind}")

    def _serving_figure(self, o: Observation) -> float:
        scenario_path, policy, keys = o.serving
        summary = self._serving.get((scenario_path, policy))
        if summary is None:
            summary = simulate_with(scenario_path, policy, self.calibration)
            self._serving[(scenario_path, policy)] = summary
        value = summary
        for k in keys:
            value = value[k]
        return float(value)


def simulate_with(scenario_path: str, policy: str, calibration: Calibration) -> dict:
    """The analytic summary of one policy of a scenario priced by the roofline under `calibration`. The fit
    reads no time series, so it gets one bucket for the whole run: a trial calibration with hour-long steps
    would otherwise cost the simulation a sample per bucket its decode runs cross (seconds per trial)."""
    from kvsim.perf.calibration import write_calibration
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import load_scenario
    from kvsim.scenario.limits import MAX_DURATION_S

    with tempfile.TemporaryDirectory(prefix="kvsim-cal-") as folder:
        path = os.path.join(folder, "calibration.json")
        write_calibration(path, calibration)
        sc = load_scenario(scenario_path)
        # the coefficients fitted are the roofline's: price with it whatever the scenario asks
        backend = sc.backend.model_copy(update={"name": "analytic", "calibration": path, "pricing": "roofline",
                                                "kernel_tables": None})
        engine = sc.engine.model_copy(update={"vllm_version": None})
        output = sc.output.model_copy(update={"timeseries_interval_s": MAX_DURATION_S})
        sc = sc.model_copy(update={"backend": backend, "engine": engine, "output": output})
        return run_scenario(sc, None, [policy], write=False).summaries[policy]


def log_errors(observations: list[Observation], calibration: Calibration, tables: dict | None = None) -> np.ndarray:
    """log(predicted / measured) per observation; an observation of a table in `tables` is priced with
    that table's coefficients (a Fit's `tables`)."""
    pricers = {t: Pricer(replace(calibration, **values)) for t, values in (tables or {}).items()}
    default = Pricer(calibration)
    return np.array([math.log(max(pricers.get(o.table, default).price(o), 1e-12) / o.measured)
                     for o in observations])


def _bounds(names: list[str]) -> tuple[list[float], list[float]]:
    """The bounds a calibration file may hold (a fit outside them could not be read back), tighter where
    _UPPER says."""
    lo = [coefficient_bounds(n)[0] for n in names]
    hi = [min(coefficient_bounds(n)[1], _UPPER.get(n, np.inf)) for n in names]
    return lo, hi


def _start(start: Calibration, names: list[str]) -> list[float]:
    """Starting values inside the bounds (a zero start would stall a coefficient that the data wants)."""
    lo, hi = _bounds(names)
    out = []
    for n, a, b in zip(names, lo, hi):
        x = getattr(start, n)
        if x <= a:
            x = max(_TYPICAL.get(n, 0.0), a + 1e-3)
        out.append(min(x, b))
    return out


def identifiable(observations: list[Observation], start: Calibration, candidates=COEFFICIENTS) -> list[str]:
    """The coefficients whose change (x1.5, or from zero to a small value) moves some prediction."""
    base = log_errors(observations, start)
    out = []
    for name in candidates:
        x = getattr(start, name)
        probe = min(x * 1.5, 1.0) if name in EFFICIENCIES else (x * 1.5 if x > 0 else 100 * _TYPICAL.get(name, 1e-4))
        if name in EFFICIENCIES and probe == x:
            probe = x * 0.67
        moved = log_errors(observations, replace(start, **{name: probe}))
        if np.max(np.abs(moved - base)) > 1e-6:
            out.append(name)
    return out


def table_order(observations: list[Observation]) -> list[str]:
    """The tables of the observations in their first appearance's order."""
    return list(dict.fromkeys(o.table for o in observations))


def fit(observations: list[Observation], start: Calibration = Calibration(), free=None, per_table=()) -> Fit:
    """Least-squares fit of the `free` coefficients (default: the identifiable ones) on log error; those
    also in `per_table` get one value per table (the first table's go into the calibration)."""
    if not observations:
        raise KvsimError("no observations to fit")
    names = list(free) if free is not None else identifiable(observations, start)
    if not names:
        raise KvsimError("no coefficient of the step model moves these observations' predictions")
    local = [n for n in names if n in per_table]
    others = table_order(observations)[1:] if local else []
    params = names + local * len(others)

    def unpack(x):
        values = dict(zip(names, map(float, x)))
        rest = iter(map(float, x[len(names):]))
        tables = {t: {n: next(rest) for n in local} for t in others}
        return replace(start, **values), tables

    def residuals(x):
        return log_errors(observations, *unpack(x))

    res = _least_squares(residuals, _start(start, params), _bounds(params))
    calibration, tables = unpack(res.x)
    return Fit(calibration, names, float(res.cost), int(res.nfev), tables)


def _least_squares(residuals, x0, bounds):
    from scipy.optimize import least_squares

    return least_squares(residuals, x0, bounds=bounds, loss="soft_l1", f_scale=0.05, x_scale="jac",
                         diff_step=1e-3, max_nfev=400)


def folds(observations: list[Observation], k: int, seed: int = 0) -> list[int]:
    """A fold index per observation; observations of one group (a serving run) share a fold, unless
    there are fewer groups than folds (one serving run: its figures are held out one fold at a time)."""
    key = [o.group or o.source for o in observations]
    if len(set(key)) < k:
        key = [o.source for o in observations]
    groups = sorted(set(key))
    order = np.random.default_rng(seed).permutation(len(groups))
    fold_of = {groups[g]: i % k for i, g in enumerate(order)}
    return [fold_of[g] for g in key]


def holdout_errors(observations: list[Observation], start: Calibration, free: list[str], k: int = 5,
                   seed: int = 0, per_table=()) -> np.ndarray:
    """Relative error (predicted / measured - 1) of each observation, predicted by a fit that never saw
    it: observations of grid 'heldout' by the fit to all the others, the rest by k-fold."""
    train = [i for i, o in enumerate(observations) if o.grid != "heldout"]
    test = [i for i, o in enumerate(observations) if o.grid == "heldout"]
    errors = np.full(len(observations), np.nan)
    fold = folds([observations[i] for i in train], k, seed)
    for f in range(k):
        fit_idx = [i for i, g in zip(train, fold) if g != f]
        out_idx = [i for i, g in zip(train, fold) if g == f]
        if not out_idx or not fit_idx:
            continue
        f = fit([observations[i] for i in fit_idx], start, free, per_table)
        errors[out_idx] = np.expm1(log_errors([observations[i] for i in out_idx], f.calibration, f.tables))
    if test:
        f = fit([observations[i] for i in train], start, free, per_table)
        errors[test] = np.expm1(log_errors([observations[i] for i in test], f.calibration, f.tables))
    return errors


def slice_key(o: Observation) -> tuple:
    return (o.phase, o.band, o.tp)


def slice_table(observations: list[Observation], errors: np.ndarray) -> list[dict]:
    """Per slice (phase, band, tp) and per phase: count, median |error|, median error (bias), worst."""
    groups: dict[tuple, list[float]] = {}
    for o, e in zip(observations, errors):
        if not math.isnan(e):
            groups.setdefault(slice_key(o), []).append(float(e))
            groups.setdefault((o.phase, "all", "all"), []).append(float(e))
    rows = []
    for key in sorted(groups, key=lambda k: tuple(map(str, k))):
        errs = groups[key]
        rows.append({"phase": key[0], "band": key[1], "tp": key[2], "n": len(errs),
                     "median_abs_error": statistics.median(map(abs, errs)), "bias": statistics.median(errs),
                     "max_abs_error": max(map(abs, errs))})
    return rows


def check_fit(errors: np.ndarray, rows: list[dict], max_error: float = MAX_HOLDOUT_ERROR,
              min_slice: int = 10) -> str | None:
    """Why the fit is refused, or None. Refused when the hold-out median |error| over all observations
    exceeds max_error, or that of any phase, or of any slice of at least min_slice observations,
    exceeds twice max_error."""
    errs = np.abs(errors[~np.isnan(errors)])
    if errs.size == 0:
        return "no observation could be held out (too few to fit without them)"
    overall = float(np.median(errs))
    if overall > max_error:
        return f"hold-out median |error| {overall:.1%} is above {max_error:.0%}"
    for r in rows:
        if (r["band"] == "all" or r["n"] >= min_slice) and r["median_abs_error"] > 2 * max_error:
            what = f"phase {r['phase']}" if r["band"] == "all" else f"slice {r['phase']}/{r['band']}/tp{r['tp']}"
            return f"hold-out median |error| of {what} ({r['n']} observations) is {r['median_abs_error']:.1%}, " \
                   f"above {2 * max_error:.0%}"
    return None


def provenance(fitted: Fit, start_provenance: dict, sources: list[str], n: int) -> dict:
    """Where each coefficient of a fit comes from."""
    out = {}
    local = {k for values in fitted.tables.values() for k in values}
    for name in COEFFICIENTS:
        if name in local:
            out[name] = (f"fitted by kvsim calibrate to {n} observations from {', '.join(sources)}, one value per "
                         f"table: this is {sources[0]}'s (the others' are under fit.per_table)")
        elif name in fitted.free:
            out[name] = f"fitted by kvsim calibrate to {n} observations from {', '.join(sources)}"
        else:
            out[name] = start_provenance.get(name, "kvsim's built-in default (not fitted: the tables do not move it)")
    return out
