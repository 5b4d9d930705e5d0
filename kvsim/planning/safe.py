"""The safe rate: the highest arrival rate that every seed of a plan sustains, and a run
`LONG_RUN` times longer too, each simulated there.

The seeds' knees are a cliff, not a slope: at their mean about half the seeds fail, and a knee
found on N requests sits above the one a longer run finds (a queue needs time to grow, and a real
trace's later rows may be burstier than its first N). So the rate a planner should provision is
checked, not averaged. A rate *passes* when one run of LONG_RUN x N requests (the first seed;
near the knee it is the one that fails) and then every seed are sustainable there. Start at the
lowest of the seeds' highest sustainable rates; while nothing has passed, step down by one
resolution step (x (1 - res) / (1 + res)), then two, four, eight... (so a long run far below the
knee is found in a few rounds); once a rate has passed below one that failed, bisect (on a log
scale) until the two are within the resolution. The safe rate is the highest rate that passed (0
when none did in `MAX_STEPS` rounds). Every label (policy or deployment) has its own ladder; a
round simulates every label still searching at once, so the answers do not depend on the executor.
An `integer` ladder (a closed loop's concurrency) takes whole steps: at least one client down,
and it stops when the rate that failed is one above the one that passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from kvsim.planning.executors import run_all
from kvsim.planning.points import evaluate_point
from kvsim.planning.search import whole_between

LONG_RUN = 4
MAX_STEPS = 12


@dataclass(slots=True)
class SafeCheck:
    """One label's ladder: the rate to try next, the highest that passed and the lowest that failed."""

    label: object
    rate: float
    steps: int = 0
    done: bool = False
    passed: Optional[float] = None  # the highest rate that passed
    failed: Optional[float] = None  # the lowest rate that failed
    records: list = field(default_factory=list)  # the seeds' records at `passed`
    long_record: Optional[dict] = None  # the long run's record at `passed`
    tried: list = field(default_factory=list)  # (rate, seed or None for the long run, record)
    integer: bool = False  # whole rates only (a concurrency)

    @property
    def safe_rate(self) -> float:
        return self.passed or 0.0

    def next_rate(self, shrink: float, floor: float) -> Optional[float]:
        """The rate to try after the last result, or None when done (module docstring)."""
        if self.passed is None:
            rate = max(self.failed * shrink ** (2 ** (self.steps - 1)), floor)
            return whole_between(min(rate, self.failed - 1), 0, self.failed) if self.integer else rate
        if self.failed is None or self.failed / self.passed <= 1 / shrink:
            return None
        rate = (self.passed * self.failed) ** 0.5
        return whole_between(rate, self.passed, self.failed) if self.integer else rate


def first_candidate(searches) -> float:
    """The lowest of the seeds' highest sustainable rates (0 when a seed sustained none)."""
    los = [s.lo for s in searches]
    return 0.0 if not los or any(lo is None for lo in los) else min(los)


def verify(executor, items: list, seeds: list[int], task: Callable[[object, int, bool], tuple],
           tick) -> list[tuple[list, Optional[dict]]]:
    """For each item, (the seeds' records, the long run's record): the long run first (near a knee it
    is the one that fails), then every seed of the items whose long run passed (an empty list for the
    others: it could not change the answer). `task(item, seed, long)` gives the arguments of
    `evaluate_point`."""
    longs = run_all(executor, evaluate_point, [task(item, seeds[0], True) for item in items], lambda i, r: tick())
    passing = [i for i, rec in enumerate(longs) if rec["sustainable"]]
    tasks = [task(items[i], seed, False) for i in passing for seed in seeds]
    recs = run_all(executor, evaluate_point, tasks, lambda i, r: tick())
    per = {i: recs[k * len(seeds):(k + 1) * len(seeds)] for k, i in enumerate(passing)}
    return [(per.get(i, []), longs[i]) for i in range(len(items))]


def safe_rates(executor, candidates: dict, seeds: list[int], resolution: float,
               task: Callable[[object, float, int, bool], tuple], tick, floor=lambda label: 0.0,
               integer: bool = False) -> dict:
    """{label: SafeCheck} down each label's ladder from its candidate rate (module docstring).
    `task(label, rate, seed, long)` gives the arguments of `evaluate_point` for one simulated point;
    `floor(label)`: a rate already known to pass this check, below which the ladder does not go."""
    checks = {label: SafeCheck(label, rate, done=rate <= 0, integer=integer) for label, rate in candidates.items()}
    shrink = (1 - resolution) / (1 + resolution)
    while True:
        todo = [c for c in checks.values() if not c.done]
        if not todo:
            return checks
        results = verify(executor, todo, seeds, lambda c, seed, long: task(c.label, c.rate, seed, long), tick)
        for c, (records, long_record) in zip(todo, results):
            c.tried += [(c.rate, None, long_record)] + [(c.rate, seed, rec) for seed, rec in zip(seeds, records)]
            c.steps += 1
            if records and all(r["sustainable"] for r in records):
                c.passed, c.records, c.long_record = c.rate, records, long_record
            else:
                c.failed = c.rate
            rate = c.next_rate(shrink, floor(c.label))
            if rate is None or c.steps >= MAX_STEPS:
                c.done = True
            else:
                c.rate = rate


