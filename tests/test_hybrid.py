"""The hybrid KV cache allocator (kvsim.engine.hybrid) against its specification
(kvsim.engine.hybrid_reference: vLLM v0.11.0's coordinator written plainly), and the specification
against hand-worked cases of vLLM's rules."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from twin_machine import TwinMachine, computed, seq_of

from kvsim.engine.block_manager import AllocationError
from kvsim.engine.hybrid import HybridBlockManager
from kvsim.engine.hybrid_reference import NULL, HybridReference, contiguous_needed


def table(alloc, seq, g):
    """Group g's table with the positions that left the window as NULL."""
    if isinstance(alloc, HybridBlockManager):
        ht = alloc.table(seq)
        t = list(ht.tables[g])
        return [NULL] * min(ht.skipped, len(t)) + t[ht.skipped:] if alloc.windows[g] else t
    return list(alloc.tables[seq][g])


# ---- the specification against vLLM's rules, by hand ---------------------------------------------

def test_a_sliding_group_frees_the_blocks_that_left_the_window_before_the_step():
    """Window 8, blocks of 4 (gpt-oss's rule at a small scale): at 13 computed tokens the window
    starts at token 13 - 8 + 1 = 6, so block 0 (tokens 0-3) is wholly out and freed, block 1 kept."""
    for alloc in (HybridReference(20, 4, (0, 8)), HybridBlockManager(20, 4, (0, 8))):
        s = seq_of(1, 13, output_len=4)
        alloc.allocate(s, 13)
        computed(s, 13)
        assert alloc.num_free_blocks == 20 - 2 * 4  # both groups hold 4 blocks for 13 tokens
        assert alloc.can_append(s, 1)  # remove_skipped_blocks at 13: block 0 of the sliding group
        assert table(alloc, s, 1)[0] == NULL and table(alloc, s, 0)[0] != NULL
        alloc.append(s, 1)
        assert alloc.num_free_blocks == 20 - 4 - 3


def test_the_freed_blocks_join_the_tail_last_first_and_stay_cached():
    """vLLM frees removed blocks in the order found, from the last skipped to the first."""
    for alloc in (HybridReference(40, 4, (0, 4)), HybridBlockManager(40, 4, (0, 4))):
        s = seq_of(1, 24, output_len=4)
        alloc.allocate(s, 24)
        computed(s, 24)
        sliding = table(alloc, s, 1)
        alloc.append(s, 1)  # window 4 at 24 computed: tokens before 21 out, blocks 0-4 freed
        assert alloc.free_block_ids()[-5:] == sliding[4::-1]
        assert alloc.num_cached_blocks == 5


def test_prefix_hit_needs_the_window_of_contiguous_sliding_blocks():
    """A second request of the same prompt hits the full group's blocks only as far as the sliding
    group has ceil((w - 1) / block) contiguous cached blocks ending there; before them, nulls."""
    prompt = list(range(40))
    for alloc in (HybridReference(60, 4, (0, 8)), HybridBlockManager(60, 4, (0, 8))):
        a = seq_of(1, 40, prompt, output_len=100)
        alloc.allocate(a, 40)
        computed(a, 40)
        alloc.append(a, 1)  # frees sliding blocks 0-7 (tokens before 33), cached
        computed(a, 1)
        b = seq_of(2, 40, prompt, output_len=4)
        hit = alloc.get_computed_blocks(b)
        assert contiguous_needed(8, 4) == 2
        assert len(hit) == 9  # (40 - 1) // 4 blocks; the sliding group's last two are cached
        assert list(hit[0]) == table(alloc, a, 0)[:9]
        assert list(hit[1])[:7] == [NULL] * 7  # the window's two blocks: 7 (freed, cached) and 8 (a's)
        assert hit[1][7] in alloc.free_block_ids() and hit[1][8] == table(alloc, a, 1)[8]
        assert alloc.can_allocate(b, 4, hit)
        free = alloc.num_free_blocks
        alloc.allocate(b, 4, hit)
        assert alloc.num_free_blocks == free - 1 - 2  # block 7 revived, one new block a group


def test_an_evicted_window_block_shortens_the_hit():
    """With the blocks before the hit's end evicted, the sliding search goes left to the next run of
    two contiguous cached blocks, and the full-attention hit is cut to it."""
    prompt = list(range(40))
    for alloc in (HybridReference(22, 4, (0, 8)), HybridBlockManager(22, 4, (0, 8))):
        a = seq_of(1, 40, prompt, output_len=100)
        alloc.allocate(a, 40)  # 10 + 10 blocks; 2 never used
        computed(a, 40)
        sliding = table(alloc, a, 1)
        alloc.append(a, 1)  # sliding blocks 7..0 freed (the last first), then one new block a group
        computed(a, 1)
        alloc.deallocate(a)  # the full group's 11 blocks, then the sliding group's live 3, tail first
        x = seq_of(9, 4, output_len=4)
        alloc.allocate(x, 4)  # takes the queue's head: sliding blocks 7 and 6, evicted
        b = seq_of(2, 40, prompt, output_len=4)
        hit = alloc.get_computed_blocks(b)
        assert len(hit) == 6  # full blocks 0-8 cached; sliding 8 cached, 7 and 6 gone, 5 and 4 a window
        assert list(hit[1]) == [NULL] * 4 + [sliding[4], sliding[5]]


