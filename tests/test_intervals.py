"""Error bars: the residual table looked up by basis, load band, metric and stat; a run's summary, its
terminal lines and a plan's safe rate carry them (hand-computed cases against a hand-made table)."""

import json
import sys
import math
from pathlib import Path

import pytest

from kvsim.results import intervals

TABLE = {"provenance": "hand-made",
         "intervals": {"measured": {
             "light": {"ttft": {"central": {"low": -0.04, "high": 0.03, "figures": 24, "runs": 12},
                                "tail": {"low": -0.05, "high": 0.3, "figures": 24, "runs": 12}}},
             "busy": {"tpot": {"central": {"low": -0.07, "high": 0.02, "figures": 6, "runs": 3}}},
             "any": {"ttft": {"any": {"low": -0.1, "high": 0.4, "figures": 60, "runs": 15}},
                     "tpot": {"any": {"low": -0.08, "high": 0.03, "figures": 60, "runs": 15}},
                     "e2e": {"any": {"low": -0.07, "high": 0.03, "figures": 60, "runs": 15}}}}}}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(intervals, "table", lambda: TABLE)
    return TABLE


def test_a_cell_is_where_real_runs_fell_around_the_prediction():
    # predicted / real - 1 errors of 4 runs: real / predicted - 1 = 1 / (1 + e) - 1; fewer than 10: their range
    cell = intervals.residual_interval([0.25, -0.2, 0.0, 0.1], 4)
    assert cell == {"low": pytest.approx(1 / 1.25 - 1, abs=1e-4), "high": pytest.approx(1 / 0.8 - 1, abs=1e-4),
                    "figures": 4, "runs": 4}
    many = intervals.residual_interval([0.01 * i for i in range(-10, 11)], 21)  # 10th to 90th percentile
    real = sorted(1 / (1 + 0.01 * i) - 1 for i in range(-10, 11))
    assert many["low"] == pytest.approx(real[2], abs=1e-4) and many["high"] == pytest.approx(real[18], abs=1e-4)


def test_lookup_by_basis_band_metric_and_stat(table):
    iv = intervals.interval("ttft", "p99", "measured", "light")
    assert (iv.low, iv.high, iv.n, iv.pooled) == (-0.05, 0.3, 12, False)
    assert iv.bounds(100.0) == pytest.approx((95.0, 130.0))
    assert iv.text() == "-5 to +30% on 12 held-out runs like this"
    assert intervals.interval("ttft", "p50", "measured", "light").high == 0.03  # the median is a central figure
    pooled = intervals.interval("ttft", "mean", "measured", "busy")  # no busy TTFT row: the metric's pooled one
    assert pooled.pooled and pooled.n == 15 and "any load" in pooled.text()
    assert intervals.interval("itl", "p99", "measured", "light") is None
    assert intervals.interval("ttft", "p99", "estimated", "light") is None


def test_load_bands():
    assert intervals.load_band(0.3, 0.2) == "light" and intervals.load_band(0.3, 0.6) == "busy"
    summary = {"throughput": {"requests_per_s": 20.0}, "e2e_s": {"mean": 4.0}, "kv": {"mean_used_fraction": 0.1},
               "verdict": {"stable": True}}
    assert intervals.summary_band(summary, 128) == "busy"  # 80 running of 128 (Little's law)
    assert intervals.summary_band(summary, 256) == "light" and intervals.summary_band(summary, 128, 2) == "light"
    assert intervals.summary_band({**summary, "verdict": {"stable": False}}, 1024) == "busy"


def test_basis_keys():
    assert intervals.basis_key({"pricing": "measured", "label": "measured"}) == "measured"
    assert intervals.basis_key({"pricing": "measured", "label": "estimated"}) == "estimated"
    assert intervals.basis_key({"pricing": "roofline", "label": "measured"}) == "estimated"  # not what was held out
    assert intervals.basis_key({"pricing": "triton", "label": "measured"}) is None  # timed on the device


def test_a_safe_rate_carries_where_real_runs_like_it_would_put_it(table):
    """The knee moved from 12 to 11.4 req/s with steps 5% dearer, to 12.6 with them 5% cheaper; real steps
    near the knee were -7 to +2% of kvsim's: the real safe rate is 10 x 1.02^e_slow … 10 x 0.93^e_fast."""
    iv = intervals.rate_interval(10.0, 12.0, 12.6, 11.4, {"pricing": "measured", "label": "measured"}, 0.05)
    e_slow, e_fast = math.log(11.4 / 12) / math.log(1.05), math.log(12.6 / 12) / math.log(0.95)
    assert iv["low"] == pytest.approx(10 * 1.02 ** e_slow) and iv["high"] == pytest.approx(10 * 0.93 ** e_fast)
    assert iv["low"] < 10 < iv["high"] and "3 held-out runs like this" in iv["text"]
    assert intervals.rate_interval(10.0, 12.0, 12.6, 11.4, {"pricing": "triton"}, 0.05) is None


