"""The paged allocator's executable specification: vLLM v0.11.0's block pool, written plainly.

`ReferencePool` is a `KVAllocator` (kvsim.engine.interfaces) with the semantics `BlockManager`
implements and none of its speed machinery (`block_pool.py`, `kv_cache_utils.py` and
`kv_cache_manager.py` of vLLM v0.11.0):

- a block's content is named by a chained key: the key of the block before it and the block's own
  tokens, so a key names the whole prefix. Tokens of `Request.token_ids` (shareable) are named by
  their values, every other token (the rest of the prompt, generated tokens) by (request, position):
  only its own request can meet it again, after a preemption;
- every full block is registered (cached) when the step that fills it is scheduled; a decode-cohort
  member's blocks when it claims them (their tokens were written in the cohort);
- a prefix hit takes, at each depth, the first registered block still holding that key, for at
  most (num_tokens - 1) // block_size blocks (one token is left to compute);
- free blocks wait in an LRU queue: freed tables join its tail, tail block first; blocks are taken
  from its head (never-used blocks first, in id order), and a block taken loses its content;
- `reserve` takes blocks off the head at once for decode-cohort members, which `claim` them into
  their tables when they leave the cohort.

Every operation costs O(blocks) or O(tokens): this is the specification the fast allocator is
checked against (block for block by a Hypothesis machine in tests/test_block_manager.py, and as
whole simulations in tests/test_reference_pool.py), not an allocator to simulate with.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

import numpy as np

from kvsim.engine.block_manager import AllocationError
from kvsim.sequence import NO_BLOCKS, Sequence


class ContentKeys:
    """Exact content keys of full blocks: `keys(seq, n)` names the sequence's first n blocks, each
    key standing for the block's content and every block before it (shareable tokens by their values,
    any other token by (request, position)). Keys are small integers, equal exactly when the content is."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._keys: dict[tuple, int] = {}  # (parent key, content) -> key
        self._seq_keys: dict[Sequence, list[int]] = {}

    def __call__(self, seq: Sequence, n: int) -> list[int]:
        keys = self._seq_keys.setdefault(seq, [])
        ids, bs = seq.request.token_ids, self.block_size
        shared = 0 if ids is None else len(ids) // bs
        if len(keys) < n and shared:
            tokens = np.asarray(ids)[:shared * bs].tolist()
        for j in range(len(keys), n):
            content = tuple(tokens[j * bs:(j + 1) * bs]) if j < shared else (seq.seq_id, j)
            parent = keys[j - 1] if j else -1
            keys.append(self._keys.setdefault((parent, j < shared, content), len(self._keys)))
        return keys[:n]


class FreeListFigures:
    """What a plain pool reports of its free list: `free` (block ids, the LRU head first), `key` (the
    content a block holds, None: nothing reusable) and `num_blocks`, as both specifications keep them."""

    external_fragmentation = 0.0
    grows = True

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached_blocks(self) -> int:
        return sum(self.key[b] is not None for b in self.free)

    def block_counts(self) -> tuple[int, int, int]:
        return self.num_used_blocks, self.num_cached_blocks, len(self.free)

    def evictions_ahead(self, counts) -> list[int]:
        order = list(self.free)
        return [sum(self.key[b] is not None for b in order[:n]) for n in counts]

    def free_block_ids(self) -> list[int]:
        return list(self.free)


