"""What one engine step computes: the scheduler's output and the backend's input.

Besides the scheduled sequences, a `Batch` carries the aggregate counts a step-time model needs,
so the analytic backend never walks the sequences. `DecodeShape` is what a step price reads of a
cohort-only decode batch, the unit in which runs of decode steps are priced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvsim.sequence import Sequence


class DecodeShape(NamedTuple):
    """A pure-decode step of `num_seqs` sequences whose attention reads `read_tokens` context tokens,
    the longest sequence `longest` of them (0: not known, the mean). In a run of such steps every
    context grows by one a step: step i reads read_tokens + i * num_seqs, the longest longest + i.
    A model with sliding-window layers: those read `window_tokens` (min(context, window) a sequence),
    `window_growth` more a step (the sequences not yet past the window)."""

    num_seqs: int
    read_tokens: int
    longest: int = 0
    window_tokens: int = 0
    window_growth: int = 0


_new = tuple.__new__  # builds a named tuple without its Python-level __new__ (once per fused decode run)


@dataclass(slots=True)
class Batch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # per sequence, this step
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0  # new tokens of sequences still in their prompt
    prefill_attn_pairs: int = 0  # sum over prefill chunks of new*ctx + new*(new+1)/2 (query-key pairs)
    prefill_context_tokens: int = 0  # cached KV tokens that prefill chunks read (prefix hits, earlier chunks)
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # sum over decoding sequences of (num_computed_tokens + 1)
    decode_max_context: int = 0  # the longest of them (0: not known, take the mean)
    # Pure-decode steps: tokens of blocks that running sequences hold at once, counted once per extra
    # holder. The step's attention reads such a block from HBM once; the other holders find it in L2.
    decode_shared_tokens: int = 0
    swap_out_blocks: int = 0  # blocks copied GPU -> host before this step (swap preemption)
    swap_in_blocks: int = 0  # blocks copied host -> GPU before this step
    preempted: list[Sequence] | tuple = ()  # a list once the step preempts (rare: no list per step)
    min_output_left: int = 1 << 62  # cohort batches: fewest tokens any member has left to generate
    cohort_size: int = 0  # decoders scheduled as the scheduler's decode cohort (counted, not listed)
    cohort_step_blocks: int = 0  # blocks reserved for the cohort's new tokens this step
    cohort_step_releases: int = 0  # blocks the cohort's members freed this step (left their windows)
    decode_window_tokens: int = 0  # windowed KV cache: what the cohort's windowed layers read (min(context, window))
    decode_window_growth: int = 0  # ... and how much more a step (members not yet past the window)
    dissolved: list[Sequence] | tuple = ()  # cohort members released into `seqs` this step
    # Speculative decoding: draft tokens verified this step beyond one token per decoding sequence (each
    # a token row of the verify pass and a sampled row), and a speculative cohort's run of steps, which
    # prices in place of the linear DecodeShape (kvsim.engine.spec_cohort)
    num_spec_tokens: int = 0
    run_shape: object = None

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs + self.num_spec_tokens

    @property
    def decode_read_tokens(self) -> int:
        """Context tokens the decode attention reads from HBM: shared blocks once (never fewer than
        the longest sequence's own: a running sequence left out of the step may hold shared blocks)."""
        if not self.decode_shared_tokens:
            return self.decode_context_tokens
        return max(self.decode_context_tokens - self.decode_shared_tokens, self.decode_max_context)

    def decode_shape(self) -> DecodeShape:
        """The step as a decode-run price reads it (a cohort-only batch: every sequence decodes)."""
        if self.run_shape is not None:  # a speculative cohort's run: its steps' figures, not a linear growth
            return self.run_shape
        return _new(DecodeShape, (self.num_decode_seqs, self.decode_read_tokens, self.decode_max_context,
                                  self.decode_window_tokens, self.decode_window_growth))

    @property
    def is_pure_decode(self) -> bool:
        return self.num_prefill_seqs == 0 and self.swap_in_blocks == 0 and self.swap_out_blocks == 0

    def window_reads(self, window: int) -> tuple[int, int, int]:
        """What layers with a sliding window of `window` tokens read this step: (decode context tokens,
        each decode reading min(context, window); prefill query-key pairs, each new token at position
        p attending min(p + 1, window) keys; prefill KV tokens, a chunk of n after c cached reading
        min(c + n, window - 1 + n)). The cohort's decodes come counted (decode_window_tokens)."""
        decode, pairs, kv = self.decode_window_tokens, 0, 0
        for seq, n in zip(self.seqs, self.num_new_tokens):
            ctx = seq.num_computed_tokens
            if n > 1 or ctx < seq.request.prompt_len:
                hi, lo = ctx + n, ctx + 1  # positions + 1 of the new tokens
                top = min(hi, window)
                pairs += (top * (top + 1) - (lo - 1) * lo) // 2 if lo <= top else 0
                pairs += (hi - max(lo - 1, window)) * window if hi > window else 0
                kv += min(ctx + n, window - 1 + n)
            else:
                decode += min(ctx + n, window)
        return decode, pairs, kv

    def add(self, seq: Sequence, num_new: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new)
        ctx = seq.num_computed_tokens
        if num_new > 1 or ctx < seq.request.prompt_len:  # prompt, or recomputing after preemption
            self.num_prefill_seqs += 1
            self.num_prefill_tokens += num_new
            self.prefill_context_tokens += ctx
            self.prefill_attn_pairs += num_new * ctx + num_new * (num_new + 1) // 2
        else:
            self.num_decode_seqs += 1
            self.decode_context_tokens += ctx + num_new
            if ctx + num_new > self.decode_max_context:
                self.decode_max_context = ctx + num_new

    def add_decode(self, seq: Sequence, num_drafts: int) -> None:
        """A decoding sequence verifying `num_drafts` draft tokens: 1 + num_drafts token rows, all sampled."""
        num_new = 1 + num_drafts
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new)
        self.num_decode_seqs += 1
        self.num_spec_tokens += num_drafts
        reads = seq.num_computed_tokens + num_new
        self.decode_context_tokens += reads
        if reads > self.decode_max_context:
            self.decode_max_context = reads
