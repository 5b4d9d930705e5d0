"""The paged BlockManager: hand-computed block counts, prefix caching, misuse, and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.engine import block_manager as bm_mod
from kvsim.engine.block_manager import AllocationError, BlockManager
from kvsim.sequence import Request, Sequence


def seq_of(rid, prompt_len, tokens=None, output_len=8):
    ids = None if tokens is None else np.asarray(tokens, dtype=np.int32)
    return Sequence(Request(rid, 0.0, prompt_len, output_len, ids))


def test_100_token_prompt_takes_7_blocks_of_16():
    bm = BlockManager(32, 16)
    s = seq_of(0, 100)
    bm.allocate(s, 100)
    assert len(s.block_table) == 7
    assert bm.num_free_blocks == 25
    assert bm.reserved_unused_tokens == 7 * 16 - 100


def test_peak_blocks_cover_prompt_and_every_output_token():
    bm = BlockManager(32, 16)
    assert bm.peak_blocks(seq_of(0, 100, output_len=28)) == 8  # 128 tokens: exactly 8 blocks
    assert bm.peak_blocks(seq_of(1, 100, output_len=29)) == 9


def test_slot_mapping_follows_block_table():
    bm = BlockManager(8, 4)
    s = seq_of(0, 6)
    bm.allocate(s, 6)
    s.block_table = [5, 2]  # any order: slots follow the table
    assert bm.slot_mapping(s, 0, 6) == [20, 21, 22, 23, 8, 9]


def test_allocate_is_all_or_nothing():
    bm = BlockManager(4, 16)
    a = seq_of(0, 48)
    bm.allocate(a, 48)
    b = seq_of(1, 33)
    assert not bm.can_allocate(b, 33)
    with pytest.raises(AllocationError):
        bm.allocate(b, 33)
    assert len(b.block_table) == 0 and bm.num_free_blocks == 1


def test_double_free_and_unknown_block_raise():
    bm = BlockManager(4, 16)
    s = seq_of(0, 10)
    bm.allocate(s, 10)
    bm.deallocate(s)
    with pytest.raises(AllocationError):
        bm.deallocate(s)
    s.block_table = [4]  # the pool has blocks 0-3
    with pytest.raises(AllocationError):
        bm.deallocate(s)


def test_a_sequence_of_another_allocator_or_a_replaced_table_raises():
    mine, other = BlockManager(8, 4), BlockManager(8, 4)
    s, t = seq_of(0, 8), seq_of(1, 8)
    other.allocate(s, 8)  # ids 0, 1: in range for `mine` too
    with pytest.raises(AllocationError, match="not allocated here"):
        mine.deallocate(s)
    mine.allocate(t, 8)
    t.block_table = list(t.block_table)  # same ids, not the table `mine` gave it
    with pytest.raises(AllocationError, match="not allocated here"):
        mine.deallocate(t)
    assert mine.num_free_blocks == 6 and other.num_free_blocks == 6


def test_an_owned_table_edited_in_place_still_fails_the_reference_counts():
    bm = BlockManager(8, 4)
    prefix = list(range(8))
    a, b = seq_of(0, 8, prefix), seq_of(1, 8, prefix)
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.allocate(b, 8)
    b.num_computed_tokens = 8
    b.block_table[1] = 7  # a free block at a shareable position
    before = (list(bm.ref_cnt), bm.num_free_blocks)
    with pytest.raises(AllocationError, match="which is free"):
        bm.deallocate(b)
    assert (list(bm.ref_cnt), bm.num_free_blocks) == before


@pytest.mark.parametrize("bad_table, shares_prefix", [
    (lambda a, b: [b[0], -1], False),  # unknown ids
    (lambda a, b: [b[0], 99], False),
    (lambda a, b: [a[0], a[0], 7], True),  # at shareable positions: twice (the second finds it free)
    (lambda a, b: [7, a[0]], True),  # at a shareable position, a free block
    (lambda a, b: [a[0], -1], True),
    (lambda a, b: [a[0], a[1], 99], True),  # shareable positions fine, the private tail unknown
])
def test_misused_tables_raise_and_change_nothing(bad_table, shares_prefix):
    bm = BlockManager(8, 4)
    prefix = list(range(8))  # 2 shareable blocks
    a, b = seq_of(0, 8, prefix), seq_of(1, 8)
    for s in (a, b):
        bm.allocate(s, 8)
        s.num_computed_tokens = 8
    before = (list(bm.ref_cnt), bm.num_free_blocks, bm.free_block_ids())
    victim = seq_of(2, 12, prefix if shares_prefix else None)
    victim.block_table = bad_table(a.block_table, b.block_table)
    with pytest.raises(AllocationError):
        bm.deallocate(victim)
    assert (list(bm.ref_cnt), bm.num_free_blocks, bm.free_block_ids()) == before
    bm.deallocate(a)
    bm.deallocate(b)
    assert bm.num_free_blocks == 8 and sorted(bm.free_block_ids()) == list(range(8))


def test_decode_appends_a_block_every_block_size_tokens():
    bm = BlockManager(16, 4)
    s = seq_of(0, 4)
    bm.allocate(s, 4)
    s.num_computed_tokens = 4
    grown = []
    for _ in range(9):
        bm.append(s, 1)
        s.num_computed_tokens += 1
        grown.append(len(s.block_table))
    assert grown == [2, 2, 2, 2, 3, 3, 3, 3, 4]


def test_prefix_hit_shares_blocks_and_counts_references():
    bm = BlockManager(16, 4)
    prefix = list(range(100, 110))  # 10 shared tokens = 2 full blocks + 2
    a = seq_of(0, 14, prefix)
    bm.allocate(a, 14)
    a.num_computed_tokens = 14
    b = seq_of(1, 12, prefix)
    hits = bm.get_computed_blocks(b)
    assert hits == list(a.block_table[:2])
    bm.allocate(b, 12 - 8, hits)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert [bm.ref_cnt[x] for x in hits] == [2, 2]
    assert list(b.block_table[:2]) == hits and b.block_table[2] not in a.block_table


def test_whole_prompt_hit_still_computes_one_token():
    bm = BlockManager(16, 4)
    toks = list(range(8))
    a = seq_of(0, 8, toks)
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    b = seq_of(1, 8, toks)
    assert len(bm.get_computed_blocks(b)) == 1  # 8 tokens hit would leave nothing to compute


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    bm = BlockManager(4, 4)
    a, b = seq_of(0, 8, list(range(8))), seq_of(1, 8, list(range(50, 58)))
    for s in (a, b):
        bm.allocate(s, 8)
        s.num_computed_tokens = 8
    bm.deallocate(a)  # a's blocks freed first: least recently used
    bm.deallocate(b)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 4
    again = seq_of(2, 9, list(range(8)))
    assert bm.get_computed_blocks(again) == [1, 0][::-1] or len(bm.get_computed_blocks(again)) == 2
    c = seq_of(3, 4)  # unique content: takes the LRU head, one of a's blocks (tail first)
    bm.allocate(c, 4)
    assert c.block_table[0] in (0, 1)
    assert len(bm.get_computed_blocks(again)) < 2  # a's chain is broken
    assert len(bm.get_computed_blocks(seq_of(4, 9, list(range(50, 58))))) == 2  # b's survives


def test_hash_collision_never_returns_other_tokens(monkeypatch):
    monkeypatch.setattr(bm_mod.xxhash, "xxh64_intdigest", lambda data, seed=0: 42)
    bm = BlockManager(8, 4)
    a = seq_of(0, 8, [1, 2, 3, 4, 5, 6, 7, 8])
    bm.allocate(a, 8)
    b = seq_of(1, 8, [9, 9, 9, 9, 9, 9, 9, 9])
    assert bm.get_computed_blocks(b) == []


PREFIXES = [list(range(k * 100, k * 100 + 24)) for k in range(3)]


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions, growth and frees against a tiny cache; invariants after every step."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(24, 4, enable_prefix_caching=True)
        self.live: list[Sequence] = []
        self.next_id = 0

    @rule(group=st.sampled_from([None, 0, 1, 2]), shared=st.integers(1, 24), extra=st.integers(0, 12))
    def admit(self, group, shared, extra):
        tokens = None if group is None else PREFIXES[group][:shared]
        prompt = (shared if group is not None else 1) + extra
        s = seq_of(self.next_id, prompt, tokens)
        self.next_id += 1
        hits = self.bm.get_computed_blocks(s)
        for i, blk in enumerate(hits):  # a hit must hold exactly the requested tokens
            want = np.asarray(tokens[i * 4:(i + 1) * 4], dtype="<i4").tobytes()
            assert self.bm.block_tokens[blk] == want
        need = prompt - len(hits) * 4
        if self.bm.can_allocate(s, need, hits):
            self.bm.allocate(s, need, hits)
            s.num_computed_tokens += need
            self.live.append(s)
        else:
            with pytest.raises(AllocationError):
                self.bm.allocate(s, need, hits)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 9))
    def grow(self, i, n):
        s = self.live[i % len(self.live)]
        if self.bm.can_append(s, n):
            self.bm.append(s, n)
            s.num_computed_tokens += n

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        self.bm.deallocate(self.live.pop(i % len(self.live)))

    @invariant()
    def blocks_conserved(self):
        bm = self.bm
        free = bm.free_block_ids()
        assert len(free) == len(set(free)) == bm.num_free_blocks
        assert all(bm.ref_cnt[b] == 0 for b in free)
        used = {b for s in self.live for b in s.block_table}
        assert not used & set(free)
        assert len(used) + len(free) == bm.num_blocks
        assert bm.num_used_blocks + (bm.num_free_blocks - bm.num_cached_blocks) + bm.num_cached_blocks == bm.num_blocks
        assert bm.num_cached_blocks == sum(1 for b in free if bm.block_hash[b] != bm_mod.NO_HASH)

    @invariant()
    def refcounts_match_tables(self):
        """Shareable positions are reference counted; every other block has exactly one table."""
        counts, private = [0] * self.bm.num_blocks, []
        for s in self.live:
            k = min(len(s.block_table), self.bm._num_shareable(s))
            for b in s.block_table[:k]:
                counts[b] += 1
            private += s.block_table[k:]
        assert counts == self.bm.ref_cnt
        assert min(self.bm.ref_cnt) >= 0
        assert len(private) == len(set(private))
        assert not any(counts[b] for b in private)

    @invariant()
    def tables_cover_tokens(self):
        for s in self.live:
            assert len(s.block_table) == -(-s.num_computed_tokens // 4)
        assert self.bm.reserved_unused_tokens == sum(len(s.block_table) * 4 - s.num_computed_tokens for s in self.live)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(st.lists(st.integers(0, 50), min_size=0, max_size=80), st.sampled_from([1, 4, 16]))
def test_block_hashes_chain(tokens, bs):
    h = bm_mod.block_hashes(np.asarray(tokens, dtype=np.int32), bs)
    assert len(h) == len(tokens) // bs
    if len(h) >= 2:  # same block content under a different parent hashes differently
        moved = bm_mod.block_hashes(np.asarray(tokens[bs:2 * bs] + tokens[bs:2 * bs], dtype=np.int32), bs)
        assert moved[0] != h[1] or tokens[:bs] == tokens[bs:2 * bs]


def test_prefix_hit_memo_is_per_allocator_and_dropped_on_eviction():
    """The router asks every replica's allocator about one sequence: each answers from its own cache."""
    prefix = list(range(1000, 1016))  # 4 full blocks of 4
    a, b = BlockManager(8, 4), BlockManager(8, 4)
    owner = seq_of(0, 20, prefix)
    a.allocate(owner, 20)
    owner.num_computed_tokens = 20
    probe = seq_of(1, 20, prefix)
    assert a.get_computed_blocks(probe) == list(owner.block_table[:4])  # a full-chain hit: memoized
    assert b.get_computed_blocks(probe) == []  # the other allocator caches nothing
    assert a.get_computed_blocks(probe) == list(owner.block_table[:4])
    a.deallocate(owner)  # cached, free; a 6-block request must evict some of them
    filler = seq_of(2, 24)
    a.allocate(filler, 24)
    assert a.num_cached_blocks < 4
    assert len(a.get_computed_blocks(probe)) < 4  # the memo went with the eviction
