"""The prefill:decode search (kvsim.planning.disagg): its staircase walk finds the cheapest passing
counts that brute force over the grid finds, on monotone grids and on real simulations."""

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from conftest import make_scenario
from kvsim.planning.disagg import Staircase, evaluate_pd, pd_deploy, pool_layouts
from kvsim.planning.executors import InlineExecutor
from kvsim.planning.safe import LONG_RUN


def cheapest(passes, cost_p, cost_d, n):
    """Brute force: the cheapest passing (P, D) of the n x n grid (fewest GPUs, then fewest P on ties;
    costs equal to 1e-9 $ are ties, whatever order the float sums round in)."""
    ok = [(p, d) for p, d in itertools.product(range(1, n + 1), repeat=2) if passes(p, d)]
    return min(ok, key=lambda pt: (round(pt[0] * cost_p + pt[1] * cost_d, 9), pt[0] + pt[1], pt)) if ok else None


def walk(passes, cost_p, cost_d, n):
    stair, asked = Staircase(cost_p, cost_d, n), []
    while (pt := stair.next()) is not None:
        asked.append(pt)
        stair.record(pt, passes(*pt))
    return stair.best, asked


@settings(max_examples=300, deadline=None)
@given(need_p=st.integers(1, 9), need_d=st.integers(1, 9), extra=st.integers(0, 30),
       cost_p=st.sampled_from([1.0, 2.99, 3.79, 5.98]), cost_d=st.sampled_from([1.0, 2.99, 3.79, 7.58]),
       n=st.sampled_from([4, 8, 16]))
def test_the_staircase_finds_the_brute_force_optimum(need_p, need_d, extra, cost_p, cost_d, n):
    """Any monotone pass region (P, D) -> P >= need_p and D >= need_d and P + D >= need_p + need_d + extra
    (instances of one pool can stand in for the other's slack): the walk's answer is brute force's,
    and it asks at most 2 x its bound points plus the doublings."""
    def passes(p, d):
        return p >= need_p and d >= need_d and p + d >= need_p + need_d + extra

    best, asked = walk(passes, cost_p, cost_d, n)
    assert best == cheapest(passes, cost_p, cost_d, n)
    assert len(asked) == len(set(asked)) <= 2 * n + n.bit_length()


def test_the_staircase_gives_up_at_the_cap():
    best, asked = walk(lambda p, d: False, 1.0, 1.0, 8)
    assert best is None and asked == [(1, 1), (2, 2), (4, 4), (8, 8)]


_TINY = dict(
    engine={"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
    disaggregation={"link": {"preset": "infiniband-ndr"}},
    workload={"seed": 3, "num_requests": 150, "arrival": {"process": "poisson", "rate": 22.0},
              "prompt_len": {"dist": "uniform", "min": 1500, "max": 3000},
              "output_len": {"dist": "uniform", "min": 100, "max": 300}},
    slo={"ttft_ms": 1500, "tpot_ms": 30})


def _tiny(**more):
    return make_scenario(**_TINY, **more)


def test_a_pd_search_finds_what_brute_force_over_the_grid_finds():
    """Real simulations on a 3 x 3 grid of prefill and decode instances (H100 TP 1 both): every point
    decided as the search decides it (one seed and a long run sustainable) gives the same cheapest
    counts as the search."""
    sc = _tiny()
    (lay,), _ = pool_layouts(sc, "paged", ["H100-SXM"], [1])
    result = pd_deploy(sc, 22.0, seeds=1, max_replicas=3, workers=1)
    (found,) = result.deployments
    from kvsim.planning.disagg import _PDSearch  # the search's own point tasks, for brute force

    search = _PDSearch(InlineExecutor(), sc, 22.0, [sc.workload.seed], 150, None, 3, lambda *a: None)
    lay = (*lay, "paged")  # a layout names its policy too

    def passes(p, d):
        short = evaluate_pd(*search.task(lay, p, d, sc.workload.seed, False))
        return short["sustainable"] and evaluate_pd(*search.task(lay, p, d, sc.workload.seed, True))["sustainable"]

    assert (found.num_prefill, found.num_decode) == cheapest(passes, 2.99, 2.99, 3)
    assert found.usd_per_hour == pytest.approx(2.99 * (found.num_prefill + found.num_decode))
    assert LONG_RUN == 4


def test_a_closed_loop_is_planned_as_its_open_loop_and_sessions_are_refused():
    """deploy's rule for --target-rate: clients (immediate arrivals, max_concurrency) are planned as
    Poisson arrivals of the same requests at the rate; multi-turn sessions are refused in one line."""
    from kvsim.errors import KvsimError

    clients = {"arrival": {"process": "immediate", "rate": None}, "max_concurrency": 16}
    open_loop = pd_deploy(_tiny(), 22.0, seeds=1, max_replicas=2, workers=1)
    closed = pd_deploy(make_scenario(**{**_TINY, "workload": {**_TINY["workload"], **clients}}), 22.0, seeds=1,
                       max_replicas=2, workers=1)
    assert [(d.label, d.usd_per_hour) for d in closed.deployments] == [(d.label, d.usd_per_hour) for d in open_loop.deployments]
    assert closed.deployments and closed.meta["from_closed_loop"] and not open_loop.meta["from_closed_loop"]
    sessions = {**_TINY["workload"], **clients, "sessions": {"turns": {"dist": "fixed", "value": 2}}}
    with pytest.raises(KvsimError, match="sessions is planned by its concurrency") as err:
        pd_deploy(make_scenario(**{**_TINY, "workload": sessions}), 22.0, seeds=1, max_replicas=2, workers=1)
    assert "\n" not in str(err.value)


def test_a_layout_with_an_estimated_pool_is_labelled_estimated():
    """H100 prefill (measured kernels) with an L40S decode pool (no kernel tables: its datasheet): the
    layout is estimated, naming the decode pool; H100 on both sides is measured."""
    from kvsim.planning.disagg import PDDeployment, _pools_basis

    def label(decode_gpu):
        d = PDDeployment("H100-SXM", 1, 1, decode_gpu, 1, 1, "paged", 2, 0.0, 0.0, 0.0, "", None, None, False, False, None)
        return _pools_basis(_tiny(), d)

    assert label("H100-SXM")[0] == "measured"
    pricing, why = label("L40S")
    assert pricing == "estimated" and why.startswith("decode pool: ") and "L40S" in why