class ReferencePool(FreeListFigures):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size, self.enable_prefix_caching = num_blocks, block_size, enable_prefix_caching
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head first
        self.ref = [0] * num_blocks
        self.key = [None] * num_blocks  # the content a block holds (None: nothing reusable)
        self.cached: dict[int, dict[int, None]] = {}  # key -> blocks holding it, first registered first
        self.tables: dict[Sequence, array] = {}
        self.registered: dict[Sequence, int] = {}  # blocks of the table registered so far
        self.reserved: list[int] = []
        self.written = 0  # tokens written into slots held (tables and reservations)
        self.keys = ContentKeys(block_size)

    # ---- content ------------------------------------------------------------------------------

    def _register(self, seq: Sequence, upto: int) -> None:
        """The table's blocks below depth `upto` hold the sequence's content (full blocks)."""
        if not self.enable_prefix_caching:
            return
        table, start = self.tables[seq], self.registered.get(seq, 0)
        for j, key in enumerate(self.keys(seq, upto)[start:], start):
            self.key[table[j]] = key
            self.cached.setdefault(key, {})[table[j]] = None
        self.registered[seq] = max(start, upto)

    def _take(self) -> int:
        """The block at the head of the free queue, whatever it held evicted."""
        block, _ = self.free.popitem(last=False)
        key = self.key[block]
        if key is not None:
            del self.cached[key][block]
            if not self.cached[key]:
                del self.cached[key]
            self.key[block] = None
        return block

    # ---- what fits --------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_blocks(self, seq: Sequence) -> int:
        return self.blocks_for(seq.request.prompt_len + seq.request.output_len)

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching or seq.block_table:
            return []
        hits = []
        for key in self.keys(seq, max(0, (seq.num_tokens - 1) // self.block_size)):
            if key not in self.cached:
                break
            hits.append(next(iter(self.cached[key])))
        return hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> bool:
        hit_tokens = len(computed_blocks) * self.block_size
        need = self.blocks_for(seq.num_computed_tokens + hit_tokens + num_new_tokens) - len(seq.block_table)
        need -= len(computed_blocks)
        return need + sum(self.ref[b] == 0 for b in computed_blocks) <= len(self.free)

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= len(self.free)

    # ---- taking and freeing -------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks=()) -> None:
        if not self.can_allocate(seq, num_new_tokens, computed_blocks):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks for {num_new_tokens} tokens")
        if not seq.block_table:
            seq.block_table = self.tables[seq] = array("i")
            self.written += seq.num_computed_tokens  # a swapped-in sequence brings its KV back
        for block in computed_blocks:
            if self.ref[block] == 0:
                del self.free[block]
            self.ref[block] += 1
            seq.block_table.append(block)
        if computed_blocks:
            seq.num_computed_tokens = len(computed_blocks) * self.block_size
            seq.num_cached_tokens += seq.num_computed_tokens
            self.written += seq.num_computed_tokens
            self.registered[seq] = len(computed_blocks)
        self._grow(seq, num_new_tokens)

    def append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        if not self.can_append(seq, num_new_tokens):
            raise AllocationError(f"sequence {seq.seq_id}: not enough free blocks to append {num_new_tokens} tokens")
        self._grow(seq, num_new_tokens)

    def _grow(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self.num_blocks_needed(seq, num_new_tokens)):
            block = self._take()
            self.ref[block] = 1
            seq.block_table.append(block)
        self.written += num_new_tokens
        self._register(seq, (seq.num_computed_tokens + num_new_tokens) // self.block_size)

    def reserve(self, n: int) -> None:
        if n > len(self.free):
            raise AllocationError(f"cannot reserve {n} blocks, {len(self.free)} are free")
        for _ in range(n):
            block = self._take()
            self.ref[block] = 1
            self.reserved.append(block)

    def claim(self, seq: Sequence, num_tokens: int = -1) -> None:
        need = self.blocks_for(seq.num_computed_tokens if num_tokens < 0 else num_tokens) - len(seq.block_table)
        if need > len(self.reserved):
            raise AllocationError(f"sequence {seq.seq_id}: claims {need} blocks, {len(self.reserved)} reserved")
        for _ in range(max(0, need)):
            seq.block_table.append(self.reserved.pop(0))
        self._register(seq, seq.num_computed_tokens // self.block_size)

    def note_written(self, num_tokens: int) -> None:
        self.written += num_tokens

    def deallocate(self, seq: Sequence) -> None:
        table = self.tables.pop(seq, None)
        if table is None or table is not seq.block_table or not table:
            raise AllocationError(f"sequence {seq.seq_id}: its block table was not allocated here")
        for block in reversed(table):  # tail block first
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None
        self.written -= seq.num_computed_tokens
        self.registered.pop(seq, None)
        seq.block_table = NO_BLOCKS
        seq.num_computed_tokens = 0

    # ---- figures ------------------------------------------------------------------------------
    @property
    def num_shared_refs(self) -> int:
        return sum(r - 1 for r in self.ref if r > 1)

    @property
    def reserved_unused_tokens(self) -> int:
        held = sum(len(t) for t in self.tables.values()) + len(self.reserved)
        return held * self.block_size - self.written

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]
