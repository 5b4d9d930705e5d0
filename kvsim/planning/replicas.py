"""Step 3 of a deployment search (kvsim/planning/deploy.py): the fewest replicas of one layout that
meet the SLO at the target rate, as a small state machine the search drives.

More replicas never lower the rate a deployment sustains, so a failure at n rules out every count
below n and a pass every count above: the fewest passing count lies in [lo, passed], lo being one
more than the largest count seen to fail. A count passes on its seeds first (`seeds_done`); the run
four times longer is simulated only once that count is the fewest (`next_check` asks for it), and
its failure moves lo past it (`long_done`). Given the cost cutoff of the search (the `top`-th
cheapest passing deployment), the next count tried is never more than the cutoff affords, and a
layout whose proven lower bound (price × lo) exceeds the cutoff is `prunable`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


@dataclass(slots=True)
class ReplicaCount:
    """Step 3's state of one layout: the fewest passing replica count lies in [lo, passed]. A count
    passes on its seeds first; the long run is simulated only once it is the fewest (`verified`)."""

    lay: tuple  # (gpu, tp, policy)
    price: float  # $/hour of one replica
    guess: int  # next count to try while none has passed
    passed: Optional[int] = None  # fewest count whose seeds all passed
    verified: bool = False  # the long run passed at `passed` too
    failed: Optional[int] = None  # most count seen to fail
    records: dict = field(default_factory=dict)  # count -> seeds' records at the target

    @property
    def lo(self) -> int:
        return 1 if self.failed is None else self.failed + 1

    @property
    def pinned(self) -> bool:
        return self.passed is not None and self.passed == self.lo and self.verified

    def next_check(self, cutoff: float, max_replicas: int) -> Optional[tuple[int, bool]]:
        """(count, long run?) to simulate next; None when pinned or out of reach."""
        if self.pinned or self.lo > max_replicas:
            return None
        if self.passed == self.lo:
            return self.passed, True
        most = min(max_replicas, math.floor(cutoff / self.price + 1e-9)) if math.isfinite(cutoff) else max_replicas
        want = self.guess if self.passed is None else self.passed - 1
        return max(self.lo, min(want, most)), False

    def prunable(self, cutoff: float) -> bool:
        return not self.pinned and self.price * self.lo > cutoff * (1 + 1e-12)

    def seeds_done(self, n: int, records: list) -> None:
        self.records[n] = records
        if all(r["sustainable"] for r in records):
            if self.passed is None or n < self.passed:
                self.passed, self.verified = n, False
        else:
            self.failed = n if self.failed is None else max(self.failed, n)
            if self.passed is None:
                self.guess = n + 1

    def long_done(self, n: int, record: dict) -> None:
        if record["sustainable"]:
            self.verified = True
        else:  # n fails after all; the counts above it passed on seeds only
            self.failed, self.passed, self.guess = n, None, n + 1
