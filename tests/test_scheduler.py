"""The scheduler: hand-worked steps of vLLM V1 semantics, and invariants over random request mixes.

The scheduler is driven directly (schedule -> postprocess, with `extend_run` for runs of
identical decode steps), with arrivals at given step numbers, as the simulator would drive it.
"""

import random
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, Phase, event, given, settings, strategies as st

from kvsim.engine.block_manager import BlockManager
from kvsim.engine.contiguous import ContiguousAllocator
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.settings import EngineSettings
from kvsim.sequence import Request, Sequence, SequenceStatus

from conftest import make_seq

RUNNING, WAITING, SWAPPED, FINISHED, REJECTED = (
    SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED,
    SequenceStatus.FINISHED, SequenceStatus.REJECTED)


def sched_of(num_blocks=64, block_size=4, *, prefix=False, max_num_seqs=8, budget=64, max_model_len=256,
             chunked=True, mode="recompute", host_blocks=0, cohort=False):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix)
    settings = EngineSettings(block_size, max_num_seqs, budget, max_model_len, enable_chunked_prefill=chunked,
                              preemption_mode=mode, num_host_blocks=host_blocks)
    return Scheduler(bm, settings, use_cohort=cohort)


def step(sched):
    """One schedule + postprocess; returns the batch as [(seq_id, num_new)] and the batch itself."""
    batch = sched.schedule()
    work = [(s.seq_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]
    sched.postprocess(batch)
    return work, batch


def extend_run(sched, batch, max_steps: int) -> int:
    """A run of identical decode steps as the simulator takes one: plan_decode_run, then the extra
    steps' blocks reserved."""
    plan = sched.plan_decode_run(batch, max_steps)
    if plan.steps > 1:
        sched.commit_decode_run(plan)
    return plan.steps

# ---- hand-worked cases -------------------------------------------------------------------

def test_running_decodes_go_before_a_waiting_prompt():
    sched = sched_of(budget=64)
    a = make_seq(0, 10, 5)
    sched.add(a)
    assert step(sched)[0] == [(0, 10)]
    sched.add(make_seq(1, 100, 3))
    work, batch = step(sched)
    assert work == [(0, 1), (1, 63)]  # the decode first, the prompt takes what is left of 64
    assert (batch.num_decode_seqs, batch.num_prefill_seqs, batch.num_prefill_tokens) == (1, 1, 63)


def test_admit_before_leaves_later_arrivals_for_the_next_step_and_nothing_else():
    """Async scheduling: only requests that arrived by `admit_before` are admitted; a preempted request
    (back at the front, an early arrival) is not held; the hold is no capacity limit."""
    sched = sched_of(budget=64)
    a, b = make_seq(0, 10, 5, arrival=1.0), make_seq(1, 10, 5, arrival=3.0)
    sched.add(a)
    sched.add(b)
    sched.admit_before = 2.0
    work, batch = step(sched)
    assert work == [(0, 10)] and sched.holds_next and sched.admission_limit == ""
    assert list(sched.waiting) == [b]
    sched.admit_before = 3.0  # an arrival at the cut-off itself is admitted
    work, _ = step(sched)
    assert work == [(0, 1), (1, 10)] and not sched.holds_next and not sched.waiting
    full = sched_of(max_num_seqs=1, budget=64)  # a real limit comes first: it is what the metrics hear
    full.add(make_seq(0, 10, 5, arrival=0.0))
    full.add(make_seq(1, 10, 5, arrival=5.0))
    full.admit_before = 1.0
    step(full)
    assert full.admission_limit == "max_num_seqs" and not full.holds_next


def test_chunked_prefill_splits_100_tokens_as_40_40_20():
    sched = sched_of(budget=40)
    p = make_seq(0, 100, 3)
    sched.add(p)
    chunks, emitted_at = [], []
    for i in range(3):
        batch = sched.schedule()
        chunks.append(batch.num_new_tokens[0])
        emitted, _ = sched.postprocess(batch)
        emitted_at.append(p in emitted)
    assert chunks == [40, 40, 20]
    assert emitted_at == [False, False, True]  # the first token comes with the last chunk
    assert p.num_computed_tokens == 100 and p.num_output_tokens == 1


def test_decodes_ride_along_with_prefill_chunks():
    sched = sched_of(budget=40)
    d = make_seq(0, 8, 10)
    sched.add(d)
    step(sched)
    sched.add(make_seq(1, 100, 3))
    works = [step(sched)[0] for _ in range(3)]
    # each step: one decode token, then the prompt's chunk in the 39 tokens left
    assert works == [[(0, 1), (1, 39)], [(0, 1), (1, 39)], [(0, 1), (1, 22)]]
    assert d.num_output_tokens == 4


def test_without_chunking_a_prompt_waits_for_a_whole_prompt_step():
    def run(chunked):
        sched = sched_of(num_blocks=128, budget=128, max_model_len=128, max_num_seqs=64, chunked=chunked)
        decoders = [make_seq(i, 1, 2) for i in range(30)]
        for s in decoders:
            sched.add(s)
        step(sched)  # 30 one-token prompts
        sched.add(make_seq(99, 100, 2))
        return [step(sched)[0] for _ in range(2)]

    whole = run(chunked=False)
    assert whole[0] == [(i, 1) for i in range(30)]  # 98 tokens left: the 100-token prompt waits
    assert whole[1] == [(99, 100)]  # the decoders finished; the prompt goes in one step
    chunked = run(chunked=True)
    assert chunked[0] == [(i, 1) for i in range(30)] + [(99, 98)]
    assert chunked[1] == [(99, 2)]


def test_without_chunking_the_budget_is_at_least_max_model_len():
    assert sched_of(budget=32, max_model_len=200, chunked=False).max_num_batched_tokens == 200
    assert sched_of(budget=32, max_model_len=200, chunked=True).max_num_batched_tokens == 32


def _two_growing_then_preempt(mode, host_blocks=0):
    """6 blocks of 4: A and B (prompt 8, output 8) fill the cache at 12 tokens each; C waits for
    a slot (max_num_seqs 2). At A's 13th token A needs a block: B, the newest, is preempted."""
    sched = sched_of(num_blocks=6, block_size=4, max_num_seqs=2, mode=mode, host_blocks=host_blocks)
    a, b, c = make_seq(0, 8, 8), make_seq(1, 8, 8), make_seq(2, 4, 2)
    for s in (a, b, c):
        sched.add(s)
    for _ in range(5):  # prefill, then decodes up to 12 computed tokens each
        _, batch = step(sched)
        assert not batch.preempted
    assert (a.num_computed_tokens, b.num_computed_tokens, sched.allocator.num_free_blocks) == (12, 12, 0)
    batch = sched.schedule()
    return sched, (a, b, c), batch


def test_recompute_preempts_the_newest_and_requeues_it_first():
    sched, (a, b, c), batch = _two_growing_then_preempt("recompute")
    assert batch.preempted == [b]
    assert [s.seq_id for s in batch.seqs] == [0]  # nothing is admitted in a step that preempts
    assert b.status is WAITING and b.num_computed_tokens == 0 and len(b.block_table) == 0
    assert b.num_output_tokens == 5 and b.num_preemptions == 1 and sched.num_preemptions == 1
    assert list(sched.waiting) == [b, c]
    assert batch.swap_out_blocks == 0
    sched.postprocess(batch)
    step(sched)
    step(sched)  # A finishes (8 outputs)
    assert a.status is FINISHED
    work, _ = step(sched)
    assert work == [(1, 13), (2, 4)]  # B recomputes its prompt and 5 outputs, then C


def test_swap_preemption_keeps_computed_tokens_and_counts_blocks():
    sched, (a, b, c), batch = _two_growing_then_preempt("swap", host_blocks=100)
    assert batch.preempted == [b]
    assert b.status is SWAPPED and list(sched.swapped) == [b]
    assert b.num_computed_tokens == 12 and len(b.block_table) == 0
    assert batch.swap_out_blocks == 3 and sched.num_swapped_blocks == 3
    assert list(sched.waiting) == [c]
    sched.postprocess(batch)
    for _ in range(2):
        step(sched)
    work, batch = step(sched)
    assert work == [(1, 1), (2, 4)]  # B resumes with its KV: one token, not 13
    assert b.num_output_tokens == 6


def test_swap_in_moves_back_the_blocks_that_were_swapped_out():
    sched, (a, b, c), batch = _two_growing_then_preempt("swap", host_blocks=100)
    sched.postprocess(batch)
    for _ in range(2):
        step(sched)
    _, batch = step(sched)
    assert batch.swap_in_blocks == 3
    assert sched.num_swapped_blocks == 0


def test_swap_falls_back_to_recompute_when_host_space_is_full():
    sched, (a, b, c), batch = _two_growing_then_preempt("swap", host_blocks=2)
    assert b.status is WAITING and b.num_computed_tokens == 0
    assert batch.swap_out_blocks == 0 and sched.num_swapped_blocks == 0
    assert list(sched.waiting) == [b, c]


def test_swapped_out_long_prompt_is_resumed():
    sched = sched_of(num_blocks=12, block_size=4, budget=16, mode="swap", host_blocks=100)
    a, b = make_seq(0, 4, 30), make_seq(1, 44, 1)
    sched.add(a)
    sched.add(b)
    for _ in range(200):
        if not sched.has_work:
            break
        _, batch = step(sched)
        assert batch.seqs, "no progress with work queued"
    assert a.status is FINISHED and b.status is FINISHED


def test_prefix_hit_makes_the_second_sequence_compute_less():
    shared = np.arange(1000, 1016, dtype=np.int32)  # 16 shareable tokens = 4 blocks of 4

    def run(prefix):
        sched = sched_of(block_size=4, prefix=prefix)
        first, second = make_seq(0, 20, 5, shared), make_seq(1, 22, 2, shared)
        sched.add(first)
        step(sched)
        sched.add(second)
        work, batch = step(sched)
        return first, second, work, batch

    first, second, work, batch = run(prefix=True)
    assert work == [(0, 1), (1, 6)]  # 22 - 16 cached
    assert second.num_cached_tokens == 16
    assert second.block_table[:4] == first.block_table[:4]
    assert batch.prefill_context_tokens == 16  # the chunk attends to the 16 cached tokens
    _, second, work, _ = run(prefix=False)
    assert work == [(0, 1), (1, 22)] and second.num_cached_tokens == 0


def test_whole_prompt_in_cache_still_computes_one_token():
    shared = np.arange(16, dtype=np.int32)
    sched = sched_of(block_size=4, prefix=True)
    sched.add(make_seq(0, 16, 1, shared))
    step(sched)
    sched.add(make_seq(1, 16, 1, shared))
    work, _ = step(sched)
    assert work == [(1, 4)]  # the last block is recomputed so the step has a token to sample from


def test_too_long_or_too_large_requests_are_rejected_at_add():
    sched = sched_of(num_blocks=10, block_size=4, max_model_len=64)
    long = make_seq(0, 60, 5)  # 65 > max_model_len
    assert not sched.add(long)
    assert long.status is REJECTED and "max_model_len" in long.reject_reason
    big = make_seq(1, 40, 10)  # 50 tokens = 13 blocks > 10
    assert not sched.add(big)
    assert big.status is REJECTED and "13" in big.reject_reason and "10" in big.reject_reason
    ok = make_seq(2, 30, 10)  # 40 tokens = 10 blocks
    assert sched.add(ok) and ok.status is WAITING and ok.reject_reason == ""
    assert list(sched.waiting) == [ok]


def test_contiguous_slab_larger_than_the_cache_is_rejected():
    alloc = ContiguousAllocator(num_blocks=10, block_size=4, max_model_len=64)  # 16-block slabs
    sched = Scheduler(alloc, EngineSettings(4, 4, 64, 64))
    s = make_seq(0, 4, 4)
    assert not sched.add(s)
    assert s.status is REJECTED and s.reject_reason
    assert not sched.has_work


def test_max_num_seqs_caps_admission():
    sched = sched_of(max_num_seqs=2, budget=128)
    for i in range(4):
        sched.add(make_seq(i, 10, 5))
    work, _ = step(sched)
    assert work == [(0, 10), (1, 10)]
    assert len(sched.waiting) == 2


def run_to_end(sched, limit=1000):
    for _ in range(limit):
        if not sched.has_work:
            return
        batch = sched.schedule()
        sched.postprocess(batch, extend_run(sched, batch, 1 << 30))
    raise AssertionError("did not finish")


def test_decode_run_reserves_the_extra_steps_and_stops_at_the_shortest_output():
    sched = sched_of(num_blocks=64, block_size=4, cohort=True)
    a, b = make_seq(0, 5, 20), make_seq(1, 7, 9)
    sched.add(a)
    sched.add(b)
    step(sched)  # prefill: a at 5 computed + 1 out, b at 7 + 1; 2 blocks each
    batch = sched.schedule()
    assert batch.is_pure_decode and batch.num_tokens == 2
    k = extend_run(sched, batch, 100)
    assert k == 8  # b has 8 outputs left
    # a writes positions 5..12 and b 7..14: 4 blocks each
    assert sched.allocator.num_free_blocks == 64 - 8
    _, finished = sched.postprocess(batch, k)
    assert finished == [b] and b.status is FINISHED and b.num_output_tokens == 9
    assert sched.allocator.num_free_blocks == 64 - 4  # a: 13 tokens in 4 blocks; b freed
    assert sched.allocator.reserved_unused_tokens == 4 * 4 - 13
    assert sched.num_running == 1
    run_to_end(sched)
    assert a.status is FINISHED and a.num_output_tokens == 20
    assert sched.allocator.num_free_blocks == 64 and sched.allocator.reserved_unused_tokens == 0


def test_decode_run_stops_before_the_cache_runs_out():
    sched = sched_of(num_blocks=10, block_size=4, cohort=True)
    a, b = make_seq(0, 4, 30), make_seq(1, 4, 30)
    sched.add(a)
    sched.add(b)
    step(sched)  # a, b: 4 computed, 1 block each
    batch = sched.schedule()  # token 5 of each takes a second block
    assert sched.allocator.num_free_blocks == 6
    k = extend_run(sched, batch, 100)
    # k steps write positions 4..3+k: ceil((4 + k) / 4) blocks each, 2 * that <= 10 blocks: k <= 16
    assert k == 16
    sched.postprocess(batch, k)
    assert sched.allocator.num_free_blocks == 0
    batch = sched.schedule()  # the next token needs a block each: b, the newest, is preempted
    assert batch.preempted == [b]
    assert (a.num_computed_tokens, a.num_output_tokens) == (20, 17)
    assert (b.num_computed_tokens, b.num_output_tokens, b.status) == (0, 17, WAITING)
    assert [s.seq_id for s in batch.seqs] == [0]


def test_plain_scheduler_never_fuses():
    sched = sched_of()
    sched.add(make_seq(0, 4, 30))
    step(sched)
    batch = sched.schedule()
    assert extend_run(sched, batch, 100) == 1


# ---- random request mixes ----------------------------------------------------------------

@dataclass
class Config:
    allocator: str
    num_blocks: int
    block_size: int
    prefix: bool
    reserve: str
    chunked: bool
    mode: str
    host_blocks: int
    max_num_seqs: int
    budget: int
    max_model_len: int


def build(cfg: Config, cohort: bool) -> Scheduler:
    if cfg.allocator == "paged":
        alloc = BlockManager(cfg.num_blocks, cfg.block_size, enable_prefix_caching=cfg.prefix)
    else:
        alloc = ContiguousAllocator(cfg.num_blocks, cfg.block_size, cfg.max_model_len, cfg.reserve)
    settings = EngineSettings(cfg.block_size, cfg.max_num_seqs, cfg.budget, cfg.max_model_len,
                              enable_chunked_prefill=cfg.chunked, preemption_mode=cfg.mode,
                              num_host_blocks=cfg.host_blocks)
    return Scheduler(alloc, settings, use_cohort=cohort)


@st.composite
def mixes(draw, mode):
    allocator = draw(st.sampled_from(["paged", "paged", "contiguous"]))
    bs = draw(st.sampled_from([4, 4, 16]))
    cfg = Config(allocator=allocator, num_blocks=draw(st.integers(20, 60)), block_size=bs,
                 prefix=allocator == "paged" and draw(st.booleans()),
                 reserve=draw(st.sampled_from(["max_model_len", "known_output"])),
                 chunked=draw(st.booleans()), mode=mode, host_blocks=draw(st.integers(0, 40)),
                 max_num_seqs=draw(st.integers(1, 8)), budget=draw(st.integers(16, 128)),
                 max_model_len=draw(st.sampled_from([bs * 8, 128, 256, 256])))
    # Shared prompt content: group g's tokens are g*1000, g*1000+1, ...; members share a prefix of it.
    groups = [np.arange(g * 1000, g * 1000 + draw(st.integers(1, 64)), dtype=np.int32)
              for g in range(draw(st.integers(0, 3)))]
    requests, t = [], 0
    for rid in range(draw(st.integers(1, 16))):
        t += draw(st.integers(0, 4))
        prompt = draw(st.one_of(st.integers(1, 200), st.integers(1, 48)))
        output = draw(st.integers(1, 50))
        g = draw(st.integers(-1, len(groups) - 1))
        tokens = None if g < 0 else groups[g][:prompt]
        requests.append((t, Request(rid, float(t), prompt, output, tokens)))
    return cfg, requests


def expected_reject(cfg: Config, req: Request) -> bool:
    total = req.prompt_len + req.output_len
    reserve = cfg.max_model_len if (cfg.allocator == "contiguous" and cfg.reserve == "max_model_len") else total
    return total > cfg.max_model_len or -(-reserve // cfg.block_size) > cfg.num_blocks


def check_blocks(sched: Scheduler, cfg: Config, seqs: list, exact: bool) -> None:
    """No block is both free and in a running sequence's table, nor in two slabs; with `exact`
    (no decode cohort, whose members' tables catch up only when they leave) every used block is in
    a table."""
    alloc = sched.allocator
    assert 0 <= alloc.num_free_blocks <= cfg.num_blocks
    assert alloc.num_free_blocks + alloc.num_used_blocks == cfg.num_blocks
    assert all(not s.block_table for s in seqs if s.status is not RUNNING)
    tables = [s.block_table for s in seqs if s.status is RUNNING]
    held = set()
    for t in tables:
        held.update(t)
    assert len(held) <= alloc.num_used_blocks
    if exact:
        assert len(held) == alloc.num_used_blocks
    if cfg.allocator == "paged":
        free = alloc.free_block_ids()
        assert len(free) == len(set(free)) == alloc.num_free_blocks
        assert not held & set(free)
    else:
        assert sum(map(len, tables)) == len(held)  # slabs never overlap
        assert all(t == range(t[0], t[0] + len(t)) for t in tables)
        free = {b for start, n in alloc.extents for b in range(start, start + n)}
        assert len(free) == alloc.num_free_blocks and not held & free


def longest_decode(sched: Scheduler, batch) -> int:
    """The batch's longest decode context, member by member (cohort members at the cohort's clock)."""
    ctx = [s.num_computed_tokens + 1 for s, n in zip(batch.seqs, batch.num_new_tokens)
           if n == 1 and s.num_computed_tokens >= s.request.prompt_len]
    if batch.cohort_size:
        c = sched.cohort
        ctx += [s.num_computed_tokens + c.clock - s.cohort_clock + 1 for *_, s in c._finish]
    return max(ctx, default=0)


def drive(cfg: Config, requests, cohort=False, fuse=None, max_events=20000, stats=None):
    """Run the mix to the end, adding each request at its step; `fuse(step) -> bool` says whether to
    ask for a run of decode steps. Returns per request (status, first-token step, finish step,
    preemptions, cached tokens)."""
    sched = build(cfg, cohort)
    bs = cfg.block_size
    seqs = [Sequence(r) for _, r in requests]
    first_token, finish = {}, {}
    now, i = 0, 0
    for _ in range(max_events):
        while i < len(requests) and requests[i][0] <= now:
            seq = seqs[i]
            accepted = sched.add(seq)
            assert accepted != expected_reject(cfg, seq.request)
            assert accepted or (seq.status is REJECTED and seq.reject_reason)
            i += 1
        if not sched.has_work:
            if i == len(requests):
                break
            now = requests[i][0]
            continue
        batch = sched.schedule()
        assert batch.seqs or batch.cohort_size, "no progress with work queued"
        assert batch.decode_max_context == longest_decode(sched, batch)
        assert batch.num_tokens == sum(batch.num_new_tokens) + batch.cohort_size <= sched.max_num_batched_tokens
        assert len(set(map(id, batch.seqs))) == len(batch.seqs)
        assert sched.num_running <= cfg.max_num_seqs
        assert sched.num_running == len(sched.running) + (sched.cohort.size if sched.cohort else 0)
        assert sched.num_unfinished == sched.num_running + len(sched.waiting) + len(sched.swapped)
        assert all(s.status is RUNNING for s in batch.seqs)
        assert all(s.status in (WAITING, SWAPPED) for s in batch.preempted)
        k = 1
        if fuse is not None and fuse(now) and batch.is_pure_decode and not batch.preempted:
            bound = requests[i][0] - now if i < len(requests) else 1 << 30
            if bound > 1:
                k = extend_run(sched, batch, bound)
                assert 1 <= k <= bound
                assert k == 1 or not batch.seqs
                if stats is not None and k > 1:
                    stats["runs"] = stats.get("runs", 0) + 1
        if cfg.allocator == "paged":
            for s, n in zip(batch.seqs, batch.num_new_tokens):
                assert len(s.block_table) * bs >= s.num_computed_tokens + n
        check_blocks(sched, cfg, seqs, exact=not cohort)
        emitted, finished = sched.postprocess(batch, k)
        now += k
        for s in emitted:
            first_token.setdefault(s.seq_id, now)
        for s in finished:
            finish[s.seq_id] = now
            assert s.status is FINISHED and not s.block_table
            assert s.num_output_tokens == s.request.output_len
        assert sched.allocator.reserved_unused_tokens >= 0
        assert sched.num_running == len(sched.running) + (sched.cohort.size if sched.cohort else 0)
        assert sched.num_unfinished == sched.num_running + len(sched.waiting) + len(sched.swapped)
        if not cohort:
            for s in sched.running:
                assert s.num_output_tokens < s.request.output_len
                assert len(s.block_table) * bs >= s.num_computed_tokens
            assert (sched.allocator.reserved_unused_tokens
                    == sum(len(s.block_table) * bs - s.num_computed_tokens for s in sched.running))
        check_blocks(sched, cfg, seqs, exact=not cohort)
    else:
        raise AssertionError("the mix did not finish")
    assert i == len(requests) and not sched.has_work and sched.num_running == 0
    for s in seqs:
        assert s.status in (FINISHED, REJECTED)
        if s.status is FINISHED:
            assert s.num_output_tokens == s.request.output_len
    alloc = sched.allocator
    assert alloc.num_free_blocks == cfg.num_blocks and alloc.reserved_unused_tokens == 0
    if cfg.allocator == "paged":
        assert sorted(alloc.free_block_ids()) == list(range(cfg.num_blocks))
    else:
        assert alloc.extents == [(0, cfg.num_blocks)]
    assert sched.num_swapped_blocks == 0
    return [(s.status, first_token.get(s.seq_id), finish.get(s.seq_id), s.num_preemptions, s.num_cached_tokens)
            for s in seqs]


def _check_mix(data, mode):
    cfg, requests = data.draw(mixes(mode))
    plain = drive(cfg, requests)
    # The decode cohort, and runs of identical decode steps (tried at random steps, or at every
    # step), change nothing a step-by-step run of the plain scheduler shows.
    assert drive(cfg, requests, cohort=True) == plain
    coin = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    assert drive(cfg, requests, cohort=True, fuse=lambda _: coin.random() < 0.7) == plain
    stats = {}
    assert drive(cfg, requests, cohort=True, fuse=lambda _: True, stats=stats) == plain
    event("decode runs" if stats else "no decode run")
    event("preemption" if any(p for *_, p, _ in plain) else "no preemption")
    event("prefix hit" if any(c for *_, c in plain) else "no prefix hit")
    event("all rejected" if all(o[0] is REJECTED for o in plain) else "some finished")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_mixes_recompute(data):
    _check_mix(data, "recompute")


@settings(max_examples=150, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_mixes_swap(data):
    _check_mix(data, "swap")


# ---- what holds admission back -----------------------------------------------------------

def test_admission_limit_names_max_num_seqs():
    sched = sched_of(max_num_seqs=1)
    sched.add(make_seq(0, 10, 5))
    sched.add(make_seq(1, 10, 5))
    sched.schedule()
    assert sched.admission_limit == "max_num_seqs" and len(sched.waiting) == 1


def test_admission_limit_names_the_kv_cache():
    sched = sched_of(num_blocks=4, block_size=4)  # 16 slots: one 12-token prompt fits, not two
    sched.add(make_seq(0, 12, 2))
    sched.add(make_seq(1, 12, 2))
    sched.schedule()
    assert sched.admission_limit == "kv_cache" and len(sched.waiting) == 1


def test_admission_limit_names_the_token_budget_without_chunking():
    sched = sched_of(budget=20, chunked=False, max_model_len=20)
    sched.add(make_seq(0, 15, 2))
    sched.add(make_seq(1, 15, 2))
    sched.schedule()  # the second whole prompt does not fit what is left of 20 tokens
    assert sched.admission_limit == "token_budget" and len(sched.waiting) == 1


def test_admission_limit_is_empty_when_nothing_waits():
    sched = sched_of()
    sched.add(make_seq(0, 10, 5))
    sched.schedule()
    assert sched.admission_limit == "" and not sched.waiting


def test_sequences_finishing_together_are_freed_in_running_order_with_or_without_the_cohort():
    """a decodes (in the cohort, when there is one) and ends at the step in which b, admitted later
    with one output token, ends with its prefill: vLLM frees in running order, a then b."""
    for cohort in (False, True):
        sched = sched_of(num_blocks=64, block_size=4, budget=64, cohort=cohort, prefix=True)
        a, b = make_seq(0, 4, 3), make_seq(1, 4, 1)
        freed, finished_at = [], {}
        dealloc = sched.allocator.deallocate
        sched.allocator.deallocate = lambda s: (freed.append(s.seq_id), dealloc(s))
        sched.add(a)
        for i in range(3):
            if i == 2:
                sched.add(b)
            _, done = sched.postprocess(sched.schedule())
            finished_at.update((s.seq_id, i) for s in done)
        assert finished_at == {0: 2, 1: 2} and freed == [0, 1], (cohort, freed)


def test_pure_decode_steps_count_the_blocks_their_sequences_share():
    sched = sched_of(budget=64, prefix=True)
    prefix = list(range(100, 112))  # 3 full blocks of 4
    a, b = make_seq(0, 14, 5, prefix), make_seq(1, 14, 5, prefix)
    sched.add(a)
    step(sched)  # a's prompt: its 3 shareable blocks cached
    sched.add(b)
    work, mixed = step(sched)  # a decodes, b's prompt hits a's 3 blocks
    assert work == [(0, 1), (1, 2)] and b.num_cached_tokens == 12
    assert mixed.decode_shared_tokens == 0  # mixed steps price their reads in full
    work, batch = step(sched)
    assert work == [(0, 1), (1, 1)]
    assert batch.decode_shared_tokens == 12 and batch.decode_read_tokens == batch.decode_context_tokens - 12
