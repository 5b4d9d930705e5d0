"""The paged BlockManager: hand-computed block counts, prefix caching, misuse, and invariants."""

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from twin_machine import TwinMachine, computed, seq_of

from kvsim.engine import block_manager as bm_mod
from kvsim.engine.block_manager import AllocationError, BlockManager
from kvsim.engine.reference_pool import ReferencePool


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


def refs(bm, n):
    return [bm.ref_count(b) for b in range(n)]


def test_an_owned_table_edited_in_place_still_fails_the_reference_counts():
    bm = BlockManager(8, 4)
    prefix = list(range(8))
    a, b = seq_of(0, 8, prefix), seq_of(1, 8, prefix)
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.allocate(b, 8)
    b.num_computed_tokens = 8
    b.block_table[1] = 7  # a free block at a shareable position
    before = (refs(bm, 8), bm.num_free_blocks)
    with pytest.raises(AllocationError, match="which is free"):
        bm.deallocate(b)
    assert (refs(bm, 8), bm.num_free_blocks) == before


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
    before = (refs(bm, 8), bm.num_free_blocks, bm.free_block_ids())
    victim = seq_of(2, 12, prefix if shares_prefix else None)
    victim.block_table = array("i", bad_table(a.block_table, b.block_table))
    with pytest.raises(AllocationError):
        bm.deallocate(victim)
    assert (refs(bm, 8), bm.num_free_blocks, bm.free_block_ids()) == before
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
    assert [bm.ref_count(x) for x in hits] == [2, 2]
    assert list(b.block_table[:2]) == hits and b.block_table[2] not in a.block_table
    assert bm.num_shared_refs == 2  # b's two hit blocks: the decode attention reads them once
    bm.deallocate(a)
    assert bm.num_shared_refs == 0 and [bm.ref_count(x) for x in hits] == [1, 1]


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


def test_a_preempted_sequence_rehits_its_own_blocks_prompt_and_generated():
    """Unique content (no token_ids): 10 prompt tokens, then 6 generated; 4 full blocks of 4. Freed
    unfinished (a recompute preemption), they stay cached, tail block first in the LRU queue."""
    bm = BlockManager(8, 4)
    a = seq_of(0, 10, output_len=20)
    bm.allocate(a, 10)
    a.num_computed_tokens, a.num_output_tokens, a.num_tokens = 10, 1, 11
    for _ in range(6):  # decode: the slot for the newest token, then it is computed
        bm.append(a, 1)
        a.num_computed_tokens += 1
        a.num_output_tokens += 1
        a.num_tokens += 1
    assert list(a.block_table) == [0, 1, 2, 3] and (a.num_computed_tokens, a.num_tokens) == (16, 17)
    bm.deallocate(a)
    assert bm.free_block_ids() == [4, 5, 6, 7, 3, 2, 1, 0] and bm.num_cached_blocks == 4
    c = seq_of(1, 20, output_len=1)  # 5 blocks: the 4 never used, then the LRU head, a's tail block
    bm.allocate(c, 20)
    assert list(c.block_table) == [4, 5, 6, 7, 3] and bm.num_cached_blocks == 3
    c.num_computed_tokens, c.num_output_tokens = 20, 1
    bm.deallocate(c)  # finished: its 5 full blocks stay cached behind a's
    assert bm.free_block_ids() == [2, 1, 0, 3, 7, 6, 5, 4] and bm.num_cached_blocks == 8
    hits = bm.get_computed_blocks(a)
    assert list(hits) == [0, 1, 2]  # 12 of its 16 computed tokens survive
    bm.allocate(a, a.num_tokens - 12, hits)  # 5 tokens: 2 new blocks off the head
    assert a.num_computed_tokens == 12 and a.num_cached_tokens == 12
    assert list(a.block_table) == [0, 1, 2, 3, 7] and bm.free_block_ids() == [6, 5, 4]
    assert bm.num_cached_blocks == 3


