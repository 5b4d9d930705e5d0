"""Prefix caching's content side: what a block holds, and an index of the cached runs of blocks.

vLLM V1 (v0.11.0, `kv_cache_utils.hash_block_tokens`) names the content of every full block by a
chained hash of (parent hash, the block's tokens). Here:

- **Shareable content** (`Request.token_ids`: a group's system prompt, a trace's prompt) gets a
  chained 64-bit identity per full block, computed for the whole prompt at once with numpy: each
  block's tokens are mixed into one value, values are chained by a polynomial prefix sum
  (h_i = P * h_(i-1) + v_i, mod 2^64), and the result is mixed with the depth. `KeyedTokens` are
  named by their keys instead of their tokens (one value per `span` tokens, chained the same way),
  so a 12k-token Mooncake prompt costs a few numpy calls and no token is expanded. As in vLLM, a
  hash match is trusted: two different prefixes share an identity with probability ~2^-64.
- **Unique content** (the rest of a prompt, and every generated token) can only ever be hit by the
  request that wrote it, after a preemption. It is identified by (request, position) and needs no
  hash: the allocator parks the freed table of a preempted sequence (see BlockManager).

The index holds runs, not blocks. A run is a table that registered the blocks at depths [start,
end) of one chain of identities (a sequence's prompt, from its first block that was not a prefix
hit). It is found through the identity at its first depth, so the index costs a dict entry per run,
and a lookup walks from run to run, switching where one stops matching. Whether a block still holds
what a run registered is read from `BlockContent` (per-block numpy arrays): nothing is done per
block when blocks are evicted. Because vLLM frees tables tail block first and hits take leading
blocks, the blocks of a run that still hold their content are a leading part of it, so a lookup
checks the last block it wants and looks further only when that one is gone. Where two sequences
register the same content at once (vLLM keeps both copies), the allocator cuts runs so that both
start at the same depth (see BlockManager._branch_off) and a lookup compares them there. A run whose
first block is gone is dead and dropped, when met or in a sweep once the index has doubled.
"""

from __future__ import annotations

from array import array

import numpy as np

from kvsim.sequence import KeyedTokens, mix64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_P = 0x100000001B3  # odd, so invertible mod 2^64: the chain's prefix sums can be unwound
_P_INV = pow(_P, -1, 1 << 64)
_POWERS: list[np.ndarray] = [np.ones(1, np.uint64), np.ones(1, np.uint64)]  # P^i and P^-i, grown on demand


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    if len(_POWERS[0]) < n:
        size = max(n, 2 * len(_POWERS[0]))
        for i, base in enumerate((_P, _P_INV)):
            steps = np.full(size, base, dtype=np.uint64)
            steps[0] = 1
            _POWERS[i] = np.cumprod(steps, dtype=np.uint64)  # wraps mod 2^64, as wanted
    return _POWERS[0][:n], _POWERS[1][:n]


def chain(values: np.ndarray) -> np.ndarray:
    """Chained identities of a sequence of uint64 values: element i depends on values[0..i] and i."""
    n = len(values)
    power, inverse = _powers(n)
    prefix = np.cumsum(values * inverse, dtype=np.uint64) * power  # sum_j v_j P^(i-j)
    return mix64(prefix + np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)


def _token_block_values(tokens: np.ndarray, block_size: int) -> np.ndarray:
    n = len(tokens) // block_size
    t = np.asarray(tokens[:n * block_size]).astype(np.uint64).reshape(n, block_size)
    keys = mix64(np.arange(block_size, dtype=np.uint64) + np.uint64(0xD6E8FEB86659FD93))
    return mix64(t * _GOLDEN + keys).sum(axis=1, dtype=np.uint64)


