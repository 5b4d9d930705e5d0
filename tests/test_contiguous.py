"""The contiguous allocator: slab sizes, first fit, coalescing, fragmentation, misuse, invariants."""

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.engine.block_manager import AllocationError
from kvsim.engine.contiguous import ContiguousAllocator

from conftest import make_seq


def admit(alloc, rid, prompt, output):
    """A sequence whose whole prompt is allocated, as the scheduler does at admission."""
    s = make_seq(rid, prompt, output)
    alloc.allocate(s, prompt)
    s.num_computed_tokens = prompt  # what postprocess does after the prefill step
    return s


def test_slab_reserves_max_model_len_whatever_the_prompt():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=30)
    s = admit(alloc, 0, prompt=3, output=2)
    assert alloc.slab_blocks(s) == 8  # ceil(30 / 4)
    assert s.block_table == range(0, 8)
    assert alloc.num_free_blocks == 12 and alloc.num_used_blocks == 8
    assert alloc.reserved_unused_tokens == 8 * 4 - 3


def test_known_output_reserves_prompt_plus_output():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=30, reserve="known_output")
    a = admit(alloc, 0, prompt=10, output=3)  # 13 tokens -> 4 blocks
    b = admit(alloc, 1, prompt=4, output=4)  # 8 tokens -> exactly 2 blocks
    assert (alloc.slab_blocks(a), alloc.slab_blocks(b)) == (4, 2)
    assert (a.block_table, b.block_table) == (range(0, 4), range(4, 6))
    assert alloc.num_free_blocks == 14


def test_slot_mapping_is_linear_from_the_slab_start():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=8)
    admit(alloc, 0, 5, 1)  # blocks 0..1
    s = admit(alloc, 1, 5, 1)  # blocks 2..3: slots from 8
    assert alloc.slot_mapping(s, 0, 5) == [8, 9, 10, 11, 12]


def _four_slabs():
    """Slabs A [0,4), B [4,6), C [6,14), D [14,16); free [16,20). Block size 4, reserve known_output."""
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=64, reserve="known_output")
    seqs = [admit(alloc, 0, 10, 6),  # 16 tokens -> 4 blocks
            admit(alloc, 1, 5, 2),  # 7 tokens -> 2 blocks
            admit(alloc, 2, 20, 10),  # 30 tokens -> 8 blocks
            admit(alloc, 3, 3, 3)]  # 6 tokens -> 2 blocks
    return alloc, seqs


def test_fragmentation_of_a_hand_built_mix():
    alloc, (a, b, c, d) = _four_slabs()
    assert [s.block_table for s in (a, b, c, d)] == [range(0, 4), range(4, 6), range(6, 14), range(14, 16)]
    # internal: 16 blocks * 4 slots = 64 reserved, prompts 10 + 5 + 20 + 3 = 38 written
    assert alloc.reserved_unused_tokens == 64 - 38
    assert alloc.extents == [(16, 4)]
    assert alloc.external_fragmentation == 0.0
    alloc.deallocate(b)
    alloc.deallocate(d)  # [14,16) merges with the free tail [16,20)
    assert alloc.extents == [(4, 2), (14, 6)]
    assert alloc.num_free_blocks == 8 and alloc.largest_free_extent == 6
    # the last slab asked for was d's, 2 blocks: every hole holds one
    assert alloc.next_slab == 2 and alloc.external_fragmentation == 0.0
    assert not alloc.can_allocate(make_seq(9, 20, 8), 20)  # a 7-block slab: both holes too small
    assert alloc.next_slab == 7 and alloc.external_fragmentation == 1.0
    assert alloc.can_allocate(make_seq(10, 10, 10), 10)  # 5 blocks: only the 2-block hole is too small
    assert alloc.external_fragmentation == pytest.approx(2 / 8)
    # internal: 12 blocks * 4 = 48 reserved, 10 + 20 = 30 written
    assert alloc.reserved_unused_tokens == 48 - 30
    # 8 blocks are free but no hole holds a 7-block slab (20 + 8 = 28 tokens)
    big = make_seq(9, 20, 8)
    assert alloc.slab_blocks(big) == 7
    assert not alloc.can_allocate(big, 20)
    with pytest.raises(AllocationError):
        alloc.allocate(big, 20)
    assert alloc.extents == [(4, 2), (14, 6)]


