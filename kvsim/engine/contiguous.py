"""The contiguous KV-cache allocator: one slab per request, first fit in a linear address space.

This is how servers laid out KV before paging: at admission a request reserves room for the longest
sequence it may reach (`max_model_len`, or prompt + output when the server is told the output
length), as one run of consecutive blocks. Unused reserved slots are internal fragmentation; free
space split into holes too small for a slab is external fragmentation. Both are measured.

Like `BlockManager` it is a `KVAllocator` (kvsim.engine.interfaces), so the scheduler and the GPU backend use either unchanged; the
block table of a slab is a `range` of consecutive block ids, so the same paged kernels run over it.
"""

from __future__ import annotations

from bisect import insort
from typing import Sequence as Seq

from kvsim.engine.block_manager import AllocationError
from kvsim.sequence import NO_BLOCKS, Sequence


class ContiguousAllocator:
    enable_prefix_caching = False
    grows = False  # a sequence never needs blocks beyond its slab
    num_cached_blocks = 0
    num_reserved_blocks = 0
    num_shared_refs = 0  # slabs are never shared

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "max_model_len"):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.reserve_mode = reserve
        self.extents: list[tuple[int, int]] = [(0, num_blocks)]  # free (start, length), sorted by start
        self.num_free_blocks = num_blocks
        self.reserved_unused_tokens = 0  # slab slots not (yet) written
        self.next_slab = 0  # blocks of the slab last asked for (0: none yet)

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def block_counts(self) -> tuple[int, int, int]:
        """(used, cached, free) blocks at once: the figures of a time-series sample."""
        return self.num_blocks - self.num_free_blocks, 0, self.num_free_blocks

    @property
    def largest_free_extent(self) -> int:
        return max((n for _, n in self.extents), default=0)

    @property
    def external_fragmentation(self) -> float:
        """Share of free blocks in holes too small for the next slab (the last one asked for by a
        first allocation, as the waiting queue's head asks each step): free memory that cannot
        serve the next request."""
        if not self.num_free_blocks or not self.next_slab:
            return 0.0
        return sum(n for _, n in self.extents if n < self.next_slab) / self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slab_blocks(self, seq: Sequence) -> int:
        req = seq.request
        tokens = self.max_model_len if self.reserve_mode == "max_model_len" else req.prompt_len + req.output_len
        return self.blocks_for(tokens)

    peak_blocks = slab_blocks  # a sequence holds its slab from admission to the end

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        base = seq.block_table[0] * self.block_size
        return list(range(base + start, base + end))

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int = 0) -> int:
        """New blocks for `num_new_tokens` more tokens: none inside the slab, more than all outside it."""
        if not seq.block_table:
            return self.slab_blocks(seq)
        return 0 if self._fits(seq, num_new_tokens) else self.num_blocks + 1

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        return []

    def evictions_ahead(self, counts) -> list[int]:
        return [0] * len(counts)  # nothing is cached

    # ---- allocation ----------------------------------------------------------------------
    def _first_fit(self, n: int) -> int:
        for i, (start, length) in enumerate(self.extents):
            if length >= n:
                return i
        return -1

    def _fits(self, seq: Sequence, num_new_tokens: int) -> bool:
        return seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool:
        if seq.block_table:
            return self._fits(seq, num_new_tokens)
        n = self.next_slab = self.slab_blocks(seq)
        return seq.num_computed_tokens + num_new_tokens <= n * self.block_size and self._first_fit(n) >= 0

    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> None:
        if computed_blocks:
            raise AllocationError("the contiguous allocator has no prefix cache")
        if not self.can_allocate(seq, num_new_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: no free extent for its slab")
        if not seq.block_table:
            n = self.slab_blocks(seq)
            i = self._first_fit(n)
            start, length = self.extents[i]
            if length == n:
                del self.extents[i]
            else:
                self.extents[i] = (start + n, length - n)
            self.num_free_blocks -= n
            seq.block_table = range(start, start + n)
            self.reserved_unused_tokens += n * self.block_size - seq.num_computed_tokens  # swapped-in KV is written
        self.reserved_unused_tokens -= num_new_tokens

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        return bool(seq.block_table) and self._fits(seq, num_new_tokens)

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        if not self.can_append(seq, num_new_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: outgrew its slab of {len(seq.block_table)} blocks")
        self.reserved_unused_tokens -= num_new_tokens

    def note_written(self, num_tokens: int) -> None:
        self.reserved_unused_tokens -= num_tokens

    def reserve(self, n: int) -> None:
        if n:
            raise AllocationError("contiguous slabs are reserved whole at admission")

    def claim(self, seq: Sequence, num_tokens: int = -1) -> None:
        pass

    def deallocate(self, seq: Sequence) -> None:
        table = seq.block_table
        if not table:
            raise AllocationError(f"sequence {seq.seq_id}: nothing to free (double free?)")
        start, n = table[0], len(table)
        if start < 0 or start + n > self.num_blocks or any(s < start + n and start < s + m for s, m in self.extents):
            raise AllocationError(f"sequence {seq.seq_id}: slab {start}+{n} is not allocated")
        self.reserved_unused_tokens -= n * self.block_size - seq.num_computed_tokens
        self.num_free_blocks += n
        insort(self.extents, (start, n))
        self._coalesce()
        seq.block_table = NO_BLOCKS
        seq.num_computed_tokens = 0

    def _coalesce(self) -> None:
        merged: list[tuple[int, int]] = []
        for start, n in self.extents:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((start, n))
        self.extents = merged
