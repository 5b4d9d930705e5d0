"""Answers a team can act on (issue 20): the safe rate holds where `kvsim run --check` checks it (every
seed the plan used and a run four times longer), ties are called ties, deployment search keeps each
layout's best policy and never hides a layout cheaper than one it lists, rejections bind where they
cost the SLO, `kvsim memory` gives each policy its own activation reserve, `plan --tune` finds the
engine setting that binds, and a run's table fits a pipe."""

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

import kvsim
from conftest import make_scenario
from kvsim.cli import CHECK_FAILED, PIPE_WIDTH, main
from kvsim.planning.capacity import plan, ties
from kvsim.planning.deploy import deploy
from kvsim.planning.executors import InlineExecutor
from kvsim.results.verdict import FIGURES, judge
from test_plan import FAST, _with_fast_gpus, restore_gpus, serial_scenario  # noqa: F401 (a fixture)

CHAT_LIKE = """name = "s"
[model]
name = "Llama-3.1-8B"
[engine]
max_model_len = 8192
max_num_seqs = 64
[[policies]]
name = "paged"
[workload]
seed = 7
num_requests = 300
arrival = { process = "poisson", rate = 6.0 }
prompt_len = { dist = "lognormal", mean = 900, sigma = 0.9, max = 6144 }
output_len = { dist = "lognormal", mean = 300, sigma = 0.8, max = 2048 }
[slo]
ttft_ms = 2000
tpot_ms = 40
"""


def run_check(path, rate: float, seed: int, requests: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvsim", "run", str(path), "--set", f"workload.arrival.rate={rate!r}",
                           "--set", f"workload.seed={seed}", "--set", f"workload.num_requests={requests}",
                           "--check", "--quiet", "--out", str(path.parent / f"run-{seed}-{requests}")],
                          capture_output=True, text=True)


