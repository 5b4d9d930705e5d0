"""The paged KV-cache allocator: block tables, slot mapping and prefix caching (vLLM style).

One implementation serves the simulator and the real GPU backend, so it knows nothing of time.
A sequence owns a block table; the KV of its token at position p lives in slot
`block_table[p // block_size] * block_size + p % block_size`.

Prefix caching: every full block of a sequence's *shareable* prompt content (`Request.token_ids`)
gets a chained xxhash64 of (parent hash, token ids). A later sequence whose prompt starts with the
same tokens reuses those blocks (reference counted) instead of recomputing them; a hash match is
confirmed against the stored token ids, so a collision can never return different tokens. Freed
blocks go to the tail of an LRU free queue and keep their cached content until they are taken
again from the head. Prompt content that is unique to a request is never hashed: no other request
could hit it, and skipping it keeps replay of traces without prompt content fast.

Cost: only the blocks at *shareable* positions of a table (full blocks of `Request.token_ids`, with
prefix caching on) are reference counted one by one. The rest of a table (unique prompt content
and generated tokens) can never be shared: those blocks have exactly one owner, the table, and move
between the free queue and the tables as `array('i')` slices, so allocating and freeing a sequence
costs Python work per shared block, not per block. Misuse is still caught where it can be cheaply:
the allocator remembers which table it gave each sequence, so a sequence freed twice, one it never
allocated (another replica's, say) and a table replaced by hand are errors, and so is any
reference-count underflow at shareable positions. Only this class writes block tables; a table
edited in place is not detected (vLLM's BlockPool does not check that either). Checking every id
of every freed table against the pool cost 16% of a trace replay's instructions.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Sequence as Seq

import xxhash

from kvsim.sequence import Sequence

NO_HASH = -1


class AllocationError(RuntimeError):
    """Allocator misuse: a request the caller should have checked first, a double free, an unknown id."""


def block_hashes(token_ids, block_size: int) -> list[int]:
    """Chained xxhash64 of every full block of `token_ids` (the parent hash seeds the child's)."""
    return _hashed_blocks(token_ids, block_size)[0]


def _hashed_blocks(token_ids, block_size: int) -> tuple[list[int], list[bytes]]:
    """(chained hashes, token bytes) of every full block of `token_ids`."""
    data = token_ids.astype("<i4", copy=False).tobytes()
    step = 4 * block_size
    chunks = [data[i * step:(i + 1) * step] for i in range(len(token_ids) // block_size)]
    hashes, parent = [], 0
    for chunk in chunks:
        parent = xxhash.xxh64_intdigest(chunk, seed=parent)
        hashes.append(parent)
    return hashes, chunks


# Requests of a prefix group share one token_ids array: their block hashes are computed once.
CONTENT_CACHE_SIZE = 4096
COMPACT_AFTER = 4096  # popped entries a free-queue chunk may keep before they are deleted


class BlockManager:
    """Paged allocator over `num_blocks` blocks of `block_size` token slots."""

    external_fragmentation = 0.0  # any free block serves any sequence

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = [0] * num_blocks  # references to blocks at shareable table positions (0 elsewhere)
        self.block_hash = [NO_HASH] * num_blocks
        self.block_tokens: dict[int, bytes] = {}  # block id -> token bytes, for hashed blocks
        self.hash_to_block: dict[int, int] = {}
        # LRU free queue as [block ids, index of the next one, may hold hashed blocks] chunks (an
        # index, not deletions from the front, which would move the rest of a long chunk); ids
        # revived by a prefix hit stay in their chunk as stale entries (counted in `_stale`) and are
        # skipped when popped.
        self._free: deque[list] = deque([[array("i", range(num_blocks)), 0, False]])
        self._stale: dict[int, int] = {}
        self._content: dict[int, list] = {}  # id(token_ids) -> see _seq_content
        self._tables: dict[Sequence, Seq[int]] = {}  # the block table given to each holder of blocks
        self._num_evictions = 0
        self.num_free_blocks = num_blocks  # ref 0, cached content or not
        self.num_cached_blocks = 0  # ref 0 and still holding a hashed block (reusable)
        self._reserved = array("i")  # taken off the free queue for sequences that claim them later
        # Slots held but not (yet) written: the tails of last blocks, and reserved blocks. Tables
        # (and reservations) add their slots, written tokens take theirs off.
        self.reserved_unused_tokens = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_blocks(self, seq: Sequence) -> int:
        """Blocks the sequence holds once it has all its tokens."""
        return self.blocks_for(seq.request.prompt_len + seq.request.output_len)

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int = 0) -> int:
        bs = self.block_size
        need = -(-(seq.num_computed_tokens + num_new_tokens) // bs) - len(seq.block_table)  # hits are whole blocks
        return need if need > 0 else 0

    def free_block_ids(self) -> list[int]:
        """The free queue in LRU order (head first), stale entries skipped. For checks, not hot paths."""
        stale = dict(self._stale)
        out = []
        for chunk, start, _ in self._free:
            for b in chunk[start:]:
                if stale.get(b, 0):
                    stale[b] -= 1
                else:
                    out.append(b)
        return out

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- prefix caching ------------------------------------------------------------------
    def _num_shareable(self, seq: Sequence) -> int:
        """Table positions whose blocks may be shared: the full blocks of the shareable prompt."""
        ids = seq.request.token_ids
        return 0 if ids is None or not self.enable_prefix_caching else len(ids) // self.block_size

    def _seq_content(self, seq: Sequence) -> list:
        """This allocator's [token_ids, hashes, token bytes, hit-memo epoch, hit memo] for the
        sequence's shareable full blocks, shared by every sequence with the same token_ids array."""
        ids = seq.request.token_ids
        entry = self._content.get(id(ids))
        if entry is None or entry[0] is not ids:
            if seq.block_hashes is None:  # kept on the sequence for the other replicas' allocators
                seq.block_hashes = _hashed_blocks(ids, self.block_size)
            if len(self._content) >= CONTENT_CACHE_SIZE:
                del self._content[next(iter(self._content))]
            entry = [ids, *seq.block_hashes, -1, None]
            self._content[id(ids)] = entry  # the entry keeps `ids` alive, so its id stays unique
        return entry

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of the sequence's prompt (at least one token is left to compute)."""
        if not self.enable_prefix_caching or seq.request.token_ids is None or seq.block_table:
            return []
        entry = self._seq_content(seq)
        _, hashes, chunks, epoch, memo = entry
        limit = min(len(hashes), (seq.num_tokens - 1) // self.block_size)
        if epoch == self._num_evictions:  # every block was a hit and none has been evicted since
            return memo[:limit]
        hits = []
        lookup, stored = self.hash_to_block.get, self.block_tokens
        for i in range(limit):
            block = lookup(hashes[i])
            if block is None or stored[block] != chunks[i]:
                break  # a miss, or a hash collision (different tokens): not a hit
            hits.append(block)
        if len(hits) == len(hashes):  # hash -> block mappings only go away by eviction
            entry[3], entry[4] = self._num_evictions, hits
        return hits

    def _register_full_blocks(self, seq: Sequence, start_block: int, end_tokens: int) -> None:
        """Hash the sequence's blocks that become full of shareable tokens up to `end_tokens`."""
        _, hashes, chunks, _, _ = self._seq_content(seq)
        stop = min(len(hashes), end_tokens // self.block_size)
        for i in range(start_block, stop):
            block, h = seq.block_table[i], hashes[i]
            if self.block_hash[block] != NO_HASH or h in self.hash_to_block:
                continue  # already cached, or another block holds the same content
            self.block_hash[block] = h
            self.hash_to_block[h] = block
            self.block_tokens[block] = chunks[i]

    # ---- allocation ----------------------------------------------------------------------
    def _num_revived(self, blocks: Seq[int]) -> int:
        ref = self.ref_cnt
        return list(map(ref.__getitem__, blocks)).count(0) if blocks else 0

    def _fits(self, need: int, computed_blocks: Seq[int]) -> bool:
        """Are `need` new blocks free, besides the cached hits that leave the free queue?"""
        return need + self._num_revived(computed_blocks) <= self.num_free_blocks

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool:
        return self._fits(self.num_blocks_needed(seq, num_new_tokens, len(computed_blocks)), computed_blocks)

    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> None:
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
            ref, stale = self.ref_cnt, self._stale
            for b in computed_blocks:
                if ref[b] == 0:  # a cached block revived from the free queue: its entry there goes stale
                    stale[b] = stale.get(b, 0) + 1
                    self.num_free_blocks -= 1
                    self.num_cached_blocks -= 1
                ref[b] += 1
            hit_tokens = len(computed_blocks) * self.block_size
            self._tables[seq] = seq.block_table
            seq.block_table.extend(computed_blocks)
            seq.num_computed_tokens = hit_tokens
            seq.num_cached_tokens += hit_tokens
        self._grow(seq, num_new_tokens, need)

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Slots for a running sequence's next tokens (decode, or the next prefill chunk)."""
        need = self.num_blocks_needed(seq, num_new_tokens)
        if need > self.num_free_blocks:
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks to append {num_new_tokens} tokens")
        self._grow(seq, num_new_tokens, need)

    def _grow(self, seq: Sequence, num_new_tokens: int, need: int) -> None:
        if not seq.block_table:
            self.reserved_unused_tokens -= seq.num_computed_tokens  # a swapped-in sequence brings its KV back
        first_new_block = seq.num_computed_tokens // self.block_size
        if need:
            self._adopt(seq, self._pop_free(need))
        self.reserved_unused_tokens += need * self.block_size - num_new_tokens
        if first_new_block < self._num_shareable(seq):
            self._register_full_blocks(seq, first_new_block, seq.num_computed_tokens + num_new_tokens)

    def _adopt(self, seq: Sequence, new: Seq[int]) -> None:
        """Append blocks taken off the free queue to the sequence's table, one reference each."""
        table = seq.block_table
        if not table:
            self._tables[seq] = table
        shared = self._num_shareable(seq) - len(table)  # how many land at shareable positions
        if shared > 0:
            ref = self.ref_cnt
            for b in new[:shared]:
                ref[b] = 1
        table.extend(new)

    def reserve(self, n: int) -> None:
        """Take n blocks off the free queue now (LRU order, evicting as usual) for `claim` later."""
        if n > self.num_free_blocks:
            raise AllocationError(f"cannot reserve {n} blocks, {self.num_free_blocks} are free")
        if n:
            self._reserved.extend(self._pop_free(n))
            self.reserved_unused_tokens += n * self.block_size

    def claim(self, seq: Sequence) -> None:
        """Move reserved blocks into the sequence's table until it covers its computed tokens."""
        need = self.blocks_for(seq.num_computed_tokens) - len(seq.block_table)
        if need > len(self._reserved):
            raise AllocationError(f"sequence {seq.seq_id}: claims {need} blocks, {len(self._reserved)} reserved")
        if need > 0:
            new = self._reserved[:need]
            del self._reserved[:need]
            self._adopt(seq, new)

    @property
    def num_reserved_blocks(self) -> int:
        return len(self._reserved)

    def note_written(self, num_tokens: int) -> None:
        """Account tokens written into slots the sequences already hold (the scheduler's fast path)."""
        self.reserved_unused_tokens -= num_tokens

    def deallocate(self, seq: Sequence) -> None:
        """Release the sequence's blocks; the ones holding cached content stay reusable until evicted."""
        table = seq.block_table
        if not table:
            raise AllocationError(f"sequence {seq.seq_id}: nothing to free (double free?)")
        if self._tables.get(seq) is not table:
            raise AllocationError(f"sequence {seq.seq_id}: its block table was not allocated here")
        shared = min(len(table), self._num_shareable(seq))
        freed = self._release_shared(seq, table[:shared]) if shared else []
        private = table[shared:] if shared else table
        # Tail blocks go first, so they are evicted first (as vLLM).
        if private:
            self._free_private(private[::-1])
        if freed:
            self._free.append([freed, 0, True])
            self.num_cached_blocks += sum(1 for b in freed if self.block_hash[b] != NO_HASH)
        self.num_free_blocks += len(private) + len(freed)
        self.reserved_unused_tokens -= len(table) * self.block_size - seq.num_computed_tokens
        del self._tables[seq]
        seq.block_table = array("i")
        seq.num_computed_tokens = 0

    def _release_shared(self, seq: Sequence, blocks: Seq[int]) -> list[int]:
        """Drop a reference to each block (all or none); returns those now free, tail first."""
        ref, freed = self.ref_cnt, []
        for i, b in enumerate(blocks):
            left = ref[b] - 1
            if left < 0:
                for undo in blocks[:i]:
                    ref[undo] += 1
                raise AllocationError(f"sequence {seq.seq_id}: its block table holds block {b}, which is free")
            ref[b] = left
            if not left:
                freed.append(b)
        freed.reverse()
        return freed

    # ---- free queue ----------------------------------------------------------------------
    def _free_private(self, blocks: array) -> None:
        """Queue blocks that hold no cached content; they join an unhashed tail chunk, so the
        queue stays a few long chunks and most pops take the one-slice path of _pop_free."""
        free = self._free
        tail = free[-1] if free else None
        if tail is None or tail[2]:
            free.append([blocks, 0, False])
            return
        chunk, start = tail[0], tail[1]
        if start > COMPACT_AFTER and 2 * start > len(chunk):  # drop the popped front now and then
            del chunk[:start]
            tail[1] = 0
        chunk.extend(blocks)

    def _pop_free(self, n: int) -> Seq[int]:
        head = self._free[0]
        chunk, start, may_hash = head
        if not may_hash and len(chunk) - start > n:  # the common case: one chunk of unhashed blocks
            head[1] = start + n
            self.num_free_blocks -= n
            return chunk[start:start + n]
        out = array("i")
        hashed: list[int] = []  # taken from chunks that may hold hashed (or stale) blocks
        while len(out) < n:
            head = self._free[0]
            chunk, start, may_hash = head
            end = min(len(chunk), start + n - len(out))
            take = chunk[start:end]
            if end == len(chunk):
                self._free.popleft()
            else:
                head[1] = end
            if may_hash:
                if self._stale and not self._stale.keys().isdisjoint(take):
                    take = self._drop_stale(take)
                hashed.extend(take)
            out.extend(take)
        self.num_free_blocks -= n
        if hashed and self.num_cached_blocks:
            for b in self.block_tokens.keys() & hashed:  # set arithmetic in C
                self._evict(b)
        return out

    def _drop_stale(self, entries: list[int]) -> list[int]:
        # A revived block's queue entry is older than any entry from a later free, so the first
        # entries popped for a block are its stale ones.
        fresh = []
        for b in entries:
            count = self._stale.get(b, 0)
            if count == 0:
                fresh.append(b)
            elif count == 1:
                del self._stale[b]
            else:
                self._stale[b] = count - 1
        return fresh

    def _evict(self, block: int) -> None:
        self._num_evictions += 1
        h = self.block_hash[block]
        del self.hash_to_block[h]
        del self.block_tokens[block]
        self.block_hash[block] = NO_HASH
        self.num_cached_blocks -= 1
