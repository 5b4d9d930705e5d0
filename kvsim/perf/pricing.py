"""Step pricing: what the engine asks of a source of step times, and the run searches built on it.

A pricer (`StepPricer`) answers two questions:

- `step_time(batch)`: the seconds of one engine step of any `Batch`;
- `decode_run_time(shape, k)`: the seconds of the first k steps of a cohort-only decode batch of
  `shape` (`kvsim.batch.DecodeShape`) whose contexts each grow by one a step, i.e. exactly the sum
  over i < k of the step time of `shape` with read_tokens + i * num_seqs context tokens and the
  longest sequence longest + i (k = 0: nothing).

The simulator advances a run of identical decode steps as one event, so it needs two searches on
top of them (`RunPricer`): how many steps of a run start before a time budget runs out
(`decode_run_within`) and the first step count whose run reaches a budget (`decode_steps_within`).
`run_within` and `steps_within` derive both from `decode_run_time` by bisection, in O(log k) calls;
`RunSearch` gives a pricer these two as methods, so a new pricer (measured kernel times, say) is
a class with the two methods above that inherits `RunSearch`. A pricer with closed forms
(`kvsim.perf.roofline.StepModel`) offers faster searches of its own, with the same answers.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol, runtime_checkable

from kvsim.batch import Batch, DecodeShape

__all__ = ["DecodeRunPrice", "DecodeShape", "RunPricer", "RunSearch", "ScaledPricer", "StepPricer", "run_within",
           "steps_within"]


class DecodeRunPrice(NamedTuple):
    """What a run of decode steps costs: `steps` of them take `seconds`, the first `first_s`."""

    steps: int
    seconds: float
    first_s: float


@runtime_checkable
class StepPricer(Protocol):
    def step_time(self, batch: Batch) -> float:
        """Seconds of one engine step of `batch` (only its aggregate counts need be read)."""

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        """Seconds of the first k steps of a decode run of `shape` (0 for k = 0)."""


@runtime_checkable
class RunPricer(StepPricer, Protocol):
    def decode_run_within(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        """The first k <= max_steps steps of the run that start within `budget_s`: all max_steps when
        they end before it, else the fewest whose run reaches it."""

    def decode_steps_within(self, shape: DecodeShape, budget_s: float) -> int:
        """The smallest k >= 1 with decode_run_time(shape, k) >= budget_s."""


def first_reaching(run_time, shape: DecodeShape, budget_s: float, lo: int, hi: int) -> int:
    """The smallest k in (lo, hi] with run_time(shape, k) >= budget_s, given that k = hi reaches it
    and k = lo does not (run times grow with k)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run_time(shape, mid) >= budget_s:
            hi = mid
        else:
            lo = mid
    return hi


def steps_within(pricer: StepPricer, shape: DecodeShape, budget_s: float) -> int:
    """`decode_steps_within` by doubling, then bisection, over `pricer.decode_run_time`."""
    if shape.num_seqs <= 0 or not math.isfinite(budget_s):
        raise ValueError(f"need num_seqs > 0 and a finite budget, got {shape.num_seqs}, {budget_s}")
    run_time = pricer.decode_run_time
    lo, hi = 0, 1
    while run_time(shape, hi) < budget_s:
        lo, hi = hi, 2 * hi
    return first_reaching(run_time, shape, budget_s, lo, hi)


def run_within(pricer: StepPricer, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
    """`decode_run_within` by bisection over `pricer.decode_run_time`."""
    run_time = pricer.decode_run_time
    first = run_time(shape, 1)
    if max_steps == 1:
        return DecodeRunPrice(1, first, first)
    total = run_time(shape, max_steps)
    if total < budget_s:
        return DecodeRunPrice(max_steps, total, first)
    k = 1 if first >= budget_s else first_reaching(run_time, shape, budget_s, 1, max_steps)
    return DecodeRunPrice(k, run_time(shape, k), first)


class RunSearch:
    """The run searches of `RunPricer` for a pricer that gives `decode_run_time` (bisection)."""

    def decode_run_within(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        return run_within(self, shape, max_steps, budget_s)

    def decode_steps_within(self, shape: DecodeShape, budget_s: float) -> int:
        return steps_within(self, shape, budget_s)


class ScaledPricer:
    """Another `RunPricer`'s prices times `scale` (backend.step_time_scale): its searches on the budget
    divided by the scale, so a scaled run stops where the scaled steps reach the budget."""

    __slots__ = ("inner", "scale")

    def __init__(self, inner: RunPricer, scale: float):
        self.inner, self.scale = inner, scale

    def step_time(self, batch: Batch) -> float:
        return self.scale * self.inner.step_time(batch)

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        return self.scale * self.inner.decode_run_time(shape, k)

    def decode_run_within(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        k, seconds, first = self.inner.decode_run_within(shape, max_steps, budget_s / self.scale)
        return DecodeRunPrice(k, self.scale * seconds, self.scale * first)

    def decode_steps_within(self, shape: DecodeShape, budget_s: float) -> int:
        return self.inner.decode_steps_within(shape, budget_s / self.scale)

    def describe(self) -> dict | None:
        describe = getattr(self.inner, "describe", None)
        return None if describe is None else {**describe(), "step_time_scale": self.scale}
