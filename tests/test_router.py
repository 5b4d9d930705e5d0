"""Routers (kvsim.engine.router): the prefix-affinity router's own view of where prefixes live
against a plain model of it, its choices, and the load rule it shares with SGLang's router."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.engine.router import (AFFINITY_LOAD_FACTOR, AFFINITY_LOAD_SLACK, ROUTER_BLOCK_TOKENS, LeastLoaded,
                                 PrefixAffinity, PrefixView, RoundRobin, make_router)
from kvsim.engine.settings import EngineSettings
from kvsim.sequence import Request, Sequence


def replica(index: int, load: int = 0):
    return SimpleNamespace(index=index, scheduler=SimpleNamespace(num_unfinished=load))


def prompt(group: int, blocks: int, rid: int = 0) -> Sequence:
    """A request whose shareable prompt is `blocks` router blocks of group `group`'s content (the
    groups share their first block)."""
    tokens = np.concatenate([np.zeros(ROUTER_BLOCK_TOKENS, np.int32),
                             np.full((blocks - 1) * ROUTER_BLOCK_TOKENS, group + 1, np.int32)])
    return Sequence(Request(rid, 0.0, len(tokens) + 10, 5, tokens))


@settings(max_examples=150, deadline=None)
@given(routes=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 6)), max_size=40),
       capacity=st.integers(1, 12))
def test_the_view_is_an_lru_of_routed_prompts_closed_under_prefixes(routes, capacity):
    """Against a plain model: per replica, the routed chains newest first; a block is seen while a
    chain holding it is among the newest that fit the capacity (whole chains dropped, oldest first,
    never the newest). The binary search then equals a scan, and the view is closed under prefixes."""
    view = PrefixView(3, capacity)
    history = {r: [] for r in range(3)}
    chains = {}
    for rep, group, blocks in routes:
        chain = view.chain(prompt(group, blocks))
        chains[(group, blocks)] = chain
        assert len(chain) == blocks and chain[0] == view.chain(prompt(3 - group, 1))[0]
        view.add(rep, chain)
        history[rep].append(chain)
        kept, seen = [], set()
        for old in reversed(history[rep]):  # the newest chains while the blocks they add fit
            if kept and len(seen | set(old)) > capacity:
                break
            kept.append(old)
            seen |= set(old)
        assert set(view.seen[rep]) == seen
    for chain in chains.values():
        matched = view.match(chain)
        for rep in range(3):
            scan = next((m for m in range(len(chain)) if chain[m] not in view.seen[rep]), len(chain))
            assert matched[rep] == scan
            assert all(c in view.seen[rep] for c in chain[:scan])


def test_prefix_affinity_follows_the_prompts_it_routed_unless_the_replica_is_much_busier():
    reps = [replica(0), replica(1), replica(2)]
    router = PrefixAffinity(reps, capacity_blocks=100, enable_prefix_caching=True)
    reps[0].scheduler.num_unfinished = 1  # least loaded: replica 1 (the first of the idle ones)
    assert router.route(prompt(0, 4)) == 1  # nothing seen yet: the least loaded
    reps[1].scheduler.num_unfinished = 3
    assert router.route(prompt(0, 4, 1)) == 1  # the same prompt: where it went
    assert router.route(prompt(0, 2, 2)) == 1  # its first two blocks: the same replica
    assert router.route(prompt(1, 4, 3)) == 1  # another group: only the shared first block matches there
    assert router.route(Sequence(Request(4, 0.0, 100, 5, None))) == 2  # nothing shareable: least loaded
    reps[1].scheduler.num_unfinished = AFFINITY_LOAD_FACTOR * 0 + AFFINITY_LOAD_SLACK + 1
    assert router.route(prompt(0, 4, 5)) == 2  # much busier than idle replica 2: least loaded instead
    assert router.route(prompt(0, 4, 6)) == 2  # ... which now caches it too (and is idle)


def test_without_prefix_caching_prefix_affinity_is_least_loaded():
    reps = [replica(0, 2), replica(1, 1)]
    router = PrefixAffinity(reps, capacity_blocks=100, enable_prefix_caching=False)
    for rid in range(3):
        assert router.route(prompt(0, 3, rid)) == 1 and router.view is None


def test_least_loaded_round_robin_and_one_replica():
    reps = [replica(0, 3), replica(1, 1), replica(2, 1)]
    assert LeastLoaded(reps).route(None) == 1  # the first of the least loaded
    rr = RoundRobin(reps)
    assert [rr.route(None) for _ in range(4)] == [1, 2, 0, 1]
    settings = EngineSettings(16, 8, 64, 1024, router="prefix_affinity")
    assert make_router(settings, reps[:1], 100).route(None) == 0
    capacity = make_router(settings, reps, 1000).view.capacity
    assert capacity == 1000 * 16 // ROUTER_BLOCK_TOKENS  # the replica's KV cache, in router blocks


def test_tier_aware_affinity_scores_cpu_hits_as_llm_ds_precise_scorer():
    """Replica 0 sent group 0's 6-block prompt long ago (its GPU view dropped it, its CPU view keeps it);
    replica 1 holds 4 of those blocks in its GPU view: 6 x 0.8 = 4.8 beats 4 x 1.0, and 3 blocks in a CPU
    (2.4) lose to 4 in a GPU."""
    from kvsim.engine.router import CPU_WEIGHT, GPU_WEIGHT

    reps = [replica(0), replica(1)]
    router = PrefixAffinity(reps, capacity_blocks=6, enable_prefix_caching=True, cpu_capacity_blocks=100)
    router.view.add(0, router.view.chain(prompt(0, 6)))
    router.cpu_view.add(0, router.view.chain(prompt(0, 6)))
    router.view.add(0, router.view.chain(prompt(2, 6)))  # pushes group 0 out of replica 0's GPU view
    router.view.add(1, router.view.chain(prompt(0, 4)))
    chain = router.view.chain(prompt(0, 6))
    assert router.view.match(chain)[:2] == [1, 4] and router.cpu_view.match(chain)[:2] == [6, 0]
    assert 1 * GPU_WEIGHT + 5 * CPU_WEIGHT > 4 * GPU_WEIGHT
    assert router.route(prompt(0, 6, 7)) == 0
    assert router.route(prompt(1, 3, 8)) in (0, 1)  # only the shared first block anywhere
    cpu_only = PrefixAffinity(reps, capacity_blocks=100, enable_prefix_caching=True, cpu_capacity_blocks=100)
    cpu_only.cpu_view.add(0, cpu_only.view.chain(prompt(0, 3)))
    cpu_only.view.add(1, cpu_only.view.chain(prompt(0, 4)))
    assert cpu_only.route(prompt(0, 3, 9)) == 1  # 3 blocks (all in the GPU view) beat 3 x 0.8
