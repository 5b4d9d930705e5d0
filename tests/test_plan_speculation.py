"""kvsim plan --speculative-k and --rank energy (kvsim.planning.speculation): the variants a plan
searches, where speculation stops paying, the verdict's wording, the energy ranking."""

import pytest
from conftest import make_scenario

from kvsim.errors import KvsimError
from kvsim.planning.capacity import PlanResult, PolicyCapacity
from kvsim.planning.speculation import _crossing, _verdict, energy_ranking, variants, with_energy

SPEC = {"method": "eagle3", "num_speculative_tokens": 3}


def test_variants_are_each_policy_off_and_at_each_k():
    sc = make_scenario(speculative=SPEC, policies=[{"name": "a"}, {"name": "b"}])
    got = variants(sc, ["a"], [1, 4])
    assert [p.name for p in got.policies] == ["a k=off", "a k=1", "a k=4"]
    assert [got.speculates(p) for p in got.policies] == [False, True, True]
    assert [p.num_speculative_tokens for p in got.policies] == [None, 1, 4]


def test_a_policy_and_its_speculation_free_copy_share_their_variants():
    sc = make_scenario(speculative=SPEC, policies=[{"name": "a"}, {"name": "a-off", "speculative": False},
                                                   {"name": "fp8", "kv_cache_dtype": "fp8"}])
    got = variants(sc, ["a", "a-off", "fp8"], [2])
    assert [p.name for p in got.policies] == ["a k=off", "a k=2", "fp8 k=off", "fp8 k=2"]


def test_variants_need_a_speculative_section_and_enough_positions():
    with pytest.raises(KvsimError, match="needs a \\[speculative\\] section"):
        variants(make_scenario(), ["p"], [2])
    sc = make_scenario(speculative={**SPEC, "acceptance": [0.7, 0.5, 0.3]})
    with pytest.raises(KvsimError, match="k = 5 but speculative.acceptance gives 3 positions"):
        variants(sc, [sc.policies[0].name], [2, 5])


def row(rate, off, spec):
    return {"rate": rate, "off_tpot_ms_at_pct": off, "spec_tpot_ms_at_pct": spec}


def test_speculation_stops_paying_where_its_tpot_crosses():
    assert _crossing([row(1, 10, 6), row(2, 12, 9), row(4, 20, 22)]) == pytest.approx(2 + 2 * 3 / 5)
    assert _crossing([row(1, 10, 6), row(2, 12, 9)]) is None  # pays at every load
    assert _crossing([row(1, 10, 11), row(2, 12, 15)]) == 1  # never pays


def test_the_verdict_says_raises_lowers_or_never_pays():
    assert "shortens the time per token at every load" in _verdict("p", 2, 10.0, 12.0, None, "req/s", 1.0)
    assert "raises the safe rate +20%" in _verdict("p", 2, 10.0, 12.0, None, "req/s", 1.0)
    assert "lowers the safe rate -10%" in _verdict("p", 2, 10.0, 9.0, None, "req/s", 1.0)
    assert "stops paying at about 5 req/s" in _verdict("p", 3, 10.0, 9.0, 5.0, "req/s", 1.0)
    assert "does not pay at any load checked" in _verdict("p", 3, 10.0, 7.0, 1.0, "req/s", 1.0)


def answer(name, safe, j):
    return PolicyCapacity(name, safe, safe, safe, safe, [safe], False, 1.0, safe - 1, True, None, None,
                          {"joules_per_output_token": j, "energy_usd_per_million_output_tokens": j / 10,
                           "kwh_per_million_output_tokens": j / 3.6, "gpu_hour_usd_per_million_output_tokens": None})


def test_energy_ranking_orders_by_joules_per_token_and_skips_unsafe():
    result = PlanResult("s", {}, [answer("a", 5.0, 0.4), answer("b", 4.0, 0.2), answer("c", 0.0, 0.1)])
    lines = energy_ranking(result)
    assert lines[0].startswith("ranked by energy")
    assert lines[1] == "  1. b: 0.2 J/token; per million output tokens 0.0556 kWh, energy $0.02 (at 4)"
    assert lines[2].startswith("  2. a: 0.4 J/token") and len(lines) == 3
    plain = energy_ranking(result, ranked=False)  # a scenario with [energy], plan ranked by rate: its order
    assert plain[0].startswith("energy at the safe rate") and plain[1].startswith("  1. a: 0.4 J/token")


def test_no_energy_lines_without_energy_figures():
    bare = PolicyCapacity("a", 5.0, 5.0, 5.0, 5.0, [5.0], False, 1.0, 4.0, True, None, None, {})
    assert energy_ranking(PlanResult("s", {}, [bare]), ranked=False) == []


def test_rank_energy_adds_the_default_energy_section_only_when_absent():
    sc = make_scenario()
    assert sc.energy is None and with_energy(sc).energy is not None
    own = make_scenario(energy={"pue": 1.2})
    assert with_energy(own).energy.pue == 1.2
