"""The paged KV-cache allocator: block tables, slot mapping and prefix caching, as vLLM V1 (v0.11.0).

One implementation serves the simulator and the real GPU backend, so it knows nothing of time.
A sequence owns a block table; the KV of its token at position p lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

Prefix caching caches **every full block** of a sequence, prompt and generated tokens, as vLLM
does: a block is registered when a step is scheduled that fills it; when its table is freed (tail
block first) it stays reusable at the tail of an LRU free queue until it is taken again from the
head. A later sequence whose prompt starts with cached content, or a preempted sequence coming
back, takes those blocks instead of recomputing them (at most `(num_tokens - 1) // block_size`, so
that one token is left to compute). What a block holds is named in `prefix_cache`: shareable
content by chained identities found through an index of cached runs, content unique to a request
(the rest of its prompt, its generated tokens) by the request itself. The latter can only be hit by
its own sequence after a preemption, so its freed table is *parked*: the free queue says how many of
its blocks have not been taken since (see FreeBlockQueue), and that leading part is hit.

Cost per scheduling event, not per block: blocks at positions that can never be shared move between
the free queue and the tables as `array('i')` slices with no per-block state; only blocks at
*shareable* table positions (full blocks of `Request.token_ids`) have reference counts, and those
are numpy arrays updated a table slice at a time. Misuse is caught where it is cheap: the allocator
remembers which table it gave each sequence, so a double free, a sequence it never allocated
(another replica's) and a replaced table are errors, as is a reference count going below zero. A
table edited in place is not detected (vLLM's BlockPool does not check that either).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Sequence as Seq

import numpy as np

from kvsim.engine.free_queue import FreeBlockQueue
from kvsim.engine.prefix_cache import BlockContent, CachedRun, ChainMemo, PrefixIndex, block_hashes, sequence_chain
from kvsim.sequence import NO_BLOCKS, Sequence

__all__ = ["AllocationError", "BlockManager", "PrefixHit", "block_hashes"]


def identities(hashes: np.ndarray) -> array:
    """Block identities as the allocator keeps them (and Sequence.block_hashes holds them)."""
    return array("Q", hashes.tobytes())


class AllocationError(RuntimeError):
    """Allocator misuse: a request the caller should have checked first, a double free, an unknown id."""


class PrefixHit:
    """Cached blocks holding a sequence's leading blocks (from get_computed_blocks): `blocks` in
    table order; the first `num_shared` are at shareable positions (the last of them from `run`),
    the rest were parked by this sequence and lie at free-queue positions [queue_lo, queue_hi)."""

    __slots__ = ("blocks", "num_shared", "run", "queue_lo", "queue_hi", "num_revived")

    def __init__(self, blocks: array, num_shared: int, run=None, queue_lo: int = 0, queue_hi: int = 0):
        self.blocks, self.num_shared, self.run = blocks, num_shared, run
        self.queue_lo, self.queue_hi = queue_lo, queue_hi
        self.num_revived = -1  # how many are free now (counted by the allocator when it first asks)

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self):
        return iter(self.blocks)

    def __getitem__(self, i):
        return self.blocks[i]

    def __eq__(self, other) -> bool:
        return list(self.blocks) == list(other)


class _Parked:
    """A preempted sequence's freed table: its blocks at positions [first, full) hold its unique
    content; they entered the free queue tail first at positions [queue_pos, queue_pos + n)."""

    __slots__ = ("table", "first", "full", "queue_pos")

    def __init__(self, table: array, first: int, full: int, queue_pos: int):
        self.table, self.first, self.full, self.queue_pos = table, first, full, queue_pos


class BlockManager:
    """Paged allocator over `num_blocks` blocks of `block_size` token slots."""

    external_fragmentation = 0.0  # any free block serves any sequence
    grows = True  # a sequence takes blocks as it grows

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_queue = FreeBlockQueue(num_blocks, enable_prefix_caching)
        self.content = BlockContent()  # per block: registering run, references at shareable positions, queue position
        self.index = PrefixIndex()
        self._runs: dict[Sequence, CachedRun] = {}  # the run each sequence is registering
        self._parked: dict[Sequence, _Parked] = {}
        self._chains = ChainMemo(block_size, identities)  # a prefix group's identities, computed once
        self._tables: dict[Sequence, Seq[int]] = {}  # the block table given to each holder of blocks
        self._reserved = array("i")  # taken off the free queue for sequences that claim them later
        # Slots held but not (yet) written: the tails of last blocks, and reserved blocks. Tables
        # (and reservations) add their slots, written tokens take theirs off.
        self.reserved_unused_tokens = 0
        self.num_shared_refs = 0  # references beyond a block's first: what holders share

    # ---- queries -------------------------------------------------------------------------
    # The free queue's counts, read through C getters (no Python frame: the scheduler reads them every step).
    num_free_blocks = property(attrgetter("free_queue.num_free"))
    num_cached_blocks = property(attrgetter("free_queue.num_cached"), doc="Free blocks still holding cached "
                                 "content (reusable until evicted).")

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.free_queue.num_free

    def block_counts(self) -> tuple[int, int, int]:
        """(used, cached, free) blocks at once: the figures of a time-series sample."""
        queue = self.free_queue
        return self.num_blocks - queue.num_free, queue.num_cached, queue.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_blocks(self, seq: Sequence) -> int:
        """Blocks the sequence holds once it has all its tokens."""
        return self.blocks_for(seq.request.prompt_len + seq.request.output_len)

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int = 0) -> int:
        bs = self.block_size
        need = -(-(seq.num_computed_tokens + num_new_tokens) // bs) - len(seq.block_table)  # hits are whole blocks
        return need if need > 0 else 0

    def evictions_ahead(self, counts) -> list[int]:
        """For each n in `counts` (ascending), how many of the next n blocks taken hold cached content."""
        return self.free_queue.cached_ahead(counts)

    def free_block_ids(self) -> list[int]:
        """The free queue in LRU order (head first). For checks, not hot paths."""
        return self.free_queue.block_ids()

    def ref_count(self, block: int) -> int:
        return self.content.ref[block] if block < len(self.content.ref) else 0

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- prefix caching ------------------------------------------------------------------
    def num_shareable(self, seq: Sequence) -> int:
        """Table positions whose blocks may be shared: the full blocks of the shareable content (the
        prompt's, and past it a reply that a conversation's next turn carries)."""
        ids = seq.request.token_ids
        return 0 if ids is None or not self.enable_prefix_caching else len(ids) // self.block_size

    def _chain(self, seq: Sequence) -> array:
        """Identities of the sequence's shareable full blocks, as an `array('Q')` (kept on the
        sequence for the other replicas' allocators, and per token_ids array for the other members
        of a prefix group)."""
        return sequence_chain(seq, self._chains)

    def get_computed_blocks(self, seq: Sequence):
        """Cached blocks holding the longest prefix of the sequence's tokens (at least one token is
        left to compute): shareable content through the index, then the sequence's own parked blocks."""
        found, depth, parked, end = self._find_cached(seq)
        if not found and end <= depth:
            return ()
        blocks = array("i")
        for run, lo, hi in found:
            blocks.extend(run.table[lo:hi])
        if end <= depth:
            return PrefixHit(blocks, depth, found[-1][0])
        blocks.extend(parked.table[depth:end])
        lo = parked.queue_pos + len(parked.table) - end
        return PrefixHit(blocks, depth, found[-1][0] if found else None, lo, lo + end - depth)

    def _find_cached(self, seq: Sequence) -> tuple:
        """(runs as (run, start, end) in depth order, the depth they reach, the parked table, the
        depth its hits reach: no parked hits when that is not past the first)."""
        none = ((), 0, None, 0)
        if not self.enable_prefix_caching or seq.block_table:
            return none
        ids = seq.request.token_ids
        if ids is None and seq not in self._parked:
            return none
        limit = (seq.num_tokens - 1) // self.block_size
        if limit <= 0:
            return none
        n_share = 0 if ids is None else len(ids) // self.block_size
        found, depth = (), 0
        if n_share and self.index.num_runs:
            found, depth = self.index.longest_hit(self._chain(seq), min(limit, n_share), self.content,
                                                  self.free_queue.head)
        parked = self._parked.get(seq) if depth == n_share else None
        if parked is None or parked.first != n_share:
            return found, depth, None, 0
        # The parked run entered the queue tail first: its block at position j went to queue
        # position queue_pos + (n - 1 - j), and is still free while that is at or past the head.
        n = len(parked.table)
        taken = self.free_queue.head - parked.queue_pos
        return found, depth, parked, min(parked.full, limit, n - taken if taken > 0 else n)

    def _num_revived(self, hits) -> int:
        """How many of the hit blocks are free now (they leave the free queue)."""
        if not hits:
            return 0
        if hits.num_revived < 0:
            shared = self.content.count_free(hits.blocks[:hits.num_shared]) if hits.num_shared else 0
            hits.num_revived = shared + hits.queue_hi - hits.queue_lo
        return hits.num_revived

    def _revive(self, seq: Sequence, hits: PrefixHit) -> None:
        """The sequence takes a reference to each hit block; free ones leave the free queue."""
        if hits.num_shared:
            free = self.content.acquire(hits.blocks[:hits.num_shared])
            if len(free):
                self.free_queue.remove_positions(free)
            self.num_shared_refs += hits.num_shared - len(free)
        if hits.queue_hi > hits.queue_lo:
            self.free_queue.remove_range(hits.queue_lo, hits.queue_hi)
        self._parked.pop(seq, None)

    # ---- allocation ----------------------------------------------------------------------
    def _fits(self, need: int, computed_blocks) -> bool:
        """Are `need` new blocks free, besides the cached hits that leave the free queue?"""
        return need + self._num_revived(computed_blocks) <= self.free_queue.num_free

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> bool:
        return self._fits(self.num_blocks_needed(seq, num_new_tokens, len(computed_blocks)), computed_blocks)

    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> None:
        """Give the sequence slots for `num_new_tokens` more tokens, all or nothing.

        `computed_blocks` (from get_computed_blocks, first allocation only) are prefix hits: the
        sequence takes a reference to them and its `num_computed_tokens` moves past them.
        """
        if computed_blocks and (seq.block_table or seq.num_computed_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: prefix hits only on a first allocation")
        need = self.num_blocks_needed(seq, num_new_tokens, len(computed_blocks))
        if not self._fits(need, computed_blocks):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks for {num_new_tokens} tokens")
        if computed_blocks:
            self._revive(seq, computed_blocks)
            hit_tokens = len(computed_blocks) * self.block_size
            seq.block_table = self._tables[seq] = array("i", computed_blocks.blocks)
            seq.num_computed_tokens = hit_tokens
            seq.num_cached_tokens += hit_tokens
            if computed_blocks.num_shared and self._runs:
                self._branch_off(seq, computed_blocks.num_shared)
        self._grow(seq, num_new_tokens, need)

    def _branch_off(self, seq: Sequence, depth: int) -> None:
        """The sequence's hits end at `depth` and it will register what follows. A run another
        sequence is still registering, with the same content at `depth`, will register it too
        (vLLM keeps duplicates): that run is cut at `depth`, so that lookups meet both there
        instead of passing one inside the other."""
        chain = self._chain(seq)
        if depth >= len(chain):
            return
        for owner, run in list(self._runs.items()):
            if (owner is not seq and run.start <= depth and run.end <= depth < len(run.chain)
                    and run.chain[depth] == chain[depth]):
                if run.end == depth:
                    self._runs[owner] = CachedRun(owner, run.chain, depth)
                else:
                    run.splits = sorted({*(run.splits or ()), depth})

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.free_queue.num_free

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Slots for a running sequence's next tokens (decode, or the next prefill chunk)."""
        need = self.num_blocks_needed(seq, num_new_tokens)
        if need > self.free_queue.num_free:
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks to append {num_new_tokens} tokens")
        self._grow(seq, num_new_tokens, need)

    def _grow(self, seq: Sequence, num_new_tokens: int, need: int) -> None:
        table, bs = seq.block_table, self.block_size
        if not table:  # its first blocks: a table of its own
            self.reserved_unused_tokens -= seq.num_computed_tokens  # a swapped-in sequence brings its KV back
            seq.block_table = self._tables[seq] = array("i")
            if self._parked:
                self._parked.pop(seq, None)
        if need:
            self._adopt(seq, self._take(need))
        self.reserved_unused_tokens += need * bs - num_new_tokens
        # Register the shareable blocks this step fills (vLLM caches them when it schedules them).
        ids = seq.request.token_ids
        if ids is not None and self.enable_prefix_caching:
            n_share = len(ids) // bs
            if seq.num_computed_tokens // bs < n_share:
                self._register(seq, min(n_share, (seq.num_computed_tokens + num_new_tokens) // bs))

    def _register(self, seq: Sequence, upto: int) -> None:
        """Register the sequence's shareable blocks up to depth `upto` (a run per admission, cut
        where another run branched off it; dropped from `_runs` once it covers the shareable part)."""
        run = self._runs.get(seq)
        if run is None:
            start = seq.num_computed_tokens // self.block_size  # the first block that was no hit
            run = self._runs[seq] = CachedRun(seq, self._chain(seq), start)
        while run.splits and run.splits[0] <= upto:
            cut = run.splits[0]
            if cut > run.end:
                self.index.extend(run, cut, self.content, self.free_queue.head)
            later = CachedRun(seq, run.chain, cut)
            later.splits = run.splits[1:]
            run = self._runs[seq] = later
        if upto > run.end:
            self.index.extend(run, upto, self.content, self.free_queue.head)
        if run.end >= len(run.chain):
            del self._runs[seq]

    def _take(self, n: int) -> array:
        """n blocks off the head of the free queue; whatever they held is evicted."""
        queue = self.free_queue
        if queue.high_water < self.num_blocks and queue.high_water + n > len(self.content.ref):
            self.content.grow(min(self.num_blocks, queue.high_water + n))
        return queue.pop(n)

    def _adopt(self, seq: Sequence, new: array) -> None:
        """Append blocks taken off the free queue to the sequence's table, one reference each."""
        table = seq.block_table
        if seq.request.token_ids is not None:
            shared = self.num_shareable(seq) - len(table)  # how many land at shareable positions
            if shared > 0:  # held, and holding nothing until registered
                self.content.hold(new[:shared])
        table.extend(new)

    def reserve(self, n: int) -> None:
        """Take n blocks off the free queue now (LRU order, evicting as usual) for `claim` later."""
        if n > self.free_queue.num_free:
            raise AllocationError(f"cannot reserve {n} blocks, {self.free_queue.num_free} are free")
        if n:
            self._reserved += self._take(n)  # cohort blocks: private positions, no per-block state
            self.reserved_unused_tokens += n * self.block_size

    def claim(self, seq: Sequence, num_tokens: int = -1) -> None:
        """Move reserved blocks into the sequence's table until it covers its computed tokens (or
        `num_tokens` slots: a speculative cohort member's, lookahead included)."""
        need = self.blocks_for(seq.num_computed_tokens if num_tokens < 0 else num_tokens) - len(seq.block_table)
        if need > len(self._reserved):
            raise AllocationError(f"sequence {seq.seq_id}: claims {need} blocks, {len(self._reserved)} reserved")
        if need > 0:
            new = self._reserved[:need]
            del self._reserved[:need]
            self._adopt(seq, new)
        # Shareable content past the prompt (a conversation's reply, which its next turn carries):
        # the full blocks the cohort wrote are registered now that the table holds them.
        run = self._runs.get(seq) if self._runs else None
        if run is not None and seq.num_computed_tokens // self.block_size > run.end:
            self._register(seq, min(len(run.chain), seq.num_computed_tokens // self.block_size))

    @property
    def num_reserved_blocks(self) -> int:
        return len(self._reserved)

    def note_written(self, num_tokens: int) -> None:
        """Account tokens written into slots the sequences already hold (the scheduler's fast path)."""
        self.reserved_unused_tokens -= num_tokens

    # ---- freeing -------------------------------------------------------------------------
    def deallocate(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail block first; full ones stay cached until evicted."""
        table = seq.block_table
        if not table:
            raise AllocationError(f"sequence {seq.seq_id}: nothing to free (double free?)")
        if self._tables.get(seq) is not table:
            raise AllocationError(f"sequence {seq.seq_id}: its block table was not allocated here")
        n, bs, queue = len(table), self.block_size, self.free_queue
        shared = min(n, self.num_shareable(seq)) if seq.request.token_ids is not None else 0
        freed = self._release_shared(seq, table, shared) if shared else None
        if shared:
            self.num_shared_refs -= shared - len(freed)
        if shared < n:
            private = table[shared:]  # a copy: the table itself stays as the runs and the parking saw it
            private.reverse()
            if not self.enable_prefix_caching:
                queue.append_uncached(private)
            else:
                full = seq.num_computed_tokens // bs  # blocks whose every slot holds computed KV
                pos = queue.append(private, n - max(full, shared))
                if full > shared and seq.num_output_tokens < seq.request.output_len:  # it will come back
                    self._parked[seq] = _Parked(table, shared, full, pos)
        if freed:
            # Shareable positions at or past the computed tokens were never filled (nobody can
            # hold them but this table), so they come first, tail first, and hold nothing to reuse.
            pos = queue.append(freed, max(0, shared - seq.num_computed_tokens // bs))
            self.content.set_positions(freed, pos)
        if self._runs:
            self._runs.pop(seq, None)
        self.reserved_unused_tokens -= n * bs - seq.num_computed_tokens
        del self._tables[seq]
        seq.block_table = NO_BLOCKS
        seq.num_computed_tokens = 0

    def _release_shared(self, seq: Sequence, table: array, shared: int) -> array:
        """Drop a reference to each block at a shareable position (all or none); returns those now
        free, tail first."""
        try:
            return self.content.release(table[:shared])
        except ValueError as err:
            raise AllocationError(f"sequence {seq.seq_id}: its block table {err}") from None
