"""Fitting the server terms around the measured kernels to serving runs, and holding experiments out.

The terms (kvsim.perf.server.ServerTerms: the API server on TTFT and E2E, what a step costs beyond its
kernels, ...) move what a whole simulation predicts, so they are fitted by simulating the measured runs
(`ServingCase`s, kvsim.calibrate.serving_runs). To keep that to a few dozen simulations, the fit is a
damped Gauss-Newton on log errors: at the current terms every case is simulated once, and once more per
term with that term nudged (a finite-difference Jacobian of every figure); the robust least squares of
the linearized errors (scipy's soft-L1 loss, so a few tail figures do not drag the rest) gives the next
terms, which are simulated to check that the robust cost fell (else the step is halved). Simulations are
seeded, so the fit is deterministic.

Hold-out (`leave_groups_out`): for each group of cases (an experiment), the terms are refitted on the
other groups' figures, from the all-data terms along the same Jacobian (one Gauss-Newton solve), and
the held-out cases are simulated with them: their errors are predictions of runs the fit never saw.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from kvsim.calibrate.serving_runs import ServingCase, relative_errors, simulate_case
from kvsim.errors import KvsimError

# Where each fittable term may go (seconds), and the nudge its Jacobian column takes.
BOUNDS = {"api_server_s": (0.0, 0.1), "graph_step_overhead_s": (0.0, 0.01), "step_overhead_s": (0.0, 0.02),
          "piecewise_layer_s": (0.0, 5e-4), "host_step_s": (0.0, 0.02),
          "host_per_seq_s": (0.0, 2e-4)}
NUDGE = {"api_server_s": 1e-3, "graph_step_overhead_s": 3e-4, "step_overhead_s": 5e-4,
         "piecewise_layer_s": 1e-5, "host_step_s": 5e-4, "host_per_seq_s": 5e-6}
FIT_METRICS = ("ttft", "tpot", "e2e", "itl")
LOSS_SCALE = 0.05  # soft-L1 knee: log errors beyond ~5% count linearly, not squared


@dataclass(slots=True)
class Point:
    """Every case simulated at one set of terms: figures and whether it fell behind."""

    terms: object
    figures: list  # per case: (metric, stat) -> seconds
    overloaded: list


@dataclass(slots=True)
class TermsFit:
    terms: object  # the fitted ServerTerms
    names: list
    point: Point  # every case at the fitted terms
    iterations: int
    simulations: int
    history: list = field(default_factory=list)  # (terms as a dict, robust cost) per accepted step


def _keys(case: ServingCase) -> list:
    return [k for k in sorted(case.measured) if k[0] in FIT_METRICS and not (k[0] == "itl" and k[1] == "mean")]


def residuals(cases: list, figures: list) -> np.ndarray:
    """log(predicted / measured) of every fitted figure, case by case (a figure kvsim could not state: 0)."""
    out = []
    for case, fig in zip(cases, figures):
        for k in _keys(case):
            p = fig.get(k)
            out.append(math.log(p / case.measured[k]) if p and p > 0 and math.isfinite(p) else 0.0)
    return np.array(out)


def robust_cost(r: np.ndarray) -> float:
    """scipy's soft-L1 cost of log errors `r` at LOSS_SCALE."""
    z = (r / LOSS_SCALE) ** 2
    return float(np.sum(2 * (np.sqrt(1 + z) - 1)) * LOSS_SCALE ** 2 / 2)


def simulate_all(cases: list, terms, max_requests, sims: list) -> Point:
    outs = [simulate_case(c, terms, max_requests) for c in cases]
    sims[0] += len(cases)
    return Point(terms, [o.figures for o in outs], [o.overloaded for o in outs])


def _vector(terms, names) -> np.ndarray:
    return np.array([getattr(terms, n) for n in names], dtype=float)


def _terms(base, names, x) -> object:
    lo = [BOUNDS[n][0] for n in names]
    hi = [BOUNDS[n][1] for n in names]
    return replace(base, **{n: float(min(max(v, a), b)) for n, v, a, b in zip(names, x, lo, hi)})


def jacobian(cases: list, point: Point, names: list, max_requests, sims: list) -> np.ndarray:
    """d log(figure) / d term, by one simulation per term nudged up (down at its upper bound)."""
    r0 = residuals(cases, point.figures)
    cols = []
    for n in names:
        step = NUDGE[n]
        x = getattr(point.terms, n)
        if x + step > BOUNDS[n][1]:
            step = -step
        nudged = simulate_all(cases, replace(point.terms, **{n: x + step}), max_requests, sims)
        cols.append((residuals(cases, nudged.figures) - r0) / step)
    return np.column_stack(cols) if cols else np.zeros((len(r0), 0))