def test_a_full_rehit_leaves_one_token_to_compute():
    bm = BlockManager(8, 4)
    a = seq_of(0, 8, output_len=20)
    bm.allocate(a, 8)
    a.num_computed_tokens, a.num_output_tokens, a.num_tokens = 8, 1, 9
    bm.deallocate(a)  # preempted right after its prefill: 2 full blocks, 9 tokens to recompute
    hits = bm.get_computed_blocks(a)
    assert list(hits) == [1, 0][::-1] and len(hits) * 4 == 8  # (9 - 1) // 4 = 2 blocks may hit
    bm.allocate(a, 1, hits)
    assert len(a.block_table) == 3 and a.num_computed_tokens == 8


def test_a_finished_sequence_leaves_its_full_blocks_cached_and_no_parking():
    bm = BlockManager(8, 4)
    a = seq_of(0, 6, output_len=3)
    bm.allocate(a, 6)
    a.num_computed_tokens, a.num_output_tokens = 8, 3  # all generated; the last token has no KV
    bm.append(a, 0)
    bm.deallocate(a)
    assert bm.num_cached_blocks == 2 and bm.free_block_ids()[-2:] == [1, 0]
    assert not bm._parked


def test_prefix_caching_off_caches_nothing():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = seq_of(0, 8, list(range(8)), output_len=20)
    bm.allocate(a, 8)
    a.num_computed_tokens, a.num_tokens = 8, 9
    bm.deallocate(a)
    assert bm.num_cached_blocks == 0 and not bm.get_computed_blocks(a)


def test_keyed_tokens_share_blocks_by_key_and_expand_to_the_same_tokens():
    from kvsim.scenario.trace_rows import block_token_ids
    from kvsim.sequence import KeyedTokens

    def keyed(keys, length):
        return KeyedTokens(np.array(keys, dtype=np.int64), 512, length, block_token_ids)

    a, b, c = keyed([0, 1], 1000), keyed([0, 2], 1024), keyed([0, 1], 600)
    ha, hb, hc = (bm_mod.block_hashes(x, 16) for x in (a, b, c))
    assert (len(ha), len(hb), len(hc)) == (62, 64, 37)
    assert (ha[:32] == hb[:32]).all() and not (ha[32:62] == hb[32:62]).any()
    assert (ha[:37] == hc).all()  # the same keys, cut shorter: the same blocks
    tokens = np.asarray(a)
    assert len(tokens) == 1000 and np.array_equal(tokens, block_token_ids(np.array([0, 1]))[:1000])
    assert np.array_equal(a[512:520], tokens[512:520]) and a.tobytes() == tokens.tobytes()


def test_remembered_keyed_chains_equal_fresh_ones_and_tell_dtypes_apart():
    from kvsim.engine import prefix_cache
    from kvsim.scenario.trace_rows import block_token_ids
    from kvsim.sequence import KeyedTokens

    keys = np.array([5, 7, 9], dtype=np.int64)
    fresh = prefix_cache.chain(keys.astype(np.uint64))
    first = prefix_cache.block_hashes(KeyedTokens(keys, 512, 1536, block_token_ids), 16)
    again = prefix_cache.block_hashes(KeyedTokens(keys.copy(), 512, 1536, block_token_ids), 16)
    assert np.array_equal(first, again) and np.array_equal(first[::32], fresh + prefix_cache._WITHIN[32][0])
    remembered = prefix_cache._keyed_chain(keys)
    assert remembered is prefix_cache._keyed_chain(keys.copy()) and not remembered.flags.writeable
    # int32 [1, 0] has the bytes of int64 [1]: the remembered chains are keyed by the values
    a = prefix_cache._keyed_chain(np.array([1, 0], dtype=np.int32))
    b = prefix_cache._keyed_chain(np.array([1], dtype=np.int64))
    assert len(a) == 2 and len(b) == 1 and a[0] == b[0]


# ---- against the specification: kvsim.engine.reference_pool (vLLM v0.11.0's block pool) ------

PREFIXES = [list(range(k * 100, k * 100 + 24)) for k in range(3)]
CONVERSATIONS = [list(range(5000 + k * 100, 5000 + k * 100 + 60)) for k in range(2)]