def test_decode_appends_consume_internal_fragmentation():
    alloc, (a, b, c, d) = _four_slabs()
    before = alloc.reserved_unused_tokens
    alloc.append(a, 1)
    alloc.append(c, 1)
    assert alloc.reserved_unused_tokens == before - 2
    assert alloc.num_free_blocks == 4  # slabs never grow


def test_first_fit_takes_the_lowest_hole_that_fits():
    alloc, (a, b, c, d) = _four_slabs()
    alloc.deallocate(b)
    alloc.deallocate(d)  # holes: [4,6) of 2 blocks, [14,20) of 6
    e = admit(alloc, 4, 9, 3)  # 3 blocks: skips the 2-block hole
    assert e.block_table == range(14, 17)
    f = admit(alloc, 5, 4, 4)  # 2 blocks: the lowest hole fits exactly
    assert f.block_table == range(4, 6)
    g = admit(alloc, 6, 2, 2)  # 1 block: the lowest remaining hole
    assert g.block_table == range(17, 18)
    assert alloc.extents == [(18, 2)]


def test_freeing_coalesces_left_and_right_neighbours():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=16)
    x, y, z = (admit(alloc, i, 4, 1) for i in range(3))  # 4 blocks each: [0,4) [4,8) [8,12)
    alloc.deallocate(x)
    assert alloc.extents == [(0, 4), (12, 8)]
    alloc.deallocate(z)  # merges with the right neighbour
    assert alloc.extents == [(0, 4), (8, 12)]
    alloc.deallocate(y)  # merges with both
    assert alloc.extents == [(0, 20)]
    assert alloc.num_free_blocks == 20 and alloc.reserved_unused_tokens == 0
    assert len(x.block_table) == 0 and x.num_computed_tokens == 0


def test_double_free_raises():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=16)
    s = admit(alloc, 0, 4, 1)
    alloc.deallocate(s)
    with pytest.raises(AllocationError):
        alloc.deallocate(s)
    s.block_table = range(0, 4)  # a stale table of a freed slab
    with pytest.raises(AllocationError):
        alloc.deallocate(s)
    assert alloc.extents == [(0, 20)] and alloc.num_free_blocks == 20


def test_growing_past_the_slab_raises():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=64, reserve="known_output")
    s = admit(alloc, 0, 6, 3)  # 9 tokens -> 3 blocks = 12 slots, 6 written
    assert alloc.can_append(s, 6)
    assert not alloc.can_append(s, 7)
    with pytest.raises(AllocationError):
        alloc.append(s, 7)
    assert not alloc.can_allocate(make_seq(1, 6, 3), 13)  # a first chunk larger than its slab
    with pytest.raises(AllocationError):
        alloc.allocate(make_seq(1, 6, 3), 13)
    assert alloc.num_free_blocks == 17


def test_append_without_a_slab_and_prefix_hits_raise():
    alloc = ContiguousAllocator(num_blocks=20, block_size=4, max_model_len=16)
    s = make_seq(0, 4, 1)
    assert not alloc.can_append(s, 1)
    with pytest.raises(AllocationError):
        alloc.append(s, 1)
    assert alloc.get_computed_blocks(s) == []
    with pytest.raises(AllocationError):
        alloc.allocate(s, 4, [3])
    assert alloc.num_free_blocks == 20


def test_full_cache_refuses_a_new_slab():
    alloc = ContiguousAllocator(num_blocks=8, block_size=4, max_model_len=16)
    admit(alloc, 0, 4, 1)
    admit(alloc, 1, 4, 1)
    s = make_seq(2, 4, 1)
    assert not alloc.can_allocate(s, 4)
    with pytest.raises(AllocationError):
        alloc.allocate(s, 4)
    assert len(s.block_table) == 0 and alloc.num_free_blocks == 0
    assert alloc.external_fragmentation == 0.0


