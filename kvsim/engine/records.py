"""Records that cross the engine's boundaries (besides `kvsim.batch.Batch`, the step plan).

- `DecodeRunPlan`: what the scheduler allows a run of identical cohort decode steps (how many steps
  before the schedule could change, and the blocks its later steps take).
- `StepRecord`: what an engine event did (one step, or a fused run of decode steps), filled by the
  replica and read by the `EngineObserver`. One record per replica is reused event after event
  (an event costs a few attribute writes, not an allocation); an observer that keeps something
  copies it.

A time-series sample is a plain tuple laid out as `SAMPLE_FIELDS` (cheaper to build than a named one,
and the observer stores it as it is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

SAMPLE_FIELDS = ("time", "running", "waiting", "swapped", "blocks_used", "blocks_cached", "blocks_free",
                 "reserved_unused_tokens", "external_fragmentation")


class DecodeRunPlan(NamedTuple):
    """`steps` (>= 1) identical decode steps of the cohort fit before the schedule could change; the
    steps after the first take `reserve_blocks` more blocks (the first step's were reserved by
    `schedule`)."""

    steps: int
    reserve_blocks: int


@dataclass(slots=True, eq=False)
class StepRecord:
    """One replica's latest engine event. Times are simulated seconds."""

    replica: int
    batch: object = None  # the step's plan (a kvsim.batch.Batch; a fused run: its first step's)
    start: float = 0.0
    duration: float = 0.0  # the event's seconds (all its steps)
    first_s: float = 0.0  # its first step's seconds (= duration unless a fused run)
    end: float = 0.0
    num_steps: int = 1  # engine steps the event stands for (> 1: a fused decode run)
    admission_limit: str = ""  # what held waiting requests back ("": none waited; Scheduler.admission_limit)
    # Inter-token gaps: the decode cohort's first step's (its size gaps), the mean of its later steps'
    # (size x (num_steps - 1) gaps), and one per explicitly scheduled sequence that had a token before.
    cohort_size: int = 0
    cohort_first_gap: float = 0.0
    cohort_later_gap: float = 0.0
    itl_gaps: list | tuple = ()
    finished: list | tuple = ()  # sequences that finished at `end`, in the order they were freed
    batch_tokens: int = 0  # tokens the (first) step computed
    sample: tuple = ()  # the replica after the event (SAMPLE_FIELDS, time = end)
    used_block_s: float = -1.0  # KV block-seconds held during the event (-1: the previous sample's use held)
    # A fused run only (peak_used >= 0): (sample, batch_tokens) of its last step in each sampling
    # interval it crosses, and the blocks held after its next-to-last step.
    marks: list | tuple = ()
    peak_used: int = -1
    sample_boundary: float = -math.inf  # set by the observer: a fused run reports marks only when it ends past this