class BlockManagerMachine(TwinMachine):
    """Random admissions, prefill chunks, decodes, cohort reservations and claims, preemptions and
    finishes against a tiny cache, driven the same on BlockManager and on its specification
    ReferencePool (each with its own twin of every sequence): the same hits, the same tables, the
    same free queue, block for block, and the same figures. The one licensed difference: where
    concurrent prefills cached the same content twice, BlockManager may hit another copy than the
    first registered one (see kvsim.engine.reference_pool)."""

    def __init__(self):
        super().__init__(BlockManager(24, 4, enable_prefix_caching=True), ReferencePool(24, 4))
        self.bm = self.fast
        self.said: dict[int, int] = {}  # a conversation's tokens so far (its last turn's prompt and reply)

    def same(self, a, b) -> bool:  # a table and a list of the same blocks agree
        return a == b or (a is not AllocationError and b is not AllocationError and list(a) == list(b))

    def _admit(self, pair, chunk):
        hits = [a.get_computed_blocks(s) for a, s in zip((self.bm, self.ref), pair)]
        assert len(hits[0]) == len(hits[1]), (list(hits[0]), hits[1], pair[0].seq_id)  # the same longest hit ...
        if list(hits[0]) != hits[1]:  # ... where two copies of the content are cached, maybe another copy:
            keys = self.ref.keys(pair[1], len(hits[1]))  # then it must hold the same content, and the spec
            assert [self.ref.key[b] for b in hits[0]] == keys  # follows BlockManager's choice from there
            hits[1] = list(hits[0])
        s = pair[0]
        need = min(chunk, s.num_tokens - len(hits[0]) * 4)
        fits = [a.can_allocate(t, need, h) for a, t, h in zip((self.bm, self.ref), pair, hits)]
        assert fits[0] == fits[1]
        if not fits[0]:
            return False
        for a, t, h in zip((self.bm, self.ref), pair, hits):
            a.allocate(t, need, h)
            computed(t, need)
        self.live.append(pair)
        return True

    @rule(group=st.sampled_from([None, 0, 1, 2]), shared=st.integers(1, 24), extra=st.integers(0, 12),
          chunk=st.sampled_from([1000, 1000, 3, 5, 8]))
    def admit(self, group, shared, extra, chunk):
        tokens = None if group is None else PREFIXES[group][:shared]
        prompt = (shared if group is not None else 1) + extra
        pair = (seq_of(self.next_id, prompt, tokens, output_len=1000), seq_of(self.next_id, prompt, tokens, output_len=1000))
        self.next_id += 1
        self._admit(pair, chunk)

    @rule(conv=st.sampled_from([0, 1]), new=st.integers(1, 9), reply=st.integers(0, 12),
          chunk=st.sampled_from([1000, 3, 8]))
    def admit_turn(self, conv, new, reply, chunk):
        """A conversation's next turn: its prompt is the conversation so far and `new` tokens, and
        its shareable content runs on into its reply (which the turn after carries), so generated
        blocks are registered too."""
        prompt = self.said.get(conv, 0) + new
        if prompt + reply > len(CONVERSATIONS[conv]):
            return
        self.said[conv] = prompt + reply
        tokens = CONVERSATIONS[conv][:prompt + reply]
        pair = tuple(seq_of(self.next_id, prompt, tokens, output_len=1000) for _ in range(2))
        self.next_id += 1
        self._admit(pair, chunk)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 9))
    def cohort_run(self, i, n):
        """n decode steps as the decode cohort takes them: the blocks reserved at once, written
        (note_written), then claimed by the member when it leaves."""
        pair = self.live[i % len(self.live)]
        s = pair[0]
        if s.num_computed_tokens != s.num_tokens - 1 or not s.num_output_tokens:
            return  # not decoding (the cohort takes sequences past their prompt)
        need = -(-(s.num_computed_tokens + n) // 4) - len(s.block_table)
        if need > self.bm.num_free_blocks:
            return
        for a, t in zip((self.bm, self.ref), pair):
            a.reserve(max(0, need))
            a.note_written(n)
            t.num_computed_tokens += n
            t.num_output_tokens += n
            t.num_tokens += n
            a.claim(t)

    @invariant()
    def same_tables_as_the_specification(self):
        for a, b in self.live:
            assert list(a.block_table) == list(b.block_table)

    @invariant()
    def refcounts_match_tables(self):
        """Shareable positions are reference counted; every other block has exactly one table."""
        counts, private = [0] * 24, []
        for s, _ in self.live:
            k = min(len(s.block_table), self.bm.num_shareable(s))
            for b in s.block_table[:k]:
                counts[b] += 1
            private += s.block_table[k:]
        assert counts == refs(self.bm, 24)
        assert self.bm.num_shared_refs == sum(c - 1 for c in counts if c > 1)  # every holder past a block's first
        assert len(private) == len(set(private))
        assert not any(counts[b] for b in private)

    @invariant()
    def tables_cover_tokens(self):
        for s, _ in self.live:
            assert len(s.block_table) == -(-s.num_computed_tokens // 4)
        assert self.bm.reserved_unused_tokens == sum(len(s.block_table) * 4 - s.num_computed_tokens
                                                     for s, _ in self.live)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


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
    assert not b.get_computed_blocks(probe)  # the other allocator caches nothing
    assert a.get_computed_blocks(probe) == list(owner.block_table[:4])
    a.deallocate(owner)  # cached, free; a 6-block request must evict some of them
    filler = seq_of(2, 24)
    a.allocate(filler, 24)
    assert a.num_cached_blocks < 4
    assert len(a.get_computed_blocks(probe)) < 4  # the memo went with the eviction


def test_cached_ahead_counts_what_pops_would_evict():
    """A run of pops, counted before it happens, evicts what the pops then evict, stale entries
    (hits taken from the middle) and uncached entries (partly filled tail blocks) included."""
    bm = BlockManager(12, 4)
    seqs = [seq_of(i, 10, list(range(100 * i, 100 * i + 10)), output_len=50) for i in range(3)]
    for s in seqs:  # 3 blocks each: 2 full (cached once freed), the last holding 2 tokens
        bm.allocate(s, 10)
        s.num_computed_tokens = 10
    for s in seqs:
        s.num_output_tokens = s.request.output_len
        bm.deallocate(s)
    again = seq_of(9, 10, list(range(100, 110)))  # hits the second table's 2 full blocks: stale entries
    bm.allocate(again, 2, bm.get_computed_blocks(again))
    queue = bm.free_queue
    counts = list(range(1, queue.num_free + 1))
    ahead = queue.cached_ahead(counts)
    before = queue.num_cached
    for n in counts:  # pop one block at a time and compare
        queue.pop(1)
        assert before - queue.num_cached == ahead[n - 1], n


def test_a_hit_carries_on_into_a_later_run_of_another_copy():
    """Found by the machine above: a conversation's prompt cached twice (a preempted turn re-ran it
    into other blocks). The readmitted sequence's hit follows the copy that reaches farthest from
    depth 1, which stops at 3; vLLM looks each block up by hash alone, so the hit goes on in the
    other copy's run that began at depth 2: all 4 blocks, as the specification finds them."""
    m = BlockManagerMachine()
    steps = [("admit", dict(chunk=1000, extra=0, group=None, shared=1)), ("finish", dict(i=0)),
             ("admit_turn", dict(chunk=3, conv=0, new=7, reply=7)), ("step", dict(i=0, n=1)), ("preempt", dict(i=0)),
             ("admit_turn", dict(chunk=3, conv=0, new=1, reply=0)), ("step", dict(i=0, n=1)), ("finish", dict(i=0)),
             ("readmit", dict(i=0)), ("admit_turn", dict(chunk=1000, conv=0, new=1, reply=0)), ("preempt", dict(i=0)),
             ("preempt", dict(i=0)), ("admit", dict(chunk=1000, extra=0, group=None, shared=1)), ("finish", dict(i=0)),
             ("readmit", dict(i=0)), ("cohort_run", dict(i=0, n=4))]
    for name, kwargs in steps:
        getattr(m, name)(**kwargs)
    fast, ref = m.preempted[0]
    assert len(m.bm.get_computed_blocks(fast)) == len(m.ref.get_computed_blocks(ref)) == 4
    m.readmit(0)
    m.same_tables_as_the_specification()
    m.refcounts_match_tables()
