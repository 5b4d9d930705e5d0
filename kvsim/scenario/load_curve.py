"""Time-varying arrival rates: a day of traffic as a curve (`[workload.arrival.curve]`).

A curve gives the arrival rate over time, in requests per second:

- `shape = "table"`: (time, rate) points, joined by straight lines (`interpolation = "linear"`) or
  held until the next point (`"step"`); the curve starts at the first point (time 0) and ends at
  the last.
- `shape = "diurnal"`: a day's cosine between `min_rate` and `max_rate`, peaking at `peak_s`, of
  period `period_s`, for `duration_s`.
- `bursts`: windows [start_s, start_s + duration_s) in which the rate is multiplied by `factor`.

A curve compiles to `RateCurve`: segments on which the rate is linear in time, their cumulative
counts Λ(t) = ∫ rate. Arrivals follow it by a change of time (the time-rescaling theorem): the
process's gaps are drawn in *operational* time, where the rate is 1 (Poisson: exponential gaps of
mean 1; gamma: mean 1, coefficient of variation `cv`; deterministic: every gap 1), and each
operational time u is mapped back to the wall-clock t with Λ(t) = u. Poisson gaps give exactly the
non-homogeneous Poisson process of the curve; on a flat curve every process is the constant-rate
one. Λ is quadratic on a linear segment, so the inverse is closed form (vectorized with numpy).

A trace's own times are replayed and rescaled by `arrival.process = "trace"` with `time_scale`, not
by a curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Iterator, Literal, Optional

import numpy as np
from pydantic import Field, field_validator, model_validator

from kvsim.scenario import limits as L
from kvsim.scenario.sections import Section

DIURNAL_STEP_S = 60.0  # a diurnal curve is sampled every minute and joined by straight lines
MAX_CURVE_POINTS = 100_000
DAY_S = 86_400.0

Seconds = Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]
Rate = Annotated[float, Field(ge=0, le=L.MAX_RATE)]


class BurstConfig(Section):
    """A burst: the curve's rate times `factor` from `start_s` for `duration_s`."""

    start_s: Seconds = Field(description="When the burst starts, seconds from the curve's start.")
    duration_s: Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)] = Field(description="How long it lasts, seconds.")
    factor: Annotated[float, Field(ge=0, le=1e3)] = Field(description="The rate is multiplied by this during the burst.")


class RateCurveConfig(Section):
    """An arrival rate that follows a curve over time (requests per second)."""

    shape: Literal["table", "diurnal"] = Field("table", description=(
        "table: the (time, rate) `points`; diurnal: a cosine between min_rate and max_rate peaking at peak_s."))
    points: Optional[list[list[float]]] = Field(None, description=(
        "table: [[seconds, requests per second], ...], times strictly increasing from 0; the curve ends at the "
        "last point, e.g. [[0, 5], [43200, 35], [86400, 5]]."))
    interpolation: Literal["linear", "step"] = Field("linear", description=(
        "table: rates between points on a straight line (linear), or held until the next point (step)."))
    min_rate: Optional[Rate] = Field(None, description="diurnal: the lowest rate, requests per second.")
    max_rate: Optional[Rate] = Field(None, description="diurnal: the highest rate, requests per second.")
    peak_s: Seconds = Field(50_400.0, description="diurnal: when the rate peaks, seconds (default 14:00).")
    period_s: Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)] = Field(DAY_S, description=(
        "diurnal: the period of the cosine, seconds (default one day)."))
    duration_s: Optional[Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)]] = Field(None, description=(
        "diurnal: how long the curve lasts, seconds (default one period)."))
    bursts: Annotated[list[BurstConfig], Field(max_length=10_000)] = Field([], description=(
        "Windows in which the rate is multiplied ([[workload.arrival.curve.bursts]]: start_s, duration_s, factor)."))

    @field_validator("points")
    @classmethod
    def _table(cls, points):
        if points is None:
            return points
        if len(points) < 2:
            raise ValueError(f"a rate table needs at least two [seconds, rate] points (where it starts and where "
                             f"it ends), got {len(points)}")
        if len(points) > MAX_CURVE_POINTS:
            raise ValueError(f"at most {MAX_CURVE_POINTS:,} points, got {len(points):,}")
        for i, p in enumerate(points):
            if len(p) != 2:
                raise ValueError(f"point {i} must be [seconds, requests per second], got {p}")
            if not (0 <= p[0] <= L.MAX_DURATION_S and 0 <= p[1] <= L.MAX_RATE):
                raise ValueError(f"point {i} ({p[0]:g} s, {p[1]:g} req/s) must have a time in [0, {L.MAX_DURATION_S:g}] "
                                 f"and a rate in [0, {L.MAX_RATE:g}]")
        if points[0][0] != 0:
            raise ValueError(f"the first point's time must be 0, got {points[0][0]:g}")
        for i in range(1, len(points)):
            if points[i][0] <= points[i - 1][0]:
                raise ValueError(f"times must increase: point {i} ({points[i][0]:g} s) is not after point {i - 1} "
                                 f"({points[i - 1][0]:g} s)")
        return points

    @model_validator(mode="after")
    def _shape(self):
        if self.shape == "table":
            if self.points is None:
                raise ValueError("shape 'table' needs points = [[seconds, requests per second], ...]")
            extra = [k for k in ("min_rate", "max_rate", "duration_s") if getattr(self, k) is not None]
            if extra:
                raise ValueError(f"shape 'table' takes no {', '.join(extra)} (those are the diurnal shape's)")
        else:
            if self.points is not None:
                raise ValueError("shape 'diurnal' takes no points (use shape = \"table\")")
            if self.min_rate is None or self.max_rate is None:
                raise ValueError("shape 'diurnal' needs min_rate and max_rate")
            if self.min_rate > self.max_rate:
                raise ValueError(f"min_rate ({self.min_rate:g}) must not exceed max_rate ({self.max_rate:g})")
        curve = rate_curve(self)
        if curve.total <= 0:
            raise ValueError("the curve's rate is 0 throughout: no request would arrive")
        if curve.total > L.MAX_REQUESTS:
            raise ValueError(f"the curve brings {curve.total:,.0f} requests, more than {L.MAX_REQUESTS:,}")
        return self


