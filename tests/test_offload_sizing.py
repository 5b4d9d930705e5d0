"""`kvsim plan --offload-gib` (issue 28): the CPU tier's size searched, priced and judged; bad input."""

import json

import pytest

from kvsim.planning.capacity import PolicyCapacity
from kvsim.planning.offload_sizing import OffloadSize, judge, parse_sizes
from kvsim.scenario.catalog import HOST_DRAM_PRICE

SCENARIO = "scenarios/offload_sizing.toml"


def _size(gib, safe, low, high, usd_per_million):
    cap = PolicyCapacity("p", safe, safe, low, high, [safe], False, 1.0, 0.0, True, None, None, {})
    return OffloadSize(gib, cap, None, 3.0, 0.0, safe, usd_per_million)


def test_the_verdict_by_hand():
    none, small, big = _size(0, 8, 7, 9, 100.0), _size(16, 12, 11, 13, 70.0), _size(64, 12.5, 11.5, 13.5, 72.0)
    best, enough, pays, line = judge([none, small, big])
    assert (best, enough, pays) == (16, 16, True) and line.startswith("offload pays: 16 GiB")
    assert "30% less than without" in line
    # the tier is cheapest but cannot be told from no tier: undecided
    best, _, pays, line = judge([_size(0, 8, 6, 11, 100.0), _size(16, 9, 7, 12, 95.0)])
    assert (best, pays) == (16, None) and line.startswith("undecided")
    # no tier is cheapest: it does not pay; 8 GiB ties the rate of 0 so 0 is already enough
    best, enough, pays, line = judge([_size(0, 8, 7, 9, 90.0), _size(8, 8.2, 7.2, 9.2, 91.0)])
    assert (best, enough, pays) == (0, 0, False) and line.startswith("offload does not pay")
    # nothing priced (no safe load anywhere)
    assert judge([_size(0, 0, 0, 0, None)])[:3] == (None, None, None)


@pytest.mark.parametrize("text,sizes", [("0,8,32", [0, 8, 32]), ("32, 8,8,0", [0, 8, 32]), ("1.5", [1.5])])
def test_sizes_are_parsed_sorted_and_distinct(text, sizes):
    assert parse_sizes(text) == sizes


BAD = {
    "not numbers": (["--offload-gib", "a,b"], ("--offload-gib", "not a list")),
    "negative": (["--offload-gib", "0,-8"], ("--offload-gib", "0 or more")),
    "larger than the host": (["--offload-gib", "0,5000"], ("--offload-gib 5000", "host memory")),
    "with a target rate": (["--offload-gib", "0,8", "--target-rate", "5"], ("--offload-gib", "--target-rate")),
    "a policy without tiers": (["--offload-gib", "0,8", "--policy", "nope"], ("--policy", "nope")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sizing_input_is_one_line_naming_the_flag(tmp_path, capsys, case):
    from test_cli import assert_one_line_error, run_cli

    argv, names = BAD[case]
    code, _, err = run_cli(capsys, "plan", SCENARIO, *argv, "--out", tmp_path / "out", "--quiet", "--workers", "1")
    assert_one_line_error(code, err, *names)
    assert not (tmp_path / "out").exists()


def test_a_scenario_without_tiers_is_refused(tmp_path, capsys):
    from test_cli import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "plan", "scenarios/chat.toml", "--offload-gib", "0,8", "--quiet")
    assert_one_line_error(code, err, "--offload-gib", "[kv_offload]")


def test_plan_sizes_the_tier_and_prices_it(tmp_path, capsys):
    """A short search on the shipped example: a row per size, each priced as GPUs + DRAM over the requests
    served, the tier's tokens as `kvsim memory` counts them, and the verdict the rows imply."""
    from test_cli import run_cli

    code, out, _ = run_cli(capsys, "plan", SCENARIO, "--offload-gib", "32,0", "--seeds", "2", "--requests", "200",
                           "--resolution", "0.25", "--workers", "1", "--out", tmp_path / "plan")
    assert code == 0 and "verdict:" in out
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    rows = {r["offload_gib"]: r for r in doc["sizes"]}
    assert sorted(rows) == [0, 32] and doc["policy"] == "cpu-tier"
    assert rows[0]["tier_tokens"] is None
    assert rows[32]["tier_tokens"] == 32 * 2**30 // (16 * 131072) * 16  # Llama-3.1-8B: 128 KiB a token, 16-token blocks
    gpu = doc["meta"]["gpu_usd_per_hour"]
    assert gpu == pytest.approx(2.99)
    for gib, r in rows.items():
        assert r["dram_usd_per_hour"] == pytest.approx(HOST_DRAM_PRICE.usd_per_hour * gib)
        hourly = gpu + r["dram_usd_per_hour"]
        assert r["usd_per_million_requests"] == pytest.approx(hourly / (r["served_rps"] * 3600) * 1e6)
    best = min(rows.values(), key=lambda r: r["usd_per_million_requests"])
    assert doc["best_gib"] == best["offload_gib"]
    assert doc["meta"]["dram_price_source"].startswith("Google Cloud")
    points = (tmp_path / "plan" / "points.csv").read_text().splitlines()
    assert points[0].split(",")[-1] == "offload_gib" and len(points) > 4
