"""The decode cohort: O(1) block counting against brute force, and members brought up to date."""

import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.engine.block_manager import BlockManager
from kvsim.engine.cohort import DecodeCohort
from kvsim.sequence import Request, Sequence


class _Alloc:
    grows = True

    def __init__(self, bs):
        self.block_size = bs

    def note_written(self, n):
        pass


def _counted_cohort(bs: int, clock: int, tokens) -> DecodeCohort:
    """A cohort at `clock` whose members' phases (tokens into their last block) are `tokens`."""
    c = DecodeCohort(_Alloc(bs))
    c.clock = clock
    for t in tokens:
        c.count_phase(t, 1)
        c.size += 1
    return c

@settings(max_examples=300, deadline=None)
@given(bs=st.sampled_from([1, 4, 8, 16, 32]), clock=st.integers(0, 10_000),
       tokens=st.lists(st.integers(0, 5000), max_size=30), steps=st.integers(0, 300))
def test_blocks_needed_matches_brute_force(bs, clock, tokens, steps):
    c = _counted_cohort(bs, clock, tokens)
    brute = sum(-(-(t + steps) // bs) - -(-t // bs) for t in tokens)
    assert c.blocks_needed(steps) == brute


def test_affordable_steps_is_the_largest_that_fits():
    c = DecodeCohort(_Alloc(4))
    for t in (3, 4, 9):  # 1, 0 and 3 free slots in their last blocks
        c.count_phase(t, 1)
        c.size += 1
    assert [c.blocks_needed(k) for k in range(1, 7)] == [1, 2, 2, 3, 4, 5]
    assert c.affordable_steps(6, 3) == (4, 3) and c.affordable_steps(6, 100) == (6, 5)
    assert c.affordable_steps(6, 0) == (0, 0)


def test_members_leave_up_to_date_with_their_blocks():
    bm = BlockManager(64, 4)
    c = DecodeCohort(bm)
    seqs = []
    for i, prompt in enumerate((5, 8, 11)):
        s = Sequence(Request(i, 0.0, prompt, 10))
        bm.allocate(s, prompt)
        s.num_computed_tokens = prompt
        s.num_output_tokens, s.num_tokens = 1, prompt + 1
        c.join(s)
        seqs.append(s)
    assert c.context == 24 and c.size == 3
    for _ in range(3):  # three runs of 2 steps: reserve, then advance
        bm.reserve(c.blocks_needed(2))
        c.advance(2)
    assert c.steps_to_next_finish() == 9 - 6
    bm.reserve(c.blocks_needed(3))
    c.advance(3)
    done = c.pop_finished()
    assert done == seqs and c.size == 0 and bm.num_reserved_blocks == 0
    for s, prompt in zip(seqs, (5, 8, 11)):
        assert s.num_output_tokens == 10 and s.num_computed_tokens == prompt + 9
        assert len(s.block_table) == -(-(prompt + 9) // 4)
        assert len(set(s.block_table)) == len(s.block_table)
    assert bm.reserved_unused_tokens == sum(len(s.block_table) * 4 - s.num_computed_tokens for s in seqs)
    for s in seqs:
        bm.deallocate(s)
    assert bm.num_free_blocks == 64


def test_dissolve_returns_members_in_join_order_and_clears_the_heap():
    bm = BlockManager(32, 4)
    c = DecodeCohort(bm)
    seqs = [Sequence(Request(i, 0.0, 4, 5)) for i in range(3)]
    for s in seqs:
        bm.allocate(s, 4)
        s.num_computed_tokens, s.num_output_tokens, s.num_tokens = 4, 1, 5
        c.join(s)
    bm.reserve(c.blocks_needed(1))
    c.advance(1)
    assert c.dissolve() == seqs and c.size == 0 and c.steps_to_next_finish() > 1 << 60
    assert all(s.num_computed_tokens == 5 and s.cohort_clock == -1 for s in seqs)
    assert np.all(np.array([len(s.block_table) for s in seqs]) == 2)


@settings(max_examples=200, deadline=None)
@given(bs=st.sampled_from([1, 4, 8, 16]), clock=st.integers(0, 1000),
       tokens=st.lists(st.integers(0, 500), max_size=20), steps=st.integers(0, 80))
def test_crossing_moments_match_brute_force(bs, clock, tokens, steps):
    c = _counted_cohort(bs, clock, tokens)
    crossings = [c.blocks_needed(j) - c.blocks_needed(j - 1) if j > 1 else c.blocks_needed(1) for j in range(1, steps + 1)]
    assert c.crossing_moments(steps) == (c.blocks_needed(steps), sum(j * n for j, n in enumerate(crossings, 1)),
                                         sum(j * j * n for j, n in enumerate(crossings, 1)))


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(-50, 50)), max_size=300))
def test_longest_offset_is_the_largest_of_a_multiset(ops):
    from collections import Counter

    from kvsim.engine.cohort import LongestOffset

    live, offsets = Counter(), LongestOffset()
    for add, value in ops:
        if add or not live:
            live[value] += 1
            offsets.add(value)
        else:
            gone = sorted(live)[abs(value) % len(live)]  # remove a value that is there
            live[gone] -= 1
            live += Counter()  # drop zeros
            offsets.remove(gone)
        if live:
            assert offsets.top == max(live)
    assert len(offsets._heap) <= 2 * len(offsets._count) + 65 or not live


@settings(max_examples=100, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["join", "join", "advance", "dissolve"]),
                                 st.integers(1, 3000), st.integers(1, 40)), max_size=60))
def test_cohort_longest_is_its_longest_member(events):
    c = DecodeCohort(_Alloc(16))
    c.grows = False  # no allocator to claim blocks from
    members, rid = [], 0
    for kind, ctx, n in events:
        if kind == "join":
            s = Sequence(Request(rid, 0.0, ctx, ctx + n))
            rid += 1
            s.num_computed_tokens, s.num_tokens, s.num_output_tokens = ctx, ctx + 1, 1
            c.join(s)
            members.append(s)
        elif kind == "advance":
            c.advance(min(n, c.steps_to_next_finish()))
            done = c.pop_finished()
            members = [s for s in members if s not in done]
        elif kind == "dissolve":
            c.dissolve()
            members = []
        assert c.longest() == max((s.num_computed_tokens + c.clock - s.cohort_clock for s in members), default=0)


def test_a_cohort_told_not_to_keeps_no_longest():
    c = DecodeCohort(_Alloc(16), track_longest=False)
    c.grows = False
    s = Sequence(Request(0, 0.0, 9, 20))
    s.num_computed_tokens, s.num_tokens, s.num_output_tokens = 9, 10, 1
    c.join(s)
    assert c.offsets is None and c.longest() == 0 and c.size == 1
    c.advance(19)
    assert c.pop_finished() == [s] and c.size == 0