@dataclass(frozen=True, slots=True)
class RateCurve:
    """Rate segments: on [start[i], end[i]) the rate goes linearly from r0[i] to r1[i]; `cum[i]` is
    Λ(start[i]) (cum has one more entry: the total)."""

    start: np.ndarray
    end: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    cum: np.ndarray

    @property
    def end_s(self) -> float:
        return float(self.end[-1])

    @property
    def total(self) -> float:
        """Expected arrivals over the curve: Λ(end)."""
        return float(self.cum[-1])

    @property
    def mean_rate(self) -> float:
        return self.total / self.end_s

    @property
    def peak_rate(self) -> float:
        return float(max(self.r0.max(), self.r1.max()))

    def rate_at(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        i = np.clip(np.searchsorted(self.start, t, side="right") - 1, 0, len(self.start) - 1)
        width = self.end[i] - self.start[i]
        return self.r0[i] + (self.r1[i] - self.r0[i]) * (t - self.start[i]) / width

    def cumulative(self, t: np.ndarray | float) -> np.ndarray:
        """Λ(t): expected arrivals by t (t clipped to the curve)."""
        t = np.clip(np.asarray(t, dtype=np.float64), 0.0, self.end_s)
        i = np.clip(np.searchsorted(self.start, t, side="right") - 1, 0, len(self.start) - 1)
        tau = t - self.start[i]
        slope = (self.r1[i] - self.r0[i]) / (self.end[i] - self.start[i])
        return self.cum[i] + self.r0[i] * tau + 0.5 * slope * tau * tau

    def invert(self, u: np.ndarray) -> np.ndarray:
        """The times t with Λ(t) = u (u in [0, total]): on a segment, r0 τ + slope τ²/2 = x solved as
        τ = 2x / (r0 + sqrt(r0² + 2 slope x)), stable for any slope's sign."""
        u = np.asarray(u, dtype=np.float64)
        i = np.clip(np.searchsorted(self.cum, u, side="right") - 1, 0, len(self.start) - 1)
        x = u - self.cum[i]
        r0, width = self.r0[i], self.end[i] - self.start[i]
        slope = (self.r1[i] - r0) / width
        root = np.sqrt(np.maximum(r0 * r0 + 2.0 * slope * x, 0.0))
        denom = r0 + root
        with np.errstate(divide="ignore", invalid="ignore"):
            tau = np.where(denom > 0, 2.0 * x / np.where(denom > 0, denom, 1.0), 0.0)
        return self.start[i] + np.minimum(tau, width)

    def window_counts(self, width_s: float) -> np.ndarray:
        """Expected arrivals in each window [k w, (k + 1) w) of the curve."""
        edges = np.append(np.arange(0.0, self.end_s, width_s), self.end_s)
        return np.diff(self.cumulative(edges))


def _segments(times: np.ndarray, rates: np.ndarray, step: bool) -> tuple[np.ndarray, ...]:
    start, end = times[:-1], times[1:]
    r0 = rates[:-1]
    r1 = r0 if step else rates[1:]
    return start.copy(), end.copy(), r0.copy(), np.array(r1, dtype=np.float64)


def _diurnal(cfg: RateCurveConfig) -> tuple[np.ndarray, np.ndarray]:
    duration = cfg.duration_s or cfg.period_s
    n = max(2, int(math.ceil(duration / DIURNAL_STEP_S)) + 1)
    times = np.linspace(0.0, duration, n)
    mid, amp = (cfg.max_rate + cfg.min_rate) / 2, (cfg.max_rate - cfg.min_rate) / 2
    return times, mid + amp * np.cos(2 * math.pi * (times - cfg.peak_s) / cfg.period_s)


def _with_bursts(seg: tuple[np.ndarray, ...], bursts: list[BurstConfig]) -> tuple[np.ndarray, ...]:
    """Split the segments at every burst edge and multiply the rates inside each burst."""
    start, end, r0, r1 = seg
    cuts = sorted({t for b in bursts for t in (b.start_s, b.start_s + b.duration_s) if start[0] < t < end[-1]})
    if cuts:
        new_start = np.unique(np.concatenate([start, cuts]))
        new_end = np.append(new_start[1:], end[-1])
        i = np.searchsorted(start, new_start, side="right") - 1
        slope = (r1[i] - r0[i]) / (end[i] - start[i])
        r0, r1 = r0[i] + slope * (new_start - start[i]), r0[i] + slope * (new_end - start[i])
        start, end = new_start, new_end
    factor = np.ones(len(start))
    for b in bursts:
        inside = (start >= b.start_s) & (end <= b.start_s + b.duration_s)
        factor[inside] *= b.factor
    return start, end, r0 * factor, r1 * factor


def rate_curve(cfg: RateCurveConfig) -> RateCurve:
    """The curve's segments and cumulative counts."""
    if cfg.shape == "table":
        pts = np.asarray(cfg.points, dtype=np.float64)
        seg = _segments(pts[:, 0], pts[:, 1], cfg.interpolation == "step")
    else:
        seg = _segments(*_diurnal(cfg), step=False)
    start, end, r0, r1 = _with_bursts(seg, cfg.bursts) if cfg.bursts else seg
    mass = (r0 + r1) / 2 * (end - start)
    return RateCurve(start, end, r0, r1, np.concatenate([[0.0], np.cumsum(mass)]))


def curve_arrival_chunks(process: str, cv: float, curve: RateCurve, rng: np.random.Generator,
                         chunk: int) -> Iterator[list]:
    """Absolute arrival times following `curve`, `chunk` at a time (the module docstring): the
    process's unit-mean gaps in operational time, mapped through Λ⁻¹; ends with the curve."""
    shape = 1.0 / (cv * cv)
    u = 0.0
    while True:
        if process == "poisson":
            gaps = rng.exponential(1.0, chunk)
        elif process == "deterministic":
            gaps = np.ones(chunk)
        else:
            gaps = rng.gamma(shape, 1.0 / shape, chunk)
        ops = u + np.cumsum(gaps)
        u = float(ops[-1])
        inside = ops[ops <= curve.total]
        if len(inside):
            yield curve.invert(inside).tolist()
        if len(inside) < chunk:
            return


def curve_text(curve: dict) -> str:
    """A curve (as summary.json's meta holds it) in words: e.g. 'following a curve: 20.0 req/s on
    average, 36.0 at peak, over 24.0 h'."""
    c = rate_curve(RateCurveConfig.model_validate(curve))
    hours = c.end_s / 3600
    span = f"{hours:.1f} h" if hours >= 1 else f"{c.end_s:g} s"
    return f"following a curve: {c.mean_rate:.1f} req/s on average, {c.peak_rate:.1f} at peak, over {span}"
