"""A Hypothesis state machine that drives a fast allocator and its executable specification the same
way, each with its own twin of every sequence, and asserts the same figures after every rule: shared
by the paged allocator's tests (BlockManager vs ReferencePool) and the hybrid one's
(HybridBlockManager vs HybridReference). Subclasses build `fast` and `ref` and add admission, cohort
runs and their own table invariants."""

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.engine.block_manager import AllocationError
from kvsim.sequence import Request, Sequence


def seq_of(rid, prompt_len, tokens=None, output_len=8):
    ids = None if tokens is None else np.asarray(tokens, dtype=np.int32)
    return Sequence(Request(rid, 0.0, prompt_len, output_len, ids))


def computed(s, n):
    """n more tokens computed; a step that reaches the last token samples one, which the next decode computes."""
    s.num_computed_tokens += n
    if s.num_computed_tokens == s.num_tokens:
        s.num_output_tokens += 1
        s.num_tokens += 1


class TwinMachine(RuleBasedStateMachine):
    def __init__(self, fast, ref):
        super().__init__()
        self.fast, self.ref = fast, ref
        self.live: list[tuple[Sequence, Sequence]] = []
        self.preempted: list[tuple[Sequence, Sequence]] = []
        self.next_id = 0

    def same(self, a, b) -> bool:
        """Whether the two allocators' answers agree (a subclass may license a difference)."""
        return a == b

    def _both(self, pair, call):
        """`call(allocator, seq)` on each allocator with its twin; both raise or neither does."""
        out = []
        for alloc, seq in zip((self.fast, self.ref), pair):
            try:
                out.append(call(alloc, seq))
            except AllocationError:
                out.append(AllocationError)
        assert self.same(out[0], out[1]), out
        return out[0]

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), n=st.integers(1, 9))
    def step(self, i, n):
        """A prefill chunk of up to n tokens, or n decode steps (each computes the newest token)."""
        pair = self.live[i % len(self.live)]
        for _ in range(n):
            s = pair[0]
            chunk = min(n, s.num_tokens - s.num_computed_tokens)
            if not self._both(pair, lambda a, t, chunk=chunk: a.can_append(t, chunk)):
                return
            for a, t in zip((self.fast, self.ref), pair):
                a.append(t, chunk)
                computed(t, chunk)
            if chunk > 1:
                return

    def _free(self, i):
        pair = self.live.pop(i % len(self.live))
        for a, t in zip((self.fast, self.ref), pair):
            a.deallocate(t)
        return pair

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def preempt(self, i):
        self.preempted.append(self._free(i))

    @precondition(lambda self: self.preempted)
    @rule(i=st.integers(0, 100))
    def readmit(self, i):
        pair = self.preempted[i % len(self.preempted)]
        if self._admit(pair, 1000):
            self.preempted.remove(pair)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        for t in self.live[i % len(self.live)]:
            t.num_output_tokens = t.request.output_len
        self._free(i)

    @invariant()
    def same_figures_as_the_specification(self):
        fast, ref = self.fast, self.ref
        assert fast.free_block_ids() == ref.free_block_ids()
        assert fast.block_counts() == ref.block_counts()
        assert fast.num_shared_refs == ref.num_shared_refs
        assert fast.reserved_unused_tokens == ref.reserved_unused_tokens
        counts = list(range(0, fast.num_free_blocks + 1, 3))
        assert fast.evictions_ahead(counts) == ref.evictions_ahead(counts)
