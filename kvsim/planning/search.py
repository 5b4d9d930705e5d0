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
    implied: dict = field(default_factory=dict)  # rate -> verdict taken without simulating it (Guided)

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


@dataclass(slots=True)
class Guided:
    """A `Search` answered with fewer simulations (kvsim plan's default; `--exhaustive` runs the plain
    search). The exhaustive search's choices depend only on its verdicts, so its path can be replayed
    from any verdicts known: one simulated, or implied by one (a rate at or below a sustainable one is
    taken as sustainable, at or above an unsustainable one as unsustainable; the verdict is monotone in
    the rate wherever two points of one seed are simulated). With a `guess` of the knee (another seed's,
    or the knee with steps priced differently), the replay predicts the path and its final bracket, and
    those two rates are simulated first (its bottom, then its top): when the guess is right they settle
    every verdict of the path. A wrong guess moves past the rate that proved it wrong (one resolution
    step, then two, four); after `MAX_MISSES` the path's first open rate is simulated next, as the plain
    search would.
    The rates tried are the plain search's own (same arithmetic), so the bracket, the knee and the
    records at its ends are the ones the plain search finds whenever the verdicts are monotone."""

    search: Search  # what the answer reads: lo, hi and their records, tried (only the simulated points)
    guess: Optional[float] = None
    known: dict = field(default_factory=dict)  # rate -> record, simulated or given
    pending: list = field(default_factory=list)  # rates out for simulation (a batch is awaited whole)
    whole: set = field(default_factory=set)  # rates of `pending` likely to end as the bracket's: simulate whole
    misses: int = 0  # guesses proved wrong so far

    def verdict(self, rate: float) -> Optional[bool]:
        """The verdict at `rate`: simulated, or implied by the points simulated (None: neither)."""
        record = self.known.get(rate)
        if record is not None:
            return bool(record["sustainable"])
        above = any(r["sustainable"] for k, r in self.known.items() if k >= rate)
        below = any(not r["sustainable"] for k, r in self.known.items() if k <= rate)
        return None if above == below else above

    def replay(self, guess: Optional[float]) -> tuple[Search, list[float]]:
        """The plain search replayed on the verdicts known (and `guess`'s where none is): its end state
        and the rates on its path whose verdict is not known, in path order (with no guess: the first)."""
        s = Search(self.search.key, self.search.start, self.search.resolution, self.search.growth,
                   self.search.integer)
        open_rates = []
        while (rate := s.next_rate()) is not None:
            ok = self.verdict(rate)
            if ok is None:
                open_rates.append(rate)
                if guess is None:
                    break
                ok = rate < guess
            s.update(rate, self.known.get(rate) or {"sustainable": ok})
        return s, open_rates

    def next_rates(self) -> list[float]:
        """The rates to simulate next (at most two), [] once the search is settled; `whole` says which of
        them to simulate whole (they would end the search as its first unsustainable rate)."""
        self.whole = set()
        if self.guess is not None:
            s, open_rates = self.replay(self.guess)
            ends = [r for r in (s.lo, s.hi) if r is not None and r in open_rates]
            if ends or open_rates:  # the bracket's bottom first: when it fails, its top need not run
                self.whole = set(ends[:1])
                return ends[:1] or open_rates[:1]
        s, open_rates = self.replay(None)
        if open_rates:
            self.whole = {r for r in open_rates if settles(s, r)}
            return open_rates
        return [r for r in (s.lo, s.hi) if r is not None and r not in self.known]  # the ends' records

    def update(self, rate: float, record: dict) -> None:
        self.known[rate] = record
        self.search.tried.append((rate, record))
        ok = bool(record["sustainable"])
        if self.guess is not None and ok != (rate < self.guess):
            # wrong: move the guess past this rate, twice as far each time; then the plain search's order
            self.misses += 1
            step = ((1 + self.search.resolution) / (1 - self.search.resolution)) ** (2 ** (self.misses - 1))
            self.guess = None if self.misses > MAX_MISSES else rate * step if ok else rate / step

    def finish(self) -> None:
        """Put the replayed end state into `search`; the verdicts implied but not simulated in `implied`."""
        s, _ = self.replay(None)
        target = self.search
        target.lo, target.hi = s.lo, s.hi
        target.lo_record = None if s.lo is None else self.known[s.lo]
        target.hi_record = None if s.hi is None else self.known[s.hi]
        target.implied = {rate: bool(rec["sustainable"]) for rate, rec in s.tried}


MAX_MISSES = 3  # wrong guesses before a Guided search falls back to the plain search's order


def settles(search: Search, rate: float) -> bool:
    """Whether `search` ends once `rate` (its next) is found unsustainable: `rate` is then its bracket's top."""
    trial = Search(search.key, search.start, search.resolution, search.growth, search.integer, search.lo, search.hi)
    trial.update(rate, {"sustainable": False})
    return trial.next_rate() is None


def run_guided(executor, groups: list[list[Guided]], task: Callable[[Search, float, bool], tuple],
               on_point: Optional[Callable[[], None]] = None, guess_from: Optional[Callable] = None) -> None:
    """Drive each group's `Guided` searches to their ends: the first of a group at once, the others once
    it is done, guessing its knee (`guess_from(first, other)`; default the first's knee where it
    brackets one). `task(search, rate, whole)` gives (fn, *args) for one point (`whole`: not to be
    stopped). Each search submits a batch and waits for all of it before choosing again, so what is
    simulated depends only on the search's own results and its group's first, not on timing."""
    guess_from = guess_from or (lambda first, other: first.search.knee if first.search.hi and first.search.lo
                                else other.guess)
    pending = {}
    waiting = {id(g[0]): g[1:] for g in groups if len(g) > 1}

    def step(g: Guided) -> None:
        rates = g.next_rates()
        if not rates:
            g.finish()
            for other in waiting.pop(id(g), []):
                other.guess = guess_from(g, other)
                step(other)
            return
        g.pending = list(rates)
        for rate in rates:
            fn, *args = task(g.search, rate, rate in g.whole)
            pending[executor.submit(fn, *args)] = (g, rate)

    for group in groups:
        step(group[0])
    back: dict = {}  # id(guided) -> {rate: record} of its batch so far
    while pending:
        for handle in executor.wait(pending):
            g, rate = pending.pop(handle)
            got = back.setdefault(id(g), {})
            got[rate] = executor.result(handle)
            if on_point is not None:
                on_point()
            if len(got) == len(g.pending):  # the whole batch: taken in the order submitted
                del back[id(g)]
                batch, g.pending = g.pending, []
                for r in batch:
                    g.update(r, got[r])
                step(g)