def test_a_run_states_its_error_bars(tmp_path, table):
    from kvsim.cli import main

    sc = tmp_path / "s.toml"
    sc.write_text('name = "s"\n[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "paged"\n[workload]\n'
                  'num_requests = 200\narrival = { process = "poisson", rate = 2.0 }\n'
                  'prompt_len = { dist = "fixed", value = 300 }\noutput_len = { dist = "fixed", value = 20 }\n')
    assert main(["run", str(sc), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["policies"]["paged"]
    bars = summary["prediction_intervals"]
    assert (bars["basis"], bars["band"]) == ("measured", "light")
    assert bars["figures"]["ttft_s"]["p99"] == {"low": -0.05, "high": 0.3, "n": 12, "pooled": False}
    assert bars["figures"]["tpot_s"]["p99"]["pooled"]  # no light TPOT row in this table: the pooled one
    from kvsim.results.report import error_bar_lines

    line = error_bar_lines({"paged": summary})[0]
    assert line.startswith("  paged, held-out error bars (measured pricing, light load): TTFT p99 ")
    assert "-5 to +30% on 12 held-out runs like this" in line


def test_the_shipped_table_names_its_source():
    doc = json.loads(Path(intervals.DATA).read_text())
    assert "held out" in doc["provenance"] and doc["intervals"]["measured"]
    for band in doc["intervals"]["measured"].values():
        for cells in band.values():
            for cell in cells.values():
                assert cell["low"] <= cell["high"] and cell["runs"] >= 1 and cell["figures"] >= cell["runs"]


def test_a_plan_answer_row_and_lines_carry_the_safe_rates_range(table):
    from kvsim.planning.capacity import PlanResult, PolicyCapacity
    from kvsim.planning.output import plan_lines

    iv = intervals.rate_interval(10.0, 12.0, 12.6, 11.4, {"pricing": "measured", "label": "measured"}, 0.05)
    p = PolicyCapacity("paged", 10.0, 12.0, 11.0, 13.0, [12.0], False, 5.0, 1.0, True, "step_time", "…", {},
                       safe_rate_interval=iv)
    row = p.row()
    assert row["safe_rate_real_low"] == iv["low"] and row["safe_rate_interval"] == iv["text"]
    meta = {"model": "m", "gpu": "g", "tensor_parallel_size": 1, "num_replicas": 1, "scenario_rate": 5.0,
            "slo": {"percentile": 99.0}, "seeds": [0], "num_requests": 100, "resolution": 0.02,
            "stability_tolerance": 0.05}
    lines = plan_lines(PlanResult("s", meta, [p], [], []))
    assert any(line.startswith(f"paged: safe rate 10 req/s; on real runs like this {iv['low']:.3g}–") for line in lines)


DOMAIN = {"runs": "dense 16-bit Llama-2 on H100-SXM, TP 1-4, one engine", "gpus": ["H100-SXM"],
          "weights": ["float16", "bfloat16"], "tensor_parallel": [1, 4]}


@pytest.fixture
def domain_table(monkeypatch):
    doc = {**TABLE, "domain": DOMAIN}
    monkeypatch.setattr(intervals, "table", lambda: doc)
    return doc


def test_how_a_run_differs_from_the_held_out_runs(domain_table, monkeypatch):
    from kvsim.scenario.catalog import MODELS

    assert intervals.unlike(MODELS["Llama-3.1-8B"], "H100-SXM", 1) == ()  # dense, 16-bit, their GPU and TP range
    assert intervals.unlike(MODELS["Llama-3.1-70B"], "H100-SXM", 4) == ()
    assert intervals.unlike(MODELS["Llama-3.1-8B"], "H200", 8) == ("H200", "TP 8")
    assert intervals.unlike(MODELS["Qwen3-30B-A3B"], "H100-SXM", 1) == ("MoE",)
    assert intervals.unlike(MODELS["DeepSeek-V3"], "H100-SXM", 2)[:2] == ("MoE", "MLA")
    assert intervals.unlike(MODELS["gpt-oss-120b"], "H100-SXM", 1) == ("MoE", "windowed attention", "mxfp4 weights")
    assert intervals.unlike(MODELS["Llama-3.1-8B"], "H100-SXM", 1, disaggregated=True) == (
        "disaggregated prefill and decode",)
    monkeypatch.setattr(intervals, "table", lambda: TABLE)  # a table naming no domain claims nothing either way
    assert intervals.unlike(MODELS["Qwen3-30B-A3B"], "B200", 16) == ()


def test_a_range_for_a_run_unlike_the_held_out_ones_says_so(domain_table):
    iv = intervals.Interval(-0.05, 0.3, 12, "ttft", "p99", "measured", "light", unlike=("MoE", "H200"))
    assert iv.text() == ("-5 to +30% on 12 held-out runs (dense 16-bit Llama-2 on H100-SXM, TP 1-4, one engine); "
                         "this run differs (MoE, H200): its error may be larger")
    assert iv.text(brief=True) == "-5 to +30% on 12 held-out runs"
    summary = {"throughput": {"requests_per_s": 1.0}, "e2e_s": {"mean": 2.0}, "ttft_s": {"p99": 0.18},
               "tpot_s": {"p99": 0.02}, "e2e_s_p99": None}
    bars = intervals.summary_intervals(summary, {"pricing": "measured", "label": "measured"}, 128, 1, ("MoE",))
    assert bars["unlike"] == ["MoE"] and bars["heldout_runs"] == DOMAIN["runs"]
    assert "unlike" not in intervals.summary_intervals(summary, {"pricing": "measured", "label": "measured"}, 128)
    from kvsim.results.report import error_bar_lines

    like = {**summary, "prediction_intervals": intervals.summary_intervals(
        summary, {"pricing": "measured", "label": "measured"}, 128)}
    lines = error_bar_lines({"moe": {**summary, "prediction_intervals": bars}, "dense": like})
    # the caveat once, naming the policy it is about; each policy's figures after it
    assert lines[0] == ("  error bars of moe from held-out real runs (dense 16-bit Llama-2 on H100-SXM, TP 1-4, one "
                        "engine); this run differs (MoE): its error may be larger")
    assert lines[1] == ("  moe, held-out error bars (measured pricing, light load): TTFT p99 180 ms, -5 to +30% on 12 "
                        "held-out runs; TPOT p99 20 ms, -8 to +3% on 15 held-out runs (measured, any load)")
    assert lines[2].startswith("  dense, held-out error bars")
    assert "-5 to +30% on 12 held-out runs like this" in lines[2]


def test_a_safe_rate_for_a_run_unlike_the_held_out_ones_says_so(domain_table):
    from kvsim.planning.capacity import PlanResult, PolicyCapacity
    from kvsim.planning.output import plan_lines

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))
    from kvdash.answers import real_range

    iv = intervals.rate_interval(10.0, 12.0, 12.6, 11.4, {"pricing": "measured", "label": "measured"}, 0.05, ("MoE",))
    assert not iv["like"] and iv["text"].endswith("(measured pricing, busy load); this run differs (MoE): its error "
                                                  "may be larger")
    assert "held-out runs (dense 16-bit Llama-2" in iv["text"]
    p = PolicyCapacity("moe", 10.0, 12.0, 11.0, 13.0, [12.0], False, 5.0, 1.0, True, "step_time", "…", {},
                       safe_rate_interval=iv)
    meta = {"model": "m", "gpu": "g", "tensor_parallel_size": 1, "num_replicas": 1, "scenario_rate": 5.0,
            "slo": {"percentile": 99.0}, "seeds": [0], "num_requests": 100, "resolution": 0.02,
            "stability_tolerance": 0.05}
    lines = plan_lines(PlanResult("s", meta, [p], [], []))
    assert any(line.startswith(f"moe: safe rate 10 req/s; by the held-out real runs {iv['low']:.3g}–")
               for line in lines)
    shown = real_range(p, "req/s")
    assert shown == f"by the held-out real runs {iv['low']:.3g}–{iv['high']:.3g} req/s ({iv['text']})"
    like = intervals.rate_interval(10.0, 12.0, 12.6, 11.4, {"pricing": "measured", "label": "measured"}, 0.05)
    p.safe_rate_interval = like
    assert real_range(p, "req/s").startswith("on real runs like this ")


def test_a_moe_run_states_how_it_differs_in_summary_json_the_terminal_and_the_report(tmp_path, domain_table):
    from kvsim.cli import main

    sc = tmp_path / "s.toml"
    sc.write_text('name = "s"\n[model]\nname = "Qwen3-30B-A3B"\n[[policies]]\nname = "paged"\n[workload]\n'
                  'num_requests = 60\narrival = { process = "poisson", rate = 2.0 }\n'
                  'prompt_len = { dist = "fixed", value = 300 }\noutput_len = { dist = "fixed", value = 10 }\n')
    assert main(["run", str(sc), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    bars = json.loads((tmp_path / "r" / "summary.json").read_text())["policies"]["paged"]["prediction_intervals"]
    assert bars["unlike"] == ["MoE"] and bars["basis"] == "measured"
    html = (tmp_path / "r" / "report.html").read_text()
    assert "this run differs (MoE): its error may be larger" in html and "held-out error bars" in html