def block_hashes(token_ids, block_size: int) -> np.ndarray:
    """Chained identity (uint64) of every full block of `token_ids` (an int32 array or KeyedTokens)."""
    if isinstance(token_ids, KeyedTokens) and token_ids.span % block_size == 0:
        per = token_ids.span // block_size
        keyed = _keyed_chain(token_ids.keys)  # one identity per key ...
        within = _WITHIN.get(per)
        if within is None:
            within = _WITHIN[per] = np.arange(1, per + 1, dtype=np.uint64) * _GOLDEN
        return (keyed[:, None] + within).ravel()[:len(token_ids) // block_size]  # ... told apart per block
    tokens = np.asarray(token_ids)
    return chain(_token_block_values(tokens, block_size)) if len(tokens) >= block_size else np.zeros(0, np.uint64)


_WITHIN: dict[int, np.ndarray] = {}
_KEYED: dict[bytes, np.ndarray] = {}  # chain() of key sequences, by their bytes (as uint64)
KEYED_CACHE_BYTES = 64 << 20
_keyed_bytes = 0


def _keyed_chain(keys) -> np.ndarray:
    """chain() of a prompt's keys, remembered: every policy of a scenario replays the same trace
    rows, so each one's identities are computed once per run, not once per policy (up to
    KEYED_CACHE_BYTES of keys and identities are kept; then the memory starts over)."""
    global _keyed_bytes
    values = np.asarray(keys).astype(np.uint64)
    key = values.tobytes()
    out = _KEYED.get(key)
    if out is None:
        if _keyed_bytes > KEYED_CACHE_BYTES:
            _KEYED.clear()
            _keyed_bytes = 0
        out = _KEYED[key] = chain(values)
        out.flags.writeable = False
        _keyed_bytes += 2 * len(key)
    return out


CONTENT_CACHE_SIZE = 4096  # requests of a prefix group share one token_ids array: hashed once


class ChainMemo:
    """`block_hashes` of shareable prompts at one block size, converted by `convert` and remembered
    per token_ids array (the members of a prefix group share one array, so it is hashed once; up to
    CONTENT_CACHE_SIZE arrays are kept alive, so that their ids stay unique). KeyedTokens are not
    kept here: their key chains are remembered by their keys (`_keyed_chain`)."""

    __slots__ = ("block_size", "convert", "_chains")

    def __init__(self, block_size: int, convert):
        self.block_size, self.convert = block_size, convert
        self._chains: dict[int, tuple] = {}  # id(token_ids) -> (token_ids, converted identities)

    def __call__(self, ids):
        entry = self._chains.get(id(ids))
        if entry is not None and entry[0] is ids:
            return entry[1]
        chain = self.convert(block_hashes(ids, self.block_size))
        if isinstance(ids, np.ndarray):
            if len(self._chains) >= CONTENT_CACHE_SIZE:
                del self._chains[next(iter(self._chains))]
            self._chains[id(ids)] = (ids, chain)
        return chain


def sequence_chain(seq, memo: ChainMemo):
    """The identities of the sequence's shareable full blocks (`memo`'s block size and form), kept on
    the sequence: the router and every replica's allocator compute them once between them."""
    chain = seq.block_hashes
    if chain is None:
        chain = seq.block_hashes = memo(seq.request.token_ids)
    return chain


SMALL_RUN = 32  # runs of blocks up to this long are handled element by element, longer ones by numpy


def _index(blocks: array) -> np.ndarray:
    """A run of block ids as numpy's index type: fancy indexing with int32 ids converts them on
    every use, which costs more than converting once (3x for a gather of ~750 blocks)."""
    return np.frombuffer(blocks, np.int32).astype(np.intp)


def first_difference(a: array, b: array, lo: int, hi: int) -> int:
    """Offset from `lo` of the first depth in [lo, hi) where chains `a` and `b` differ, given that
    they agree at `lo` and differ at hi - 1. Identities are chained, so two chains that agree at a
    depth agree at every depth before it (up to a 2^-64 collision, which vLLM trusts too): a
    binary search finds where they part."""
    lo += 1
    hi -= 1  # a[lo - 1] == b[lo - 1], a[hi] != b[hi]: the answer lies in [lo, hi]
    base = lo - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo - base


class BlockContent:
    """What each block of a pool holds, for the blocks handed out so far (arrays grown on demand):
    the run that last registered it, the references from tables at shareable positions, and the
    free-queue position it last entered at. A block holds what its run registered while a table
    references it, or while it is free and not taken since it was freed: a block taken off the free
    queue loses its content without any work at that moment (that would be per block).

    The state is kept in typed arrays with numpy views of the same memory, and every operation takes
    a run of block ids (an `array('i')`): runs up to SMALL_RUN blocks are read and written element by
    element, longer ones with one numpy call each (a numpy call costs as much as ~20 elements).
    """

    __slots__ = ("run", "ref", "pos", "_run", "_ref", "_pos")

    def __init__(self):
        self.run = array("q")  # serial of the registering run; 0: none
        self.ref = array("i")
        self.pos = array("q")
        self._views()

    def _views(self) -> None:
        self._run = np.frombuffer(self.run, np.int64)
        self._ref = np.frombuffer(self.ref, np.int32)
        self._pos = np.frombuffer(self.pos, np.int64)

    def grow(self, n: int) -> None:
        size = max(n, 2 * len(self.ref), 64)
        for name, fill in (("run", 0), ("ref", 0), ("pos", -1)):
            old = getattr(self, name)
            new = array(old.typecode, [fill]) * size
            new[:len(old)] = old
            setattr(self, name, new)
        self._views()

    def holds(self, block: int, run: int, head: int) -> bool:
        return self.run[block] == run and (self.ref[block] > 0 or self.pos[block] >= head)

    def first_not_held(self, blocks: array, run: int, head: int) -> int:
        """Index of the first of `blocks` that no longer holds what `run` registered (one does not)."""
        if len(blocks) <= SMALL_RUN:
            holds = self.holds
            for i, b in enumerate(blocks):
                if not holds(b, run, head):
                    return i
            return len(blocks)
        ids = _index(blocks)
        held = (self._run[ids] == run) & ((self._ref[ids] > 0) | (self._pos[ids] >= head))
        return int(np.argmin(held))

    def count_free(self, blocks: array) -> int:
        """How many of `blocks` no table references."""
        if len(blocks) <= SMALL_RUN:
            ref = self.ref
            return sum(1 for b in blocks if not ref[b])
        return int(np.count_nonzero(self._ref[_index(blocks)] == 0))

    def acquire(self, blocks: array):
        """A reference more to each of `blocks` (distinct); returns the free-queue positions of those
        that were free (a list, or an array for a long run), which leave the queue."""
        if len(blocks) <= SMALL_RUN:
            ref, pos, free = self.ref, self.pos, []
            for b in blocks:
                r = ref[b]
                if not r:
                    free.append(pos[b])
                ref[b] = r + 1
            return free
        ids = _index(blocks)
        ref = self._ref
        free = self._pos[ids[ref[ids] == 0]]
        ref[ids] += 1
        return free

    def hold(self, blocks: array) -> None:
        """`blocks`, just taken off the free queue, are referenced once and hold nothing yet."""
        if len(blocks) <= SMALL_RUN:
            ref, run = self.ref, self.run
            for b in blocks:
                ref[b] = 1
                run[b] = 0
        else:
            ids = _index(blocks)
            self._ref[ids] = 1
            self._run[ids] = 0

    def register(self, blocks: array, serial: int) -> None:
        """`blocks` now hold what run `serial` registered."""
        if len(blocks) <= SMALL_RUN:
            run = self.run
            for b in blocks:
                run[b] = serial
        else:
            self._run[_index(blocks)] = serial

    def release(self, blocks: array) -> array:
        """A reference less to each of `blocks`, all or none: returns those no table references now,
        last first. ValueError (and nothing changed) if a block is unknown or already unreferenced."""
        if not blocks:
            return array("i")
        if len(blocks) <= SMALL_RUN:
            ref = self.ref
            if min(blocks) < 0 or max(blocks) >= len(ref):
                raise ValueError("holds unknown blocks")
            freed = array("i")
            for i, b in enumerate(blocks):  # blocks are distinct: each is read before it is written
                n = ref[b] - 1
                if n <= 0:
                    if n < 0:
                        for undo in blocks[:i]:  # all or none
                            ref[undo] += 1
                        raise ValueError(f"holds block {b}, which is free")
                    freed.append(b)
                ref[b] = n
            freed.reverse()
            return freed
        ids = np.frombuffer(blocks, np.int32)
        if ids.min() < 0 or ids.max() >= len(self.ref):
            raise ValueError("holds unknown blocks")
        index = ids.astype(np.intp)
        left = self._ref[index] - 1
        if (left < 0).any():
            raise ValueError(f"holds block {int(ids[np.argmin(left)])}, which is free")
        self._ref[index] = left
        return array("i", ids[left == 0][::-1].tobytes())

    def set_positions(self, blocks: array, start: int) -> None:
        """`blocks` entered the free queue at positions start, start + 1, ..."""
        if len(blocks) <= SMALL_RUN:
            pos = self.pos
            for i, b in enumerate(blocks, start):
                pos[b] = i
        else:
            self._pos[_index(blocks)] = np.arange(start, start + len(blocks))


class CachedRun:
    """The blocks a table registered at depths [start, end) of a chain of identities (the table
    of `owner` while it holds it: a freed sequence gets a new table, the run keeps the old)."""

    __slots__ = ("owner", "table", "chain", "start", "end", "splits", "serial")

    def __init__(self, owner, chain: array, start: int):
        self.owner, self.table, self.chain, self.start, self.end = owner, owner.block_table, chain, start, start
        self.splits = None  # depths where another run branched off: this one stops there, a new one starts
        self.serial = 0  # set when the index takes it

    def holds(self, depth: int, content: BlockContent, head: int) -> bool:
        """Does the block at `depth` (in [start, end)) still hold what this run registered?"""
        return content.holds(self.table[depth], self.serial, head)

    def match(self, chain: array, limit: int, content: BlockContent, head: int) -> int:
        """How far from `start` this run holds the blocks of `chain`, up to `limit`."""
        d, e = self.start, min(self.end, limit)
        if e <= d:
            return d
        if self.chain is not chain and self.chain[e - 1] != chain[e - 1]:  # the chains part: where?
            e = d + first_difference(self.chain, chain, d, e)
        if e > d and not self.holds(e - 1, content, head):  # its tail was evicted: where does it stop?
            e = d + content.first_not_held(self.table[d:e], self.serial, head)
        return e


class PrefixIndex:
    """Cached runs by the identity at their first depth."""

    def __init__(self):
        self._heads: dict[int, list[CachedRun]] = {}
        self.num_runs = 0
        self._serial = 0
        self._sweep_at = 1024

    def __bool__(self) -> bool:
        return bool(self._heads)

    def extend(self, run: CachedRun, upto: int, content: BlockContent, head: int) -> None:
        """The run's table now registers depths up to `upto` (its blocks there were just filled)."""
        if run.end == run.start:
            if self.num_runs >= self._sweep_at:
                self.sweep(content, head)
            self._heads.setdefault(run.chain[run.start], []).append(run)
            self.num_runs += 1
            self._serial += 1
            run.serial = self._serial
        content.register(run.table[run.end:upto], run.serial)
        run.end = upto

    def longest_hit(self, chain: array, limit: int, content: BlockContent, head: int) -> tuple[list, int]:
        """The cached blocks holding the longest prefix of `chain` (at most `limit` blocks), as
        (run, start, end) slices of runs in depth order, and the depth reached."""
        heads, d, found, scanned = self._heads, 0, [], 1
        while d < limit:
            runs = heads.get(chain[d])
            best, best_end = self._farthest(runs or (), chain, limit, content, head, d)
            if best is None and d > scanned:  # a run that began inside the hit so far may reach further
                best, best_end = self._farthest(self._runs_within(chain, scanned, d), chain, limit, content,
                                                head, d)
                scanned = d
            if best is None:
                if runs is not None:  # every run starting here lost its first block: dead
                    self._drop(chain[d], [r for r in runs if not r.holds(r.start, content, head)])
                break
            found.append((best, d, best_end))
            d = best_end
        return found, d

    @staticmethod
    def _farthest(runs, chain: array, limit: int, content: BlockContent, head: int, d: int):
        """The run reaching farthest past depth `d` along `chain`, and how far (None, d: none passes d)."""
        best, best_end = None, d
        for run in runs:
            end = run.match(chain, limit, content, head)
            if end > best_end:
                best, best_end = run, end
        return best, best_end

    def _runs_within(self, chain: array, lo: int, hi: int):
        """The runs that start at depths [lo, hi) of `chain`: where two copies of a prefix were cached
        and the hit followed one, the other's later run can carry it on (vLLM looks blocks up by hash
        alone, whichever copy holds them)."""
        for runs in filter(None, map(self._heads.get, chain[lo:hi])):
            yield from runs

    def _drop(self, key: int, dead: list[CachedRun]) -> None:
        runs = self._heads[key]
        runs[:] = [r for r in runs if r not in dead]
        self.num_runs -= len(dead)
        if not runs:
            del self._heads[key]

    def sweep(self, content: BlockContent, head: int) -> None:
        """Drop every run whose first block no longer holds its content."""
        for key, runs in list(self._heads.items()):
            dead = [r for r in runs if not r.holds(r.start, content, head)]
            if dead:
                self._drop(key, dead)
        self._sweep_at = max(1024, 2 * self.num_runs)
