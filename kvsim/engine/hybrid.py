"""The hybrid KV cache allocator: vLLM V1's KV cache groups sharing one block pool (v0.11.0).

A model whose layers keep different spans of the context (sliding-window layers beside full ones:
gemma-2/3, gpt-oss; or sliding-window layers alone: Mistral-7B-v0.1) is laid out by vLLM in KV
cache groups (kvsim.perf.kv_groups), each with its own block table per sequence, all drawing on one
pool. `HybridBlockManager` is that pool and those tables, with the semantics of its executable
specification `kvsim.engine.hybrid_reference.HybridReference` (read it first: the rules mirrored
from vLLM v0.11.0 are listed there) and the speed of `BlockManager`:

- a sliding-window group frees the blocks that left the window (`_skip`, vLLM's
  remove_skipped_blocks) before each step's slots are taken; every group of a sequence holds a
  table position per block of its tokens, the sliding ones a null prefix of `skipped` positions;
- blocks at *shareable* positions (full blocks of `Request.token_ids`) are reference counted and
  registered per group under their chained identities (`prefix_cache.block_hashes`), an index entry
  per block and group; whether a block still holds what was registered is read lazily from
  `BlockContent` (no work per block when blocks are evicted);
- blocks of *unique* content (the rest of a prompt, generated tokens) are neither counted nor
  registered: only their own sequence can hit them, after a preemption, and the free queue's log
  positions tell whether they are still free. A preempted sequence is *parked* with the positions of
  its freed blocks: its last table per group, and its last release of blocks that left the window
  (an older one cannot serve a hit: the window a hit needs ends where the full-attention hit ends,
  and when a full-attention block of the sequence has been evicted, every block it released before
  has been too, the queue being first in, first out for unique content);
- tables move to and from the free queue as array slices; the decode cohort's blocks are reserved
  at once and claimed by members when they leave, and a member's releases while in the cohort take
  positions it has not claimed yet from the reserved blocks (the reference's conventions).
"""

from __future__ import annotations

from array import array

from kvsim.engine.block_manager import AllocationError, identities
from kvsim.engine.free_queue import FreeBlockQueue
from kvsim.engine.hybrid_reference import NULL, HybridHit, contiguous_needed, sliding_window
from kvsim.engine.prefix_cache import BlockContent, ChainMemo, sequence_chain
from kvsim.sequence import Sequence

SWEEP_AT = 4096  # index entries per group before the first sweep of those no longer valid


class HybridTable:
    """One sequence's block tables, a position per block in every group (`NULL` or a stale id below
    `skipped` in the sliding ones), and what it registered and released."""

    __slots__ = ("tables", "skipped", "registered", "shared", "last")

    def __init__(self, num_groups: int, shared: int):
        self.tables = [array("i") for _ in range(num_groups)]
        self.skipped = 0  # sliding groups: leading positions whose blocks left the window (or a hit's nulls)
        self.registered = 0  # positions registered (cached) so far
        self.shared = shared  # shareable positions (prefix caching on)
        self.last: tuple = ()  # the last release's unique blocks: (first position, end, queue position per group)


class _Parked:
    """A preempted sequence's freed unique blocks that may still be cached: per group, the last
    table's (first position, end of full blocks, table length, queue position of its tail block), and
    the last release (HybridTable.last)."""

    __slots__ = ("final", "last")

    def __init__(self, final: list, last: tuple):
        self.final, self.last = final, last