def _seeds_verdict(rate: float, seeds_at: dict) -> Optional[bool]:
    """Whether every seed passes at `rate`: simulated there, or implied (all passed at a rate at or
    above it; some failed at one at or below it); None when neither."""
    if rate in seeds_at:
        return all(r["sustainable"] for r in seeds_at[rate])
    above = any(all(r["sustainable"] for r in recs) for k, recs in seeds_at.items() if k >= rate)
    below = any(not all(r["sustainable"] for r in recs) for k, recs in seeds_at.items() if k <= rate)
    return None if above == below else above


def replay_ladder(label, start: float, long_at: dict, seeds_at: dict, shrink: float, floor: float,
                  integer: bool) -> tuple[SafeCheck, Optional[tuple[str, float]]]:
    """The ladder of `safe_rates` replayed on the runs known (`long_at`: rate -> the long run's record,
    `seeds_at`: rate -> the seeds' records); where the long run passed and the seeds' verdict is neither
    known nor implied they are taken to pass. Returns the ladder's end state and what to simulate next:
    ("long", rate), ("seeds", rate) (the highest rate taken to pass), or None when it is settled."""
    c = SafeCheck(label, start, done=start <= 0, integer=integer)
    taken = []
    while not c.done:
        rate = c.rate
        if rate not in long_at:
            return c, ("long", rate)
        ok = bool(long_at[rate]["sustainable"])
        if ok:
            seeds_ok = _seeds_verdict(rate, seeds_at)
            if seeds_ok is None:
                taken.append(rate)
            ok = seeds_ok is not False
        c.steps += 1
        if ok:
            c.passed, c.records, c.long_record = rate, seeds_at.get(rate, []), long_at[rate]
        else:
            c.failed = rate
        nxt = c.next_rate(shrink, floor)
        if nxt is None or c.steps >= MAX_STEPS:
            c.done = True
        else:
            c.rate = nxt
    if taken:
        return c, ("seeds", max(taken))
    if c.passed is not None and c.passed not in seeds_at:  # passed on seeds implied: its figures are needed
        return c, ("seeds", c.passed)
    return c, None


def safe_rates_guided(executor, candidates: dict, seeds: list[int], resolution: float,
                      task: Callable[[object, float, int, bool], tuple], tick, floor=lambda label: 0.0,
                      integer: bool = False) -> dict:
    """`safe_rates`' answer with fewer runs (kvsim plan's default): each label's ladder walks on its long
    runs first and takes the seeds to pass wherever the long run did (near a knee the long run is the
    one that fails), then simulates the seeds at the highest rate so taken; when they pass there, every
    rate below is taken as passing on them too (the verdict is monotone in the rate), else the ladder is
    walked again from what is known. The rates tried are the plain ladder's, so whenever the verdicts
    are monotone it ends where `safe_rates` ends, with the same records at the safe rate."""
    shrink = (1 - resolution) / (1 + resolution)
    long_at = {label: {} for label in candidates}
    seeds_at = {label: {} for label in candidates}
    tried = {label: [] for label in candidates}
    while True:
        states = {label: replay_ladder(label, rate, long_at[label], seeds_at[label], shrink, floor(label), integer)
                  for label, rate in candidates.items()}
        needs = [(label, need) for label, (_, need) in states.items() if need is not None]
        if not needs:
            break
        jobs = [(label, rate, seeds[0], True) if kind == "long" else (label, rate, seed, False)
                for label, (kind, rate) in needs for seed in ([seeds[0]] if kind == "long" else seeds)]
        records = run_all(executor, evaluate_point, [task(*job) for job in jobs], lambda i, r: tick())
        for (label, rate, seed, long), record in zip(jobs, records):
            if long:
                long_at[label][rate] = record
            else:
                seeds_at[label].setdefault(rate, []).append(record)
            tried[label].append((rate, None if long else seed, record))
    checks = {}
    for label, (c, _) in states.items():
        c.tried = tried[label]
        checks[label] = c
    return checks
