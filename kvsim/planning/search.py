"""The rate search: bracket, then bisect on a log scale, one search per (policy or layout, seed).

A search starts at the scenario's own rate r0. While every rate tried is sustainable it doubles
(or grows by the search's `growth`, when the caller knows the knee is near; at most
`MAX_DOUBLINGS` steps), while none is it halves (or shrinks by the same `growth`; down to 64x below
r0, below which the knee is reported as 0, "not sustainable at any rate tried"); once a sustainable rate `lo`
and an unsustainable one `hi` bracket the knee it tries sqrt(lo * hi) until hi / lo <=
(1 + res) / (1 - res). The knee is then sqrt(lo * hi): every rate in the bracket lies within
±res of it. Which rate comes next depends only on the search's own results, so many searches
can run at once on any executor (`run_searches`) and still give the same answers.

An `integer` search (a closed loop's concurrency: clients come whole) tries whole numbers from 1
up: the same bracket and bisection rounded, until hi = lo + 1 or the bracket is within the
resolution; its knee is lo, the most clients found sustainable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

MAX_DOUBLINGS = 12
MAX_HALVINGS = 6


@dataclass(slots=True)
class Search:
    key: tuple  # who is searched, e.g. (policy, seed)
    start: float
    resolution: float = 0.02
    growth: float = 2.0  # the step up while nothing tried has failed
    integer: bool = False  # whole loads only (a concurrency)
    lo: Optional[float] = None  # highest sustainable rate seen
    hi: Optional[float] = None  # lowest unsustainable rate seen
    lo_record: Optional[dict] = None
    hi_record: Optional[dict] = None
    tried: list = field(default_factory=list)  # (rate, record) in the order tried

    def next_rate(self) -> Optional[float]:
        """The next rate to try, or None when the search is done."""
        rate = self._next()
        if rate is None or not self.integer:
            return rate
        return whole_between(rate, self.lo or 0, self.hi or math.inf)

    def _next(self) -> Optional[float]:
        lo, hi = self.lo, self.hi
        if self.integer and ((lo is not None and hi is not None and hi - lo <= 1) or hi == 1):
            return None
        if lo is None and hi is None:
            return self.start
        if hi is None:
            return lo * self.growth if lo * self.growth <= self.start * 2 ** MAX_DOUBLINGS else None
        if lo is None:
            return hi / self.growth if hi / self.growth >= self.start / 2 ** MAX_HALVINGS else None
        if hi / lo <= (1 + self.resolution) / (1 - self.resolution):
            return None
        return math.sqrt(lo * hi)

    def update(self, rate: float, record: dict) -> None:
        self.tried.append((rate, record))
        if record["sustainable"]:
            if self.lo is None or rate > self.lo:
                self.lo, self.lo_record = rate, record
        elif self.hi is None or rate < self.hi:
            self.hi, self.hi_record = rate, record

    @property
    def knee(self) -> float:
        """sqrt(lo * hi); lo when nothing tried failed (censored) or the search is integer, 0 when
        nothing passed."""
        if self.lo is None:
            return 0.0
        if self.hi is None or self.integer:
            return self.lo
        return math.sqrt(self.lo * self.hi)

    @property
    def censored(self) -> bool:
        """True when even the highest rate tried was sustainable (the knee is above it)."""
        return self.lo is not None and self.hi is None


def whole_between(rate: float, lo: float, hi: float) -> Optional[float]:
    """`rate` rounded to a whole number strictly between lo and hi (at least 1), or None if none is."""
    low, high = math.floor(lo) + 1, math.ceil(hi) - 1 if math.isfinite(hi) else math.inf
    if low > high:
        return None
    return float(min(max(round(rate), low, 1), high))


def expected_points(resolution: float) -> int:
    """About how many rates a search tries: a bracket of 2x from the start, then bisection."""
    target = math.log((1 + resolution) / (1 - resolution))
    return 2 + max(0, math.ceil(math.log2(math.log(2) / target)))


def run_searches(executor, searches: list[Search], task: Callable[[Search, float], tuple],
                 on_point: Optional[Callable[[], None]] = None) -> None:
    """Drive every search to its end; `task(search, rate)` gives (fn, *args) for one point.
    A search's next rate is submitted as soon as its last one is back."""
    pending = {}

    def submit(search: Search) -> None:
        rate = search.next_rate()
        if rate is not None:
            fn, *args = task(search, rate)
            pending[executor.submit(fn, *args)] = (search, rate)

    for search in searches:
        submit(search)
    while pending:
        for handle in executor.wait(pending):
            search, rate = pending.pop(handle)
            search.update(rate, executor.result(handle))
            if on_point is not None:
                on_point()
            submit(search)