class HybridBlockManager:
    """Paged allocator over `num_blocks` blocks of `block_size` slots, shared by KV cache groups;
    `windows[g]`: group g's sliding window (0: it keeps the whole context)."""

    external_fragmentation = 0.0
    grows = True

    def __init__(self, num_blocks: int, block_size: int, windows: tuple[int, ...], enable_prefix_caching: bool = True,
                 max_num_batched_tokens: int = 1 << 30):
        self.window = sliding_window(num_blocks, block_size, windows)
        self.num_blocks, self.block_size, self.windows = num_blocks, block_size, tuple(windows)
        self.enable_prefix_caching, self.max_num_batched_tokens = enable_prefix_caching, max_num_batched_tokens
        self.num_groups = len(windows)
        self.full_groups = [g for g, w in enumerate(windows) if not w]
        self.window_groups = [g for g, w in enumerate(windows) if w]
        self._one_window = self.window_groups[0] if len(self.window_groups) == 1 else -1  # release()'s fast path
        self.queue = FreeBlockQueue(num_blocks, enable_prefix_caching)
        self.content = BlockContent()
        self.index: list[dict[int, list]] = [{} for _ in windows]  # identity -> [(block, serial), ...]
        self._entries, self._sweep_at, self._serial = 0, SWEEP_AT, 0
        self._chains = ChainMemo(block_size, identities)
        self._tables: dict[Sequence, HybridTable] = {}
        self._parked: dict[Sequence, _Parked] = {}
        self._reserved, self._reserved_at = array("i"), 0
        self.reserved_unused_tokens = 0
        self._full_shared_refs = 0  # references past a block's first holder, in the full-attention groups

    @property
    def num_shared_refs(self) -> int:
        """References past a block's first holder in the full-attention layers, per group: the shared
        tokens a decode step reads once (a window's reads are priced apart, and shift as it releases)."""
        return self._full_shared_refs // len(self.full_groups) if self.full_groups else 0

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.queue.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.queue.num_free

    @property
    def num_cached_blocks(self) -> int:
        return self.queue.num_cached

    def block_counts(self) -> tuple[int, int, int]:
        q = self.queue
        return self.num_blocks - q.num_free, q.num_cached, q.num_free

    def evictions_ahead(self, counts) -> list[int]:
        return self.queue.cached_ahead(counts)

    def free_block_ids(self) -> list[int]:
        return self.queue.block_ids()

    def blocks_for(self, num_tokens: int) -> int:
        return self.num_groups * -(-num_tokens // self.block_size)

    def peak_blocks(self, seq: Sequence) -> int:
        """The most blocks the sequence can hold at once (vLLM's max_memory_usage_bytes at its length)."""
        total, bs = seq.request.prompt_len + seq.request.output_len, self.block_size
        whole = -(-total // bs)
        part = min(whole, -(-min(self.window - 1 + self.max_num_batched_tokens, total) // bs) + 1)
        return len(self.full_groups) * whole + len(self.window_groups) * part

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        ht = self._tables.get(seq)
        if ht is None:
            return self.num_groups * need
        return sum(need - len(t) for t in ht.tables if len(t) < need)

    def table(self, seq: Sequence) -> HybridTable:
        return self._tables[seq]

    def next_release(self, seq: Sequence) -> int:
        """The computed token count at which the sequence's windowed groups next free a block."""
        return self.window - 1 + self.block_size * (self._tables[seq].skipped + 1)

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, self._tables[seq].tables[0]
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- the pool --------------------------------------------------------------------------------
    def _take(self, n: int) -> array:
        queue = self.queue
        if queue.high_water + n > len(self.content.ref) and queue.high_water < self.num_blocks:
            self.content.grow(min(self.num_blocks, queue.high_water + n))
        return queue.pop(n)

    def _reserved_front(self, n: int) -> array:
        """The first n reserved blocks, handed out."""
        at = self._reserved_at
        if n > len(self._reserved) - at:
            raise AllocationError(f"claims {n} blocks, {len(self._reserved) - at} reserved")
        out = self._reserved[at:at + n]
        self._reserved_at = at + n
        if self._reserved_at > 1024 and 2 * self._reserved_at > len(self._reserved):
            del self._reserved[:self._reserved_at]
            self._reserved_at = 0
        return out

    @property
    def num_reserved_blocks(self) -> int:
        return len(self._reserved) - self._reserved_at

    def _free_unique(self, blocks: array, num_uncached: int) -> int:
        """Queue unique-content blocks (eviction order); their first queue position."""
        if self.enable_prefix_caching:
            return self.queue.append(blocks, num_uncached)
        self.queue.append_uncached(blocks)
        return -1

    def _free_shared(self, seq: Sequence, g: int, blocks: array, num_uncached: int) -> None:
        """A reference less to each of group g's `blocks` (shareable positions); those now free join the queue."""
        try:
            freed = self.content.release(blocks)
        except ValueError as err:
            raise AllocationError(f"sequence {seq.seq_id}: its block table {err}") from None
        if not self.windows[g]:
            self._full_shared_refs -= len(blocks) - len(freed)
        if freed:
            pos = self.queue.append(freed, min(num_uncached, len(freed)))
            self.content.set_positions(freed, pos)

    # ---- prefix caching --------------------------------------------------------------------------
    def _register(self, ht: HybridTable, chain, upto: int) -> None:
        """Index the shareable blocks at positions [registered, upto) of every group."""
        lo, hi = ht.registered, min(upto, ht.shared)
        if hi > lo:
            self._serial += 1
            serial, content = self._serial, self.content
            for g, index in enumerate(self.index):
                table = ht.tables[g]
                blocks = table[lo:hi]
                content.register(blocks, serial)
                for j in range(lo, hi):
                    index.setdefault(chain[j], []).append((table[j], serial))
            self._entries += (hi - lo) * self.num_groups
            if self._entries > self._sweep_at:
                self._sweep()
        if upto > ht.registered:
            ht.registered = upto

    def _shared_block(self, g: int, identity: int) -> int:
        """The first registered block still holding `identity` in group g (NULL: none)."""
        entries = self.index[g].get(identity)
        if not entries:
            return NULL
        content, head = self.content, self.queue.head
        while entries:
            block, serial = entries[0]
            if content.holds(block, serial, head):
                return block
            entries.pop(0)
            self._entries -= 1
        del self.index[g][identity]
        return NULL

    def _sweep(self) -> None:
        content, head = self.content, self.queue.head
        self._entries = 0
        for index in self.index:
            for key in list(index):
                live = [e for e in index[key] if content.holds(e[0], e[1], head)]
                if live:
                    index[key] = live
                    self._entries += len(live)
                else:
                    del index[key]
        self._sweep_at = max(SWEEP_AT, 2 * self._entries)

    def _own_position(self, parked: _Parked | None, g: int, p: int) -> int:
        """The queue position of the sequence's own freed block at table position p of group g, if it is
        still free (-1: not free, or never freed with its content)."""
        if parked is None:
            return -1
        head = self.queue.head
        lo, hi, n, tail = parked.final[g]
        if lo <= p < hi and tail + n - 1 - p >= head:
            return tail + n - 1 - p
        if parked.last and g in parked.last[2]:
            lo, hi, at = parked.last[0], parked.last[1], parked.last[2][g]
            if lo <= p < hi and at + hi - 1 - p >= head:
                return at + hi - 1 - p
        return -1

    def _cached(self, g: int, p: int, chain, shared: int, parked) -> tuple[int, int]:
        """(block, queue position if it is one of the sequence's own freed blocks, else -1) cached at
        position p of group g; block NULL when none."""
        if p < shared:
            return self._shared_block(g, chain[p]), -1
        pos = self._own_position(parked, g, p)
        return (self.queue.block_at(pos), pos) if pos >= 0 else (NULL, -1)

    def get_computed_blocks(self, seq: Sequence):
        """vLLM v0.11.0's find_longest_cache_hit over the groups (see hybrid_reference)."""
        if not self.enable_prefix_caching or seq in self._tables:
            return ()
        parked = self._parked.get(seq)
        ids = seq.request.token_ids
        if ids is None and parked is None:
            return ()
        chain = sequence_chain(seq, self._chains) if ids is not None else ()
        shared = min(len(chain), len(ids) // self.block_size) if ids is not None else 0
        limit = (seq.num_tokens - 1) // self.block_size
        found: dict = {}
        length = self._full_hit(found, limit, chain, shared, parked) if self.full_groups else limit
        length = self._window_hit(found, length, chain, shared, parked)
        if not length:
            return ()
        hit = HybridHit(array("i", (found[g, p][0] if (g, p) in found else NULL for p in range(length)))
                        for g in range(self.num_groups))
        hit.own = [found[g, p][1] for g in range(self.num_groups) for p in range(length)
                   if (g, p) in found and found[g, p][1] >= 0]
        hit.shared = shared
        return hit

    def _full_hit(self, found: dict, limit: int, chain, shared: int, parked) -> int:
        """The full-attention groups' longest run of cached blocks from the first."""
        for p in range(limit):
            got = [self._cached(g, p, chain, shared, parked) for g in self.full_groups]
            if any(b == NULL for b, _ in got):
                return p
            found.update(((g, p), x) for g, x in zip(self.full_groups, got))
        return limit

    def _window_hit(self, found: dict, limit: int, chain, shared: int, parked) -> int:
        """Within `limit` blocks, the sliding groups' run of contiguous cached blocks (searched from the
        right), or the run from the first block; drops what lies past it."""
        need, run, groups = contiguous_needed(self.window, self.block_size), 0, self.window_groups
        for p in range(limit - 1, -1, -1):
            got = [self._cached(g, p, chain, shared, parked) for g in groups]
            if any(b == NULL for b, _ in got):
                run = 0
                continue
            found.update(((g, p), x) for g, x in zip(groups, got))
            run += 1
            if run >= need:  # positions before p stay null; entries past p + run are not read
                return p + run
        return run

    def _revive(self, seq: Sequence, ht: HybridTable, hit: HybridHit) -> None:
        """The hit blocks become the sequence's: shareable ones take a reference, its own leave the queue."""
        n_shared = min(len(hit), hit.shared)
        for g in range(self.num_groups):
            live = array("i", (b for b in hit[g][:n_shared] if b != NULL))
            if live:
                free = self.content.acquire(live)
                if len(free):
                    self.queue.remove_positions(free)
                if not self.windows[g]:
                    self._full_shared_refs += len(live) - len(free)
            ht.tables[g].extend(hit[g])
        if hit.own:
            self.queue.remove_positions(list(hit.own))
        self._parked.pop(seq, None)

    def free_hits(self, hit) -> int:
        """How many of a prefix hit's blocks are free (cached in the free queue) now."""
        return self._num_revived(hit) if len(hit) else 0

    def _num_revived(self, hit: HybridHit) -> int:
        """How many of the hit blocks are free now (they leave the free queue, so they count as taken)."""
        n_shared = min(len(hit), hit.shared)
        shared = [b for g in range(self.num_groups) for b in hit[g][:n_shared] if b != NULL]
        return (self.content.count_free(array("i", shared)) if shared else 0) + len(hit.own)

    # ---- allocation --------------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> bool:
        if seq in self._tables or seq.num_computed_tokens:
            raise AllocationError(f"sequence {seq.seq_id}: the hybrid allocator has no swap-in")
        hit = len(computed_blocks)
        need = self.num_groups * (-(-(hit * self.block_size + num_new_tokens) // self.block_size) - hit)
        if hit:
            need += self._num_revived(computed_blocks)
        return need <= self.queue.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> None:
        if not self.can_allocate(seq, num_new_tokens, computed_blocks):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks for {num_new_tokens} tokens")
        ids = seq.request.token_ids
        shared = len(ids) // self.block_size if ids is not None and self.enable_prefix_caching else 0
        ht = self._tables[seq] = HybridTable(self.num_groups, shared)
        seq.block_table = ht
        hit = len(computed_blocks)
        if hit:
            ht.skipped = next((p for p in range(hit) if computed_blocks[self.window_groups[0]][p] != NULL), hit)
            self._revive(seq, ht, computed_blocks)
            ht.registered = hit
            seq.num_computed_tokens = hit * self.block_size
            seq.num_cached_tokens += seq.num_computed_tokens
        self._parked.pop(seq, None)
        if hit or shared:
            self._grow(seq, ht, num_new_tokens)
            return
        # the usual admission (nothing cached, nothing shareable): every group's blocks in one take
        bs, groups = self.block_size, self.num_groups
        need = -(-num_new_tokens // bs)
        new = self._take(groups * need)
        ht.tables = [new[g * need:(g + 1) * need] for g in range(groups)]
        self.reserved_unused_tokens += groups * (need * bs - num_new_tokens)
        ht.registered = min(num_new_tokens, seq.num_tokens) // bs

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """allocate_slots' check, after its remove_skipped_blocks (which frees even when it fails)."""
        ht = self._tables[seq]
        self._skip(seq, ht, seq.num_computed_tokens)
        return self.num_blocks_needed(seq, num_new_tokens) <= self.queue.num_free

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        if not self.can_append(seq, num_new_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks to append {num_new_tokens} tokens")
        self._grow(seq, self._tables[seq], num_new_tokens)

    def _grow(self, seq: Sequence, ht: HybridTable, num_new_tokens: int) -> None:
        bs, computed = self.block_size, seq.num_computed_tokens
        need = -(-(computed + num_new_tokens) // bs)
        wants = [need - len(table) for table in ht.tables]
        taken = sum(wants) if min(wants) >= 0 else sum(n for n in wants if n > 0)
        if taken:  # every group's blocks in one take, group 0's first (as group by group)
            new, at = self._take(taken), 0
            for table, n in zip(ht.tables, wants):
                if n > 0:
                    part = new[at:at + n] if n < taken else new
                    at += n
                    lo = len(table)
                    if lo < ht.shared:
                        self.content.hold(part[:ht.shared - lo])
                    table.extend(part)
        self.reserved_unused_tokens += taken * bs - self.num_groups * num_new_tokens
        upto = min(computed + num_new_tokens, seq.num_tokens) // bs
        if upto > ht.registered:
            if ht.registered < ht.shared:
                self._register(ht, sequence_chain(seq, self._chains), upto)
            else:
                ht.registered = upto

    def _skip(self, seq: Sequence, ht: HybridTable, num_computed_tokens: int) -> int:
        """remove_skipped_blocks: the windowed groups free their blocks wholly before the window, the
        last first, group by group (positions a cohort member has not claimed take reserved blocks).
        Returns the blocks freed."""
        lo, hi = ht.skipped, (num_computed_tokens - self.window + 1) // self.block_size
        if hi <= lo:
            return 0
        if lo >= ht.shared and len(self.window_groups) == 1:
            return self._skip_unique(ht, lo, hi)
        shared, freed, last = ht.shared, 0, {}
        for g in self.window_groups:
            table = ht.tables[g]
            unique = array("i")
            if hi > len(table):  # a cohort member's blocks not claimed yet
                unique = self._reserved_front(hi - len(table))
                table.extend(array("i", [NULL]) * (hi - len(table)))
            mid = max(lo, shared)
            if mid < hi:
                part = table[mid:min(hi, len(table) - len(unique))]
                part.reverse()
                unique.extend(part)
                last[g] = self._free_unique(unique, 0)
                freed += len(unique)
            if lo < min(hi, shared):
                before = self.queue.num_free
                self._free_shared(seq, g, table[lo:min(hi, shared)], 0)
                freed += self.queue.num_free - before
        ht.skipped = hi
        if last and self.enable_prefix_caching:
            ht.last = (max(lo, shared), hi, last)
        return freed

    def _skip_unique(self, ht: HybridTable, lo: int, hi: int) -> int:
        """_skip's usual case, one windowed group and unique content only (the decode cohort's releases)."""
        g = self.window_groups[0]
        table = ht.tables[g]
        n = len(table)
        if hi > n:  # a cohort member's blocks not claimed yet: reserved ones, the last position first
            unique = self._reserved_front(hi - n)
            if n > lo:
                part = table[lo:n]
                part.reverse()
                unique.extend(part)
            table.extend(array("i", [NULL]) * (hi - n))
        else:
            unique = table[lo:hi]
            unique.reverse()
        ht.skipped = hi
        if self.enable_prefix_caching:
            ht.last = (lo, hi, {g: self.queue.append(unique, 0)})
        else:
            self.queue.append_uncached(unique)
        return len(unique)

    def release(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, int]:
        """A cohort member's remove_skipped_blocks at its count `num_computed_tokens`: (blocks freed, the
        count at which it next frees). The usual release (one windowed group, unique content, one
        block: the position's own or, when the table ends there, the first reserved one) is inline."""
        ht = self._tables[seq]
        lo = ht.skipped
        g, w, bs = self._one_window, self.window, self.block_size
        if g < 0 or lo < ht.shared or (num_computed_tokens - w + 1) // bs != lo + 1:
            freed = self._skip(seq, ht, num_computed_tokens)
            return freed, w - 1 + bs * (ht.skipped + 1)
        table = ht.tables[g]
        n = len(table)
        if n > lo:
            block = table[lo]
        elif n == lo:
            block = self._reserved_one()
            table.append(NULL)
        else:
            return self._skip_unique(ht, lo, lo + 1), w - 1 + bs * (lo + 2)
        ht.skipped = lo + 1
        if self.enable_prefix_caching:
            ht.last = (lo, lo + 1, {g: self.queue.append_one(block)})
        else:
            self.queue.append_one(block)
        return 1, w - 1 + bs * (lo + 2)

    def _reserved_one(self) -> int:
        """The first reserved block, handed out."""
        at = self._reserved_at
        if at >= len(self._reserved):
            raise AllocationError("claims 1 blocks, 0 reserved")
        self._reserved_at = at + 1
        return self._reserved[at]

    def reserve(self, n: int) -> None:
        if n > self.queue.num_free:
            raise AllocationError(f"cannot reserve {n} blocks, {self.queue.num_free} are free")
        if n:
            self._reserved += self._take(n)
            self.reserved_unused_tokens += n * self.block_size

    def claim(self, seq: Sequence, num_tokens: int = -1) -> None:
        """Reserved blocks into the member's tables, position by position and group by group, until
        they cover its computed tokens."""
        ht, need = self._tables[seq], -(-seq.num_computed_tokens // self.block_size)
        wants = [need - len(t) for t in ht.tables]
        want = sum(wants) if min(wants) >= 0 else sum(n for n in wants if n > 0)
        if want > self.num_reserved_blocks:
            raise AllocationError(f"sequence {seq.seq_id}: claims {want} blocks, {self.num_reserved_blocks} reserved")
        if want:  # one slice of the reserved blocks, group 0's part first (as group by group)
            blocks, at = self._reserved_front(want), 0
            for table, n in zip(ht.tables, wants):
                if n > 0:
                    table.extend(blocks[at:at + n])
                    at += n
        if need > ht.registered:
            ht.registered = seq.num_computed_tokens // self.block_size  # unique content: nothing to index

    def note_written(self, num_tokens: int) -> None:
        self.reserved_unused_tokens -= self.num_groups * num_tokens

    # ---- freeing -----------------------------------------------------------------------------------
    def deallocate(self, seq: Sequence) -> None:
        """Free every group's live blocks, group by group, each tail first; park a sequence that will
        come back (preempted) with where its unique blocks went."""
        ht = self._tables.get(seq)
        if ht is None or seq.block_table is not ht:
            raise AllocationError(f"sequence {seq.seq_id}: its block table was not allocated here")
        computed, bs = seq.num_computed_tokens, self.block_size
        full = computed // bs
        final = [self._free_table(seq, ht, g, full) for g in range(self.num_groups)] if ht.shared \
            else [self._free_unique_table(ht.tables[g], ht.skipped if w else 0, full) for g, w in enumerate(self.windows)]
        # a null prefix holds as many slots as tokens, so every group's unused slots are its tail's
        self.reserved_unused_tokens -= sum(map(len, ht.tables)) * bs - self.num_groups * computed
        del self._tables[seq]
        if self.enable_prefix_caching and seq.num_output_tokens < seq.request.output_len:
            self._parked[seq] = _Parked(final, ht.last)
        else:
            self._parked.pop(seq, None)
        seq.block_table = array("i")
        seq.num_computed_tokens = 0

    def _free_unique_table(self, table: array, lo: int, full: int) -> tuple:
        """_free_table for a table of unique content only (from position lo on)."""
        n = len(table)
        end = max(lo, min(full, n))
        if lo >= n:
            return lo, end, n, -1
        unique = table[lo:]
        unique.reverse()
        if self.enable_prefix_caching:
            return lo, end, n, self.queue.append(unique, n - end)
        self.queue.append_uncached(unique)
        return lo, end, n, -1

    def _free_table(self, seq: Sequence, ht: HybridTable, g: int, full: int) -> tuple:
        """Free group g's live blocks (unique ones first: the tail); returns the parking record of its
        unique full blocks: (first position, end, table length, queue position of the tail block)."""
        table = ht.tables[g]
        n, lo, shared = len(table), (ht.skipped if self.windows[g] else 0), ht.shared
        mid = max(lo, shared)
        tail = -1
        if mid < n:
            unique = table[mid:]
            unique.reverse()
            tail = self._free_unique(unique, n - max(mid, min(full, n)))
        if lo < min(n, shared):
            self._free_shared(seq, g, table[lo:min(n, shared)], max(0, min(n, shared) - max(full, lo)))
        return mid, max(mid, min(full, n)), n, tail
