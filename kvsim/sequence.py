"""Requests as they arrive, and sequences as the scheduler and allocators track them.

A `Request` is immutable workload data. A `Sequence` is one request's life inside an engine: its
status, how many of its tokens have KV in the cache (`num_computed_tokens`), its block table, and
the timestamps that metrics turn into TTFT, inter-token latency and end-to-end latency.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import NamedTuple, Optional, Sequence as Seq

import numpy as np


class Request(NamedTuple):
    """One request of the workload (a named tuple: immutable, and built three times faster than a
    frozen dataclass, which matters at a million requests).

    `token_ids` is the prompt content where it is known and may be shared with other requests
    (a group's system prompt, a trace's prefix hash ids); it covers the first `len(token_ids)`
    prompt tokens. The rest of the prompt is unique to this request, so no prefix cache can hit it.
    `token_ids` is None when nothing of the prompt can be shared.
    """

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    token_ids: Optional[np.ndarray] = None


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED = auto()
    REJECTED = auto()


@dataclass(slots=True, eq=False)
class Sequence:
    request: Request
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (prompt and output)
    num_output_tokens: int = 0  # tokens generated so far
    num_tokens: int = 0  # prompt + generated: what the KV cache must hold to compute the next token
    block_table: Seq[int] = field(default_factory=lambda: array("i"))  # block ids, as the allocator keeps them
    block_hashes: Optional[tuple] = None  # (chained hashes, token bytes) of the shareable full blocks, lazily
    num_cached_tokens: int = 0  # prompt tokens served by prefix-cache hits, over all admissions
    num_preemptions: int = 0
    first_scheduled_time: float = -1.0
    first_token_time: float = -1.0
    last_token_time: float = -1.0
    finish_time: float = -1.0
    reject_reason: str = ""
    run_order: int = 0  # when it last entered the running queue (vLLM's running order)
    cohort_clock: int = -1  # the decode cohort's clock when it joined; -1 outside the cohort

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    def __post_init__(self):
        self.num_tokens = self.request.prompt_len + self.num_output_tokens