def test_a_run_at_the_safe_rate_passes_check_for_every_seed_and_four_times_longer(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(CHAT_LIKE)
    result = plan(kvsim.load_scenario(path), seeds=3, resolution=0.05, executor=InlineExecutor())
    (p,) = result.policies
    assert 0 < p.safe_rate <= p.mean_rate and result.meta["long_run_requests"] == 1200
    for seed in result.meta["seeds"]:
        done = run_check(path, p.safe_rate, seed, 300)
        assert done.returncode == 0, done.stderr
    done = run_check(path, p.safe_rate, result.meta["seeds"][0], 1200)
    assert done.returncode == 0, done.stderr
    # well past the knee the same check fails, with one line naming the policy and the figure
    done = run_check(path, 2 * p.ci_high, result.meta["seeds"][0], 300)
    assert done.returncode == CHECK_FAILED == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("kvsim: check failed: paged: ")


def test_run_results_to_frame_is_a_row_per_policy_of_the_verdicts_figures():
    sc = make_scenario(policies=[{"name": "a"}, {"name": "b", "kv_cache_dtype": "fp8"}], slo={"ttft_ms": 500})
    result = kvsim.run(sc)
    frame = result.to_frame()
    assert list(frame.columns) == ["policy", *FIGURES] and list(frame["policy"]) == ["a", "b"]
    for _, row in frame.iterrows():
        v = judge(result.summaries[row["policy"]])
        assert row["sustainable"] == v.sustainable and row["binding"] == v.binding
        assert row["ttft_ms_at_pct"] == result.summaries[row["policy"]]["slo"]["at_percentile"]["ttft_ms"]


def answer(name, safe, low, high, mean=None):
    return SimpleNamespace(policy=name, safe_rate=safe, mean_rate=mean or (low + high) / 2, ci_low=low, ci_high=high)


def test_ties_group_overlapping_intervals_with_the_best():
    a, b, c, d = answer("a", 10, 9, 12), answer("b", 11, 10.5, 13), answer("c", 5, 4, 6), answer("d", 4, 3.5, 5.5)
    groups = ties([a, b, c, d])
    assert [[x.policy for x in g] for g in groups] == [["b", "a"], ["c", "d"]]  # best first, by safe rate
    assert [[x.policy for x in g] for g in ties([c])] == [["c"]]


def test_deploy_keeps_each_layouts_best_policy():
    from test_plan import kv_bound

    sc = kv_bound()
    sc = sc.model_copy(update={"policies": [*sc.policies, sc.policies[0].model_copy(
        update={"name": "fp8", "kv_cache_dtype": "fp8"})]})
    result = deploy(sc, 3.0, gpus=["H100-SXM"], tensor_parallel=(1,), seeds=1, resolution=0.1, top=1,
                    executor=InlineExecutor(), headroom=False)
    scouted = {s["policy"]: s["replica_rate"] for s in result.meta["scout"]}
    assert set(scouted) == {"p", "fp8"} and scouted["fp8"] > scouted["p"]  # the KV cache binds: fp8 holds twice
    (d,) = result.deployments
    assert d.policy == "fp8" and d.meets_target and d.safe_rate is None
    assert d.answer() == f"{d.num_gpus} × H100-SXM as TP 1 × {d.num_replicas} replica{'s' if d.num_replicas > 1 else ''}, " \
                         f"${d.usd_per_hour:,.2f}/h (policy fp8)"


def test_deploy_never_prunes_a_layout_cheaper_than_one_it_lists(tmp_path):
    # every layout serves 10 req/s a replica: 25 req/s needs 3 of any; prices make many layouts tie or lose
    prices = {"H100-SXM": 3.0, "H200": 2.0, "A100-80GB": 1.5}
    sc = serial_scenario(tmp_path, cost={"gpu_hour_usd": prices, "source": "test"})
    sc = sc.model_copy(update={"hardware": sc.hardware.model_copy(update={k: None for k in FAST})})
    sc = _with_fast_gpus(sc, {g: dict(FAST) for g in prices})
    result = deploy(sc, 25.0, gpus=list(prices), tensor_parallel=(1, 2, 4), seeds=1, top=2, executor=InlineExecutor())
    shown = [d.usd_per_hour for d in result.deployments]
    assert shown == sorted(shown) and len(shown) >= 2 and shown[0] == pytest.approx(4.5)  # A100 TP 1 × 3
    for s in result.skipped:
        m = re.search(r"at least \$([\d,.]+)/h", s["reason"]) or re.search(r"at \$([\d,.]+)/h", s["reason"])
        assert m, s
        assert float(m.group(1).replace(",", "")) > max(shown), s  # nothing left out is cheaper than a row shown


def test_rejections_bind_when_they_cost_the_slo():
    sc = make_scenario(engine={"max_model_len": 512}, slo={"ttft_ms": 2000, "tpot_ms": None},
                       workload={"num_requests": 200, "prompt_len": {"dist": "uniform", "min": 100, "max": 600}})
    (summary,) = kvsim.run(sc).summaries.values()
    rejected = summary["requests"]["rejected"]
    assert rejected > 2  # over 1% of 200: the p99 cannot be met
    v = judge(summary)
    assert not v.met and v.binding == "max_model_len"
    assert f"{rejected:,} of 200 requests rejected" in v.binding_detail and "raise engine.max_model_len" in v.binding_detail


def test_memory_gives_each_policy_its_own_activation_reserve():
    from kvsim.perf.memory import activation_estimate
    from kvsim.scenario.catalog import model_spec

    sc = make_scenario(engine={"max_model_len": 8192, "max_num_seqs": 256, "max_num_batched_tokens": 8192},
                       policies=[{"name": "whole", "enable_chunked_prefill": False},
                                 {"name": "same", "enable_chunked_prefill": False},
                                 {"name": "chunked", "max_num_batched_tokens": 1024}])
    caps = kvsim.memory(sc)["capacity"]
    assert [(c["kv_cache_dtype"], c["policies"]) for c in caps] == [("auto", ["whole", "same"]), ("auto", ["chunked"])]
    model = model_spec(sc)
    assert caps[0]["activations"] == activation_estimate(model, 8192, 256)
    assert caps[1]["activations"] == activation_estimate(model, 1024, 256)
    assert caps[1]["kv"] - caps[0]["kv"] == caps[0]["activations"] - caps[1]["activations"] > 0


def test_plan_tune_follows_max_num_seqs_and_names_vllms_flags(tmp_path):
    # one sequence at a time, every step STEP_S: twice the sequences serve twice the rate
    sc = serial_scenario(tmp_path)
    result = plan(sc, seeds=1, resolution=0.05, executor=InlineExecutor(), tune=True)
    (p,) = result.policies
    (t,) = result.tuning
    assert p.binding == "max_num_seqs" and t.baseline_safe_rate == p.safe_rate
    assert t.max_num_seqs >= 4 and t.safe_rate > 3 * p.safe_rate
    assert [x["max_num_seqs"] for x in t.tried][:2] == [2, 4] and all(x["max_num_batched_tokens"] == 1024 for x in t.tried)
    assert t.flags().startswith(f"--max-num-seqs {t.max_num_seqs} --max-num-batched-tokens 1024")
    assert json.loads(json.dumps(result.to_dict()["tuning"]))[0]["vllm_flags"] == t.flags()


def test_piped_tables_are_not_cut(tmp_path, capsys):
    long = "paged-with-a-rather-long-policy-name-for-this-table"
    path = tmp_path / "s.toml"
    path.write_text(CHAT_LIKE.replace('name = "paged"', f'name = "{long}"').replace("num_requests = 300",
                                                                                  "num_requests = 60"))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    assert main(["plan", str(path), "--seeds", "1", "--resolution", "0.3", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and long in out and max(map(len, out.splitlines())) <= PIPE_WIDTH


def test_why_it_missed_splits_each_requests_time_and_counts_time_spent_preempted(tmp_path):
    import csv

    import numpy as np

    from kvsim.results.figures import _read_latencies, why_missed

    sc = make_scenario(engine={"max_model_len": 4096, "max_num_seqs": 256, "max_num_batched_tokens": 4096,
                               "activation_reserve_gib": 54.0},  # ~1,300 KV blocks: long outputs preempt
                       workload={"seed": 2, "num_requests": 120, "arrival": {"process": "poisson", "rate": 8.0},
                                 "prompt_len": {"dist": "fixed", "value": 1000},
                                 "output_len": {"dist": "fixed", "value": 800}},
                       slo={"ttft_ms": 3000, "tpot_ms": 50}, output={"report_html": True})
    kvsim.run(sc, out_dir=tmp_path / "out")
    rows = [r for r in csv.DictReader(open(tmp_path / "out/requests.csv")) if r["status"] == "finished"]
    preempted = [r for r in rows if int(r["preemptions"])]
    assert preempted and len(preempted) < len(rows)
    for r in rows:  # time preempted: from each preemption to the next scheduling, inside the request's life
        assert (float(r["preempted_s"]) > 0) == (int(r["preemptions"]) > 0)
        assert float(r["preempted_s"]) < float(r["e2e_s"])
    lat = _read_latencies(tmp_path / "out/requests.csv", {"ttft_ms": 3000, "tpot_ms": 50})["paged"]
    assert np.allclose(lat["queued_s"] + lat["prefill_s"] + lat["decode_s"], lat["e2e_s"], rtol=1e-9, atol=1e-9)
    missed = np.array([float(r["ttft_s"]) > 3 or (r["mean_itl_s"] and float(r["mean_itl_s"]) > 0.05) for r in rows])
    assert np.array_equal(lat["missed"], missed) and missed.any()
    (got_missed, got_met) = why_missed({"p": lat})
    assert got_missed["group"] == "missed" and got_missed["requests"] == int(missed.sum())
    assert got_missed["decode_s"] == pytest.approx(lat["decode_s"][missed].mean(), rel=1e-12)
    assert got_missed["preempted_s"] == pytest.approx(lat["preempted_s"][missed].mean(), rel=1e-12)
    assert sum(got_missed[f"longest_{c}"] for c in ("queued_s", "prefill_s", "decode_s")) == got_missed["requests"]
    assert got_met["requests"] == len(rows) - int(missed.sum())
    page = (tmp_path / "out/report.html").read_text()
    assert "Why requests missed the SLO" in page and "Where the time went" in page


ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_the_validation_example_is_the_run_the_readme_quotes():
    from kvsim.calibrate.validate import median_abs_error

    records = kvsim.validate(ROOT / "scenarios/validate_h100.toml", ROOT / "benchmarks/results/validate_h100")
    bf16, fp8 = (median_abs_error(records, p) for p in ("paged-bf16", "paged-fp8"))
    readme = (ROOT / "README.md").read_text()
    assert f"{bf16:.1%} / {fp8:.1%} for `validate_h100`" in readme and f"{bf16:.1%} / {fp8:.1%}," in readme


def test_the_mooncake_showcase_meets_its_slo(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvsim", "run", str(ROOT / "scenarios/mooncake.toml"), "--set",
                           "workload.num_requests=3000", "--policy", "paged-fp8-prefix-cache", "--check", "--quiet",
                           "--out", str(tmp_path / "m")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