def solve_linear(r0: np.ndarray, J: np.ndarray, x0: np.ndarray, names: list, rows=None) -> np.ndarray:
    """The terms minimizing the robust cost of r0 + J (x - x0) (over `rows`, default all), within BOUNDS."""
    from scipy.optimize import least_squares

    if rows is not None:
        r0, J = r0[rows], J[rows]
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    scale = np.array([NUDGE[n] for n in names])
    # start a tenth of a nudge inside the bounds: trf stalls on its first step from a bound
    start = np.clip(x0, lo + 0.1 * scale, hi - 0.1 * scale)
    res = least_squares(lambda u: r0 + J @ (start + u * scale - x0), np.zeros(len(names)),
                        bounds=((lo - start) / scale, (hi - start) / scale), loss="soft_l1", f_scale=LOSS_SCALE,
                        method="trf", ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=500)
    return np.clip(start + res.x * scale, lo, hi)


def fit_terms(cases: list, start, names: list, max_requests=None, iterations: int = 3) -> TermsFit:
    """Fit the `names` terms of `start` (a ServerTerms) to the cases' measured figures."""
    unknown = [n for n in names if n not in BOUNDS]
    if unknown:
        raise KvsimError(f"cannot fit server term {unknown[0]} (fittable: {', '.join(BOUNDS)})")
    if not cases:
        raise KvsimError("no serving runs to fit")
    sims = [0]
    point = simulate_all(cases, start, max_requests, sims)
    cost = robust_cost(residuals(cases, point.figures))
    fit = TermsFit(start, list(names), point, 0, 0, [(start.to_dict(), cost)])
    for it in range(iterations):
        J = jacobian(cases, point, names, max_requests, sims)
        x0 = _vector(point.terms, names)
        target = solve_linear(residuals(cases, point.figures), J, x0, names)
        accepted = False
        for damp in (1.0, 0.5, 0.25):
            trial_terms = _terms(point.terms, names, x0 + damp * (target - x0))
            trial = simulate_all(cases, trial_terms, max_requests, sims)
            trial_cost = robust_cost(residuals(cases, trial.figures))
            if trial_cost < cost:
                point, cost, accepted = trial, trial_cost, True
                fit.history.append((trial_terms.to_dict(), cost))
                break
        fit.iterations = it + 1
        if not accepted or np.allclose(x0, _vector(point.terms, names), rtol=0.02, atol=0):
            break
    fit.terms, fit.point, fit.simulations = point.terms, point, sims[0]
    return fit


@dataclass(slots=True)
class Holdout:
    """Each group's cases predicted with terms fitted without it."""

    terms: dict  # group -> ServerTerms fitted without it
    figures: list  # per case: (metric, stat) -> seconds, from its group's fit
    overloaded: list
    simulations: int


def leave_groups_out(cases: list, fit: TermsFit, max_requests=None) -> Holdout:
    """For each group, the terms fitted without its figures: the all-data terms moved by what leaving
    the group out moves the linearized fit (the solve on the other groups' figures minus the solve on
    all of them, at the all-data terms, along one Jacobian), then the group's cases simulated with them."""
    sims = [0]
    names = fit.names
    J = jacobian(cases, fit.point, names, max_requests, sims) if names else None
    r0 = residuals(cases, fit.point.figures)
    x0 = _vector(fit.terms, names)
    everyone = solve_linear(r0, J, x0, names) if names else x0
    owner = [g for c in cases for g in [c.group] * len(_keys(c))]
    groups = list(dict.fromkeys(c.group for c in cases))
    figures, overloaded, terms = [None] * len(cases), [False] * len(cases), {}
    for g in groups:
        rows = np.array([o != g for o in owner])
        held = [i for i, c in enumerate(cases) if c.group == g]
        t = fit.terms
        if names and rows.any():
            t = _terms(fit.terms, names, x0 + solve_linear(r0, J, x0, names, rows) - everyone)
        terms[g] = t
        for i in held:
            out = simulate_case(cases[i], t, max_requests)
            sims[0] += 1
            figures[i], overloaded[i] = out.figures, out.overloaded
    return Holdout(terms, figures, overloaded, sims[0])


def error_rows(cases: list, figures: list) -> list[dict]:
    """One record per compared figure: case, group, metric, stat, measured, predicted, error."""
    rows = []
    for case, fig in zip(cases, figures):
        for (metric, stat), err in relative_errors(fig, case.measured).items():
            rows.append({"case": case.name, "group": case.group, "rate": case.rate, "metric": metric, "stat": stat,
                         "measured": case.measured[metric, stat], "predicted": fig[metric, stat], "error": err})
    return rows


def summary(rows: list[dict], metrics=("ttft", "tpot", "e2e"), stats=("mean", "p50", "p90", "p99")) -> dict:
    """Median |error| over the figures, and the signed median of each metric's case means."""
    sel = [r["error"] for r in rows if r["metric"] in metrics and r["stat"] in stats]
    out = {"figures": len(sel), "median_abs_error": statistics.median(map(abs, sel)) if sel else None}
    for m in metrics:
        means = [r["error"] for r in rows if r["metric"] == m and r["stat"] == "mean"]
        out[f"{m}_signed_median_of_means"] = statistics.median(means) if means else None
    return out
