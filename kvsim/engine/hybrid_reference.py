"""The hybrid allocator's executable specification: vLLM v0.11.0's KV cache coordinator, written plainly.

`HybridReference` is a `KVAllocator` (kvsim.engine.interfaces) for a KV cache laid out in several
KV cache groups (kvsim.perf.kv_groups) sharing one block pool, with the semantics `HybridBlockManager`
implements and none of its speed machinery (vLLM v0.11.0: `kv_cache_coordinator.py`,
`single_type_kv_cache_manager.py`, `block_pool.py`, `kv_cache_manager.allocate_slots`):

- every group has its own block table per sequence; a group of sliding-window layers (window w)
  holds a null entry (-1) for each block that left the window. Before a step's slots are taken,
  `remove_skipped_blocks` frees the blocks wholly before token `computed - w + 1` (group by group,
  each group's from the last to the first), even when the step then cannot be scheduled;
- a step's new slots are taken group by group (each group's blocks from the free queue's head);
- every full block of every group is cached under (content key, group) when the step that fills it
  is scheduled (keys: `reference_pool.ContentKeys`); freed tables join the queue's tail group by
  group, each tail block first;
- a prefix hit (`find_longest_cache_hit`, at most num_tokens - 1 tokens): the full-attention groups'
  longest run of blocks cached in every one of them from the first block; then, within that, the
  sliding groups search from the right for ceil((w - 1) / block_size) contiguous blocks cached in
  every one of them (else the contiguous run from the first block); the hit is that length, the
  sliding groups holding nulls before their run. A model whose every group is sliding uses the
  second search alone (vLLM's unitary coordinator);
- the decode cohort's conventions (kvsim's, as `ReferencePool`'s): `reserve` takes blocks off the
  head for members that `claim` them, table position by table position, group by group, when they
  leave; `release(seq, computed)` is a member's `remove_skipped_blocks` while in the cohort, a
  position not yet claimed taking its block from the reserved ones first.

vLLM takes one block of the pool as its null block; kvsim does not (as `BlockManager`). Every
operation costs O(blocks): this is the specification the fast allocator is checked against (block
for block by a Hypothesis machine in tests/test_hybrid.py), not an allocator to simulate with.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsim.engine.block_manager import AllocationError
from kvsim.engine.reference_pool import ContentKeys, FreeListFigures
from kvsim.sequence import Sequence

NULL = -1  # vLLM's null block: a table entry whose block left the window


def contiguous_needed(window: int, block_size: int) -> int:
    """Blocks a sliding-window prefix hit must end with (vLLM's sliding_window_contiguous_blocks)."""
    return -(-(window - 1) // block_size)


class HybridHit(list):
    """A prefix hit: one list of block ids per group (NULL where a sliding group holds none), each as
    long as the hit; `len()` is the hit's blocks, as the scheduler reads any allocator's hits."""

    def __len__(self) -> int:
        return len(self[0]) if list.__len__(self) else 0


def sliding_window(num_blocks: int, block_size: int, windows: tuple[int, ...]) -> int:
    """The one window of a layout's sliding groups (vLLM v0.11.0 allows one), the pool's arguments checked."""
    if num_blocks <= 0 or block_size <= 0 or not windows:
        raise ValueError("num_blocks, block_size and the groups must be given")
    sliding = {w for w in windows if w}
    if len(sliding) != 1:
        raise ValueError(f"one sliding window for the windowed groups (vLLM v0.11.0), got {sorted(sliding)}")
    return sliding.pop()


class HybridReference(FreeListFigures):
    def __init__(self, num_blocks: int, block_size: int, windows: tuple[int, ...], enable_prefix_caching: bool = True,
                 max_num_batched_tokens: int = 1 << 30):
        self.window = sliding_window(num_blocks, block_size, windows)  # the sliding groups' window
        self.num_blocks, self.block_size, self.windows = num_blocks, block_size, tuple(windows)
        self.enable_prefix_caching, self.max_num_batched_tokens = enable_prefix_caching, max_num_batched_tokens
        self.num_groups = len(self.windows)
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref = [0] * num_blocks
        self.key: list = [None] * num_blocks  # (content key, group) a block holds, None: nothing reusable
        self.cached: dict[tuple, dict[int, None]] = {}  # (key, group) -> blocks, first registered first
        self.tables: dict[Sequence, list[list[int]]] = {}
        self.registered: dict[Sequence, int] = {}  # blocks of each table cached so far
        self.reserved: list[int] = []
        self.written = 0  # tokens written into live slots (each group's), and into reserved ones
        self.keys = ContentKeys(block_size)

    # ---- the pool -------------------------------------------------------------------------------
    def _take(self) -> int:
        block, _ = self.free.popitem(last=False)
        key = self.key[block]
        if key is not None:
            del self.cached[key][block]
            if not self.cached[key]:
                del self.cached[key]
            self.key[block] = None
        self.ref[block] = 1
        return block

    def _release(self, blocks) -> int:
        """A reference less to each block, in order; those left unreferenced join the queue's tail
        (returns how many)."""
        freed = 0
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
                freed += 1
            elif self.ref[b] < 0:
                raise AllocationError(f"block {b} freed twice")
        return freed

    def _cache(self, seq: Sequence, upto: int) -> None:
        """cache_blocks: the tables' full blocks below depth `upto` hold the sequence's content."""
        start = self.registered.get(seq, 0)
        if not self.enable_prefix_caching or upto <= start:
            return
        keys = self.keys(seq, upto)
        for g, table in enumerate(self.tables[seq]):
            for j in range(start, upto):
                if table[j] != NULL:
                    self.key[table[j]] = (keys[j], g)
                    self.cached.setdefault((keys[j], g), {})[table[j]] = None
        self.registered[seq] = upto

    # ---- prefix hits -----------------------------------------------------------------------------
    def _cached(self, key: int, groups) -> list[int] | None:
        """The first registered block holding `key` in each of `groups`, or None if one has none."""
        out = []
        for g in groups:
            blocks = self.cached.get((key, g))
            if not blocks:
                return None
            out.append(next(iter(blocks)))
        return out

    def _window_hit(self, keys: list[int], groups, n_blocks: int, window: int) -> tuple[int, list]:
        """SlidingWindowManager.find_longest_cache_hit over the first n_blocks keys: (length, blocks)."""
        need, run, found = contiguous_needed(window, self.block_size), 0, {}
        for i in range(n_blocks - 1, -1, -1):
            blocks = self._cached(keys[i], groups)
            if blocks is None:
                run = 0
                continue
            found[i] = blocks
            run += 1
            if run >= need:
                return i + run, [[found[j][k] if j >= i else NULL for j in range(i + run)] for k in range(len(groups))]
        return run, [[found[j][k] for j in range(run)] for k in range(len(groups))]

    def get_computed_blocks(self, seq: Sequence) -> HybridHit | list:
        if not self.enable_prefix_caching or seq in self.tables:
            return []
        keys = self.keys(seq, max(0, (seq.num_tokens - 1) // self.block_size))
        full = [g for g, w in enumerate(self.windows) if not w]
        other = [g for g, w in enumerate(self.windows) if w]
        length, per_group = len(keys), {}
        if full:
            hits = []
            for key in keys:
                blocks = self._cached(key, full)
                if blocks is None:
                    break
                hits.append(blocks)
            length = len(hits)
            per_group.update({g: [h[k] for h in hits] for k, g in enumerate(full)})
        if other:
            length, blocks = self._window_hit(keys, other, length, self.windows[other[0]])
            per_group.update(zip(other, blocks))
        if not length:
            return []
        return HybridHit(per_group[g][:length] for g in range(self.num_groups))

    def free_hits(self, hit) -> int:
        """How many of a prefix hit's blocks are free (cached in the free queue) now."""
        return sum(self.ref[b] == 0 for blocks in hit for b in blocks if b != NULL)

    def next_release(self, seq: Sequence) -> int:
        """The computed token count at which the sequence's sliding groups next free a block."""
        table = self.tables[seq][self.windows.index(self.window)]
        skipped = next((i for i, b in enumerate(table) if b != NULL), len(table))
        return self.window - 1 + self.block_size * (skipped + 1)

    # ---- what fits ---------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return self.num_groups * -(-num_tokens // self.block_size)

    def peak_blocks(self, seq: Sequence) -> int:
        """The most blocks the sequence can hold at once (vLLM's max_memory_usage_bytes at its length)."""
        total, bs = seq.request.prompt_len + seq.request.output_len, self.block_size
        whole = -(-total // bs)
        return sum(whole if not w else min(whole, -(-min(w - 1 + self.max_num_batched_tokens, total) // bs) + 1)
                   for w in self.windows)

    def _lengths(self, seq: Sequence) -> list[int]:
        tables = self.tables.get(seq)
        return [len(t) for t in tables] if tables else [0] * self.num_groups

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return sum(max(0, need - n) for n in self._lengths(seq))

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> bool:
        if seq in self.tables or seq.num_computed_tokens:
            raise AllocationError(f"sequence {seq.seq_id}: the hybrid allocator has no swap-in")
        hit = len(computed_blocks)
        need = self.num_groups * (-(-(hit * self.block_size + num_new_tokens) // self.block_size) - hit)
        evictable = sum(self.ref[b] == 0 for blocks in computed_blocks for b in blocks if b != NULL)
        return need + evictable <= len(self.free)

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """allocate_slots' check, after its remove_skipped_blocks (which frees even when it fails)."""
        if seq in self.tables:
            self.release(seq, seq.num_computed_tokens)
        return self.num_blocks_needed(seq, num_new_tokens) <= len(self.free)

    # ---- taking and freeing ---------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> None:
        if not self.can_allocate(seq, num_new_tokens, computed_blocks):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks for {num_new_tokens} tokens")
        tables = self.tables[seq] = [[] for _ in self.windows]
        seq.block_table = tables
        hit = len(computed_blocks)
        for g, blocks in enumerate(computed_blocks):  # touch: the hit blocks leave the free queue
            for b in blocks:
                if b != NULL:
                    if self.ref[b] == 0:
                        del self.free[b]
                    self.ref[b] += 1
                    self.written += self.block_size
            tables[g].extend(blocks)
        if hit:
            seq.num_computed_tokens = hit * self.block_size
            seq.num_cached_tokens += seq.num_computed_tokens
            self.registered[seq] = hit
        self._grow(seq, num_new_tokens)

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        if not self.can_append(seq, num_new_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks to append {num_new_tokens} tokens")
        self._grow(seq, num_new_tokens)

    def _grow(self, seq: Sequence, num_new_tokens: int) -> None:
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        for table in self.tables[seq]:
            while len(table) < need:
                table.append(self._take())
        self.written += self.num_groups * num_new_tokens
        self._cache(seq, min(seq.num_computed_tokens + num_new_tokens, seq.num_tokens) // self.block_size)

    def release(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, int]:
        """remove_skipped_blocks at `num_computed_tokens` (a cohort member's count, or the sequence's
        own): each sliding group frees the blocks wholly before the window, the last first. Returns
        (the blocks that joined the free queue, the count at which it next frees)."""
        tables, bs = self.tables.get(seq), self.block_size
        if tables is None:
            return 0, 0
        total = 0
        # A cohort member's full blocks were cached when their steps were scheduled: before they leave
        self._cache(seq, min([num_computed_tokens // bs] + [len(t) for t in tables]))
        for g, w in enumerate(self.windows):
            end = (num_computed_tokens - w + 1) // bs if w else 0
            table, freed = tables[g], []
            if end > len(table):  # a cohort member's blocks not yet claimed
                table.extend([None] * (end - len(table)))
            for i in range(end - 1, -1, -1):
                if table[i] == NULL:
                    break
                if table[i] is None:  # ... take reserved blocks, which hold the member's content
                    table[i] = self.reserved.pop(0)
                    if self.enable_prefix_caching:
                        key = self.key[table[i]] = (self.keys(seq, i + 1)[i], g)
                        self.cached.setdefault(key, {})[table[i]] = None
                freed.append(table[i])
                table[i] = NULL
            self.written -= bs * len(freed)
            total += self._release(freed)
        return total, self.next_release(seq)

    def reserve(self, n: int) -> None:
        if n > len(self.free):
            raise AllocationError(f"cannot reserve {n} blocks, {len(self.free)} are free")
        self.reserved += [self._take() for _ in range(n)]

    def claim(self, seq: Sequence, num_tokens: int = -1) -> None:
        need = -(-seq.num_computed_tokens // self.block_size)
        tables = self.tables[seq]
        want = sum(need - len(t) for t in tables if len(t) < need)
        if want > len(self.reserved):
            raise AllocationError(f"sequence {seq.seq_id}: claims {want} blocks, {len(self.reserved)} reserved")
        for table in tables:
            while len(table) < need:
                table.append(self.reserved.pop(0))
        self._cache(seq, seq.num_computed_tokens // self.block_size)

    def note_written(self, num_tokens: int) -> None:
        self.written += self.num_groups * num_tokens

    def deallocate(self, seq: Sequence) -> None:
        tables = self.tables.pop(seq, None)
        if tables is None or tables is not seq.block_table:
            raise AllocationError(f"sequence {seq.seq_id}: its block table was not allocated here")
        self.written -= self._live_tokens(seq, tables)
        for table in tables:
            self._release(reversed([b for b in table if b != NULL]))
        self.registered.pop(seq, None)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _live_tokens(self, seq: Sequence, tables) -> int:
        """Tokens written into the tables' live blocks: all computed tokens, less the null blocks'."""
        return sum(seq.num_computed_tokens - self.block_size * sum(b == NULL for b in t) for t in tables)

    # ---- figures ---------------------------------------------------------------------------------
    @property
    def num_shared_refs(self) -> int:
        """References past a block's first holder in the full-attention groups, per group."""
        full = [g for g, w in enumerate(self.windows) if not w]
        blocks = {b for t in self.tables.values() for g in full for b in t[g] if b != NULL}
        return sum(self.ref[b] - 1 for b in blocks) // len(full) if full else 0

    @property
    def reserved_unused_tokens(self) -> int:
        held = sum(b != NULL for t in self.tables.values() for table in t for b in table) + len(self.reserved)
        return held * self.block_size - self.written

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The first group's slots (a KV cache per group is the triton engine's to lay out; it has none)."""
        bs, table = self.block_size, self.tables[seq][0]
        return [table[p // bs] * bs + p % bs for p in range(start, end)]
