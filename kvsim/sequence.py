"""Requests as they arrive, and sequences as the scheduler and allocators track them.

A `Request` is immutable workload data. A `Sequence` is one request's life inside an engine: its
status, how many of its tokens have KV in the cache (`num_computed_tokens`), its block table, and
the timestamps that metrics turn into TTFT, inter-token latency and end-to-end latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Callable, NamedTuple, Optional, Sequence as Seq

import numpy as np


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (a bijection that scatters nearby inputs):
    content identities of prompt blocks, for traces and the prefix cache alike."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class KeyedTokens:
    """Prompt tokens named by chained content keys, `span` tokens a key, expanded only when read.

    Traces such as Mooncake's give a prompt as block hash ids, each standing for `span` tokens and
    everything before them (the last key may cover fewer). Two prompts share their first k*span
    tokens exactly when they share their first k keys. The paged allocator derives its block
    identities from the keys, so no token is materialised or hashed; whoever needs the tokens (the
    GPU runner, tests) reads them as from an int32 array: `expand(keys)` gives `span` token ids per
    key, cut to `length`.
    """

    __slots__ = ("keys", "span", "length", "expand")

    def __init__(self, keys: np.ndarray, span: int, length: int, expand: Callable[[np.ndarray], np.ndarray]):
        self.keys, self.span, self.length, self.expand = keys, span, length, expand

    def __len__(self) -> int:
        return self.length

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        tokens = self.expand(self.keys)[:self.length]
        return tokens if dtype is None else tokens.astype(dtype)

    def __getitem__(self, index) -> np.ndarray:
        return np.asarray(self)[index]

    def tobytes(self) -> bytes:
        return np.asarray(self).tobytes()

    def tolist(self) -> list:
        return np.asarray(self).tolist()


class Request(NamedTuple):
    """One request of the workload (a named tuple: immutable, and built three times faster than a
    frozen dataclass, which matters at a million requests).

    `token_ids` is the prompt content where it is known and may be shared with other requests
    (a group's system prompt, a trace's prefix hash ids); it covers the first `len(token_ids)`
    prompt tokens. The rest of the prompt is unique to this request, so no prefix cache can hit it.
    It may run past the prompt into the output (a conversation's turn names its reply, which the
    next turn carries: kvsim/scenario/sessions.py); content past the prompt must continue what an
    earlier request named, as a conversation's turns do.
    `token_ids` is None when nothing of the prompt can be shared. It is an int32 array, or a
    `KeyedTokens` when a trace names the content by block keys.
    """

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    token_ids: Optional[np.ndarray | KeyedTokens] = None


NO_BLOCKS: tuple = ()  # the block table of a sequence holding no blocks: an allocator gives it its own at its first


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED = auto()
    REJECTED = auto()


@dataclass(slots=True, eq=False, init=False)
class Sequence:
    """One request's life in an engine; `Sequence(request)` starts it waiting, with nothing computed.
    (__init__ is written out: a generated one with 16 defaults costs twice as much, per request.)"""

    request: Request
    status: SequenceStatus
    num_computed_tokens: int  # tokens whose KV is in the cache (prompt and output)
    num_output_tokens: int  # tokens generated so far
    num_tokens: int  # prompt + generated: what the KV cache must hold to compute the next token
    block_table: Seq[int]  # block ids, as the allocator keeps them (NO_BLOCKS, shared, until it takes some)
    block_hashes: Optional[Seq[int]]  # chained identities of the shareable full blocks, set by the allocator
    num_cached_tokens: int  # prompt tokens served by prefix-cache hits, over all admissions
    num_preemptions: int
    preempted_at: float  # when it was last preempted, -1.0 while it is not
    preempted_s: float  # time spent preempted, from each preemption to its next scheduling
    first_scheduled_time: float  # -1.0 until it happens, as the other times
    first_token_time: float
    last_token_time: float
    finish_time: float
    reject_reason: str
    run_order: int  # when it last entered the running queue (vLLM's running order)
    cohort_clock: int  # the decode cohort's clock when it joined; -1 outside the cohort

    def __init__(self, request: Request):
        self.request = request
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = self.num_output_tokens = self.num_cached_tokens = self.num_preemptions = 0
        self.num_tokens = request.prompt_len
        self.block_table = NO_BLOCKS  # made at the first allocation: a waiting request holds no table
        self.block_hashes = None
        self.first_scheduled_time = self.first_token_time = self.last_token_time = self.finish_time = -1.0
        self.preempted_at, self.preempted_s = -1.0, 0.0
        self.reject_reason = ""
        self.run_order = 0
        self.cohort_clock = -1

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len