def test_a_model_of_sliding_layers_only_holds_the_window():
    """Mistral-7B-v0.1's layout: one sliding group; a decoding sequence holds ceil((w-1)/b) + 1 blocks."""
    for alloc in (HybridReference(100, 4, (8,)), HybridBlockManager(100, 4, (8,))):
        s = seq_of(1, 4, output_len=200)
        alloc.allocate(s, 4)
        computed(s, 4)
        for _ in range(60):
            alloc.append(s, 1)
            computed(s, 1)
            assert alloc.num_used_blocks <= contiguous_needed(8, 4) + 1 + 1


def test_hybrid_allocator_refuses_two_windows_and_swap_in():
    with pytest.raises(ValueError):
        HybridBlockManager(10, 4, (0, 8, 16))
    alloc = HybridBlockManager(10, 4, (0, 8))
    s = seq_of(1, 8)
    s.num_computed_tokens = 8  # a swapped-out sequence coming back
    with pytest.raises(AllocationError):
        alloc.can_allocate(s, 1)


# ---- against the specification --------------------------------------------------------------------

PREFIXES = [list(range(k * 100, k * 100 + 40)) for k in range(3)]
BS = 4


class HybridMachine(TwinMachine):
    """Random admissions (with shared prefixes), prefill chunks, decodes, decode-cohort runs (blocks
    reserved at once, releases at every step, claims on leaving), preemptions, re-admissions and
    finishes against a tiny cache, driven the same on HybridBlockManager and on HybridReference (each
    with its own twin of every sequence): the same hits, tables, free queue block for block, figures."""

    windows = (0, 8)

    def __init__(self):
        super().__init__(HybridBlockManager(40, BS, self.windows, max_num_batched_tokens=16),
                         HybridReference(40, BS, self.windows, max_num_batched_tokens=16))

    def _admit(self, pair, chunk):
        hits = [a.get_computed_blocks(s) for a, s in zip((self.fast, self.ref), pair)]
        assert [list(h) for h in hits[0]] == [list(h) for h in hits[1]], (hits, pair[0].seq_id)
        s = pair[0]
        need = min(chunk, s.num_tokens - len(hits[0]) * BS)
        fits = [a.can_allocate(t, need, h) for a, t, h in zip((self.fast, self.ref), pair, hits)]
        assert fits[0] == fits[1]
        if not fits[0]:
            return False
        for a, t, h in zip((self.fast, self.ref), pair, hits):
            a.allocate(t, need, h)
            computed(t, need)
        assert pair[0].num_cached_tokens == pair[1].num_cached_tokens
        self.live.append(pair)
        return True

    @rule(group=st.sampled_from([None, 0, 1, 2]), shared=st.integers(1, 40), extra=st.integers(0, 12),
          chunk=st.sampled_from([1000, 1000, 3, 5, 8]))
    def admit(self, group, shared, extra, chunk):
        tokens = None if group is None else PREFIXES[group][:shared]
        prompt = (shared if group is not None else 1) + extra
        pair = tuple(seq_of(self.next_id, prompt, tokens, output_len=1000) for _ in range(2))
        self.next_id += 1
        self._admit(pair, chunk)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 24))
    def cohort_run(self, i, n):
        """n decode steps as the decode cohort takes them: at each step the member's releases, then
        the step's blocks reserved; its tokens written (note_written); claimed when it leaves."""
        pair = self.live[i % len(self.live)]
        s = pair[0]
        if s.num_computed_tokens != s.num_tokens - 1 or not s.num_output_tokens:
            return
        c0, groups = s.num_computed_tokens, len(self.windows)
        need = sum(groups for j in range(n) if (c0 + j) % BS == 0)
        if need > self.fast.num_free_blocks:
            return
        for j in range(n):
            freed = [a.release(t, c0 + j) for a, t in zip((self.fast, self.ref), pair)]
            assert freed[0] == freed[1]  # the blocks freed, and the count at which the next release comes
            for a in (self.fast, self.ref):
                a.reserve(groups if (c0 + j) % BS == 0 else 0)
        for a, t in zip((self.fast, self.ref), pair):
            a.note_written(n)
            t.num_computed_tokens += n
            t.num_output_tokens += n
            t.num_tokens += n
            a.claim(t)

    @invariant()
    def same_tables_as_the_specification(self):
        fast, ref = self.fast, self.ref
        for a, b in self.live:
            for g in range(len(self.windows)):
                assert table(fast, a, g) == table(ref, b, g), (a.seq_id, g)

    @invariant()
    def tables_cover_tokens(self):
        for a, b in self.live:
            for g in range(len(self.windows)):
                assert len(table(self.ref, b, g)) == -(-b.num_computed_tokens // BS)


class SlidingOnlyMachine(HybridMachine):
    windows = (12,)


class ManySlidingGroupsMachine(HybridMachine):
    windows = (8, 0, 8, 8)


TestHybridMachine = HybridMachine.TestCase
TestSlidingOnlyMachine = SlidingOnlyMachine.TestCase
TestManySlidingGroupsMachine = ManySlidingGroupsMachine.TestCase
for _case in (TestHybridMachine, TestSlidingOnlyMachine, TestManySlidingGroupsMachine):
    _case.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