def test_bad_sizes_raise():
    with pytest.raises(ValueError):
        ContiguousAllocator(num_blocks=0, block_size=4, max_model_len=16)
    with pytest.raises(ValueError):
        ContiguousAllocator(num_blocks=4, block_size=0, max_model_len=16)


class ContiguousMachine(RuleBasedStateMachine):
    """Random admissions, growth and frees against an independent model of the address space."""

    NUM_BLOCKS, BS, MAX_LEN = 30, 4, 64

    def __init__(self):
        super().__init__()
        self.alloc = ContiguousAllocator(self.NUM_BLOCKS, self.BS, self.MAX_LEN, reserve="known_output")
        self.live = []
        self.freed = []
        self.next_id = 0

    @rule(prompt=st.integers(1, 40), output=st.integers(1, 24), frac=st.floats(0.05, 1.0))
    def admit(self, prompt, output, frac):
        s = make_seq(self.next_id, prompt, output)
        self.next_id += 1
        first = max(1, int(prompt * frac))
        need = self.alloc.slab_blocks(s)
        assert need == -(-(prompt + output) // self.BS)
        fits = [start for start, n in self.alloc.extents if n >= need]
        if not fits:
            assert not self.alloc.can_allocate(s, first)
            return
        assert self.alloc.can_allocate(s, first)
        self.alloc.allocate(s, first)
        s.num_computed_tokens = first
        assert s.block_table == range(min(fits), min(fits) + need)  # first fit: the lowest hole
        self.live.append(s)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 12))
    def grow(self, data, n):
        s = data.draw(st.sampled_from(self.live))
        room = len(s.block_table) * self.BS - s.num_computed_tokens
        assert self.alloc.can_append(s, n) == (n <= room)
        if n <= room:
            self.alloc.append(s, n)
            s.num_computed_tokens += n
        else:
            with pytest.raises(AllocationError):
                self.alloc.append(s, n)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        s = data.draw(st.sampled_from(self.live))
        self.live.remove(s)
        slab = s.block_table
        self.alloc.deallocate(s)
        s.block_table = slab  # keep the stale table: freeing it again must fail
        self.freed.append(s)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def double_free(self, data):
        s = data.draw(st.sampled_from(self.freed))
        free_before = list(self.alloc.extents)
        if any(set(s.block_table) & set(t.block_table) for t in self.live):
            return  # its old slab was handed out again; freeing that is another sequence's business
        with pytest.raises(AllocationError):
            self.alloc.deallocate(s)
        assert self.alloc.extents == free_before

    @invariant()
    def extents_sorted_coalesced_in_range(self):
        ext = self.alloc.extents
        for (s1, n1), (s2, n2) in zip(ext, ext[1:]):
            assert s1 + n1 < s2  # disjoint and not touching (else they would be merged)
        assert all(n > 0 and 0 <= s and s + n <= self.NUM_BLOCKS for s, n in ext)

    @invariant()
    def free_plus_used_is_total(self):
        free = sum(n for _, n in self.alloc.extents)
        used = sum(len(s.block_table) for s in self.live)
        assert free == self.alloc.num_free_blocks
        assert free + used == self.NUM_BLOCKS
        assert self.alloc.num_used_blocks == used

    @invariant()
    def slabs_are_consecutive_and_never_overlap(self):
        owner = {}
        for s in self.live:
            t = s.block_table
            assert isinstance(t, range) and t.step == 1 and len(t) == self.alloc.slab_blocks(s)
            for b in t:
                assert b not in owner
                owner[b] = s.seq_id
        for start, n in self.alloc.extents:
            assert not any(b in owner for b in range(start, start + n))

    @invariant()
    def fragmentation_figures(self):
        a = self.alloc
        written = sum(s.num_computed_tokens for s in self.live)
        assert a.reserved_unused_tokens == a.num_used_blocks * self.BS - written
        if a.num_free_blocks and a.next_slab:  # free blocks in holes too small for the last slab asked for
            small = sum(n for _, n in a.extents if n < a.next_slab)
            assert a.external_fragmentation == pytest.approx(small / a.num_free_blocks)


ContiguousMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestContiguousMachine = ContiguousMachine.TestCase
