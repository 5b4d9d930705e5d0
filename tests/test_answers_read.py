"""Answers that read right (issue 25, item 3): a replayed trace's seeds are its windows (or the plan
says why there is no interval), the P:D comparison checks both sides by one rule and shows what
separates them, layouts name DP, EP and their GPUs everywhere and are priced for every GPU,
impossible requests are bad input, the deployment search recommends what `vllm serve` runs, ties rank
by what the user gets, and `kvsim memory` explains its rows."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import make_scenario
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.planning.executors import InlineExecutor
from test_plan import FAST, _with_fast_gpus, restore_gpus, serial_scenario  # noqa: F401 (a fixture)

SCENARIOS = __import__("pathlib").Path(__file__).resolve().parents[1] / "scenarios"


# ---- a replayed trace: its seeds are its windows

def bursty_trace(path, rows: int = 400, seed: int = 11):
    """A CSV trace whose windows differ: gaps and lengths drawn once, the second third twice as dense."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(0.2, rows)
    gaps[rows // 3: 2 * rows // 3] /= 2
    times = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    prompt, output = rng.integers(200, 2500, rows), rng.integers(20, 400, rows)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{t:.6f},{p},{o}\n" for t, p, o in zip(times, prompt, output)))
    return path


def trace_scenario(tmp_path, rows: int = 400):
    bursty_trace(tmp_path / "t.csv", rows)
    return make_scenario(
        engine={"max_model_len": 4096, "max_num_seqs": 32, "max_num_batched_tokens": 2048},
        workload={"arrival": {"process": "trace"}, "prompt_len": {"dist": "trace"}, "output_len": {"dist": "trace"},
                  "trace": {"format": "csv", "path": str(tmp_path / "t.csv")}, "num_requests": None},
        slo={"ttft_ms": 1500, "tpot_ms": 40})


def test_a_trace_seed_replays_its_own_window_at_the_rate_asked(tmp_path):
    from kvsim.planning.points import at_load, base_rate, replications
    from kvsim.scenario.workload import generate_requests

    sc = trace_scenario(tmp_path)
    own = base_rate(sc, 150)  # the first window's mean rate, as a plan passes it
    first = list(generate_requests(at_load(sc, 8.0, sc.workload.seed, 150, trace_rate=own)))
    second = list(generate_requests(at_load(sc, 8.0, sc.workload.seed + 1, 150, trace_rate=own)))
    rows = np.loadtxt(tmp_path / "t.csv", delimiter=",", skiprows=1)
    assert [r.prompt_len for r in first] == rows[:150, 1].astype(int).tolist()
    assert [r.prompt_len for r in second] == rows[150:300, 1].astype(int).tolist()  # the next 150 rows
    for reqs in (first, second):  # each window at its own mean rate: 8 req/s from its first to last arrival
        assert reqs[0].arrival_time == 0.0
        assert (len(reqs) - 1) / reqs[-1].arrival_time == pytest.approx(8.0, rel=1e-9)
    assert replications(sc, 100, 3) == (3, "") and replications(sc, 150, 3)[0] == 2
    one, why = replications(sc, 400, 3)
    assert one == 1 and "400 rows" in why and "hold 1" in why


def test_plan_on_a_trace_varies_its_seeds_or_says_it_cannot(tmp_path, capsys):
    from kvsim.planning.capacity import plan
    from kvsim.planning.output import plan_lines, plan_table

    sc = trace_scenario(tmp_path)
    result = plan(sc, seeds=3, resolution=0.1, num_requests=100, executor=InlineExecutor())
    (p,) = result.policies
    assert len(set(p.seed_max_rates)) > 1, p.seed_max_rates  # three windows, three knees: a real interval
    assert p.replications == 3 and result.meta["long_run_requests"] == 400  # 4 x 100 rows: the whole trace
    text = "\n".join(plan_lines(result))
    assert "3 seeds (3 disjoint windows of the trace)" in text and "a 400-request run" in text
    # 150 rows a point: three windows do not fit, two do; the long run is the whole trace, not 600 requests
    short = plan(sc, seeds=3, resolution=0.2, num_requests=150, executor=InlineExecutor())
    assert short.meta["seeds"] == [sc.workload.seed, sc.workload.seed + 1]
    text = "\n".join(plan_lines(short))
    assert "only 2 of the 3 seeds asked can differ" in text and "the whole trace (400 requests, not 600)" in text
    # every row a point: one window, no interval printed as if it were one
    whole = plan(sc, seeds=3, resolution=0.2, num_requests=400, executor=InlineExecutor())
    (w,) = whole.policies
    assert w.replications == 1 and len(w.seed_max_rates) == 1
    text = "\n".join(plan_lines(whole))
    assert "no 95% CI from one replication" in text and "no longer run" in text and "95% CI 0" not in text
    from rich.console import Console

    Console(width=300).print(plan_table(whole))
    assert "no CI: one replication" in capsys.readouterr().out


# ---- the P:D answer

def pd_scenario(**more):
    sections = dict(
        engine={"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        disaggregation={"link": {"preset": "infiniband-ndr"}},
        policies=[{"name": "agg", "disaggregated": False}, {"name": "pd"}, {"name": "pd-fp8", "kv_cache_dtype": "fp8"}],
        workload={"seed": 3, "num_requests": 60, "arrival": {"process": "poisson", "rate": 10.0},
                  "prompt_len": {"dist": "uniform", "min": 1500, "max": 3000},
                  "output_len": {"dist": "uniform", "min": 50, "max": 150}},
        slo={"ttft_ms": 1500, "tpot_ms": 30, "itl_ms": 60})
    return make_scenario(**{**sections, **more})


def test_pd_and_aggregated_checks_share_one_rule():
    """Both searches check a layout at the target with every step 5% dearer, and every layout's runs are
    as long as the largest's (one replica is not let off with half the requests)."""
    from kvsim.planning.deploy import _Search
    from kvsim.planning.disagg import _PDSearch
    from kvsim.planning.sensitivity import STEP_COST_MARGIN

    sc = pd_scenario()
    pd = _PDSearch(InlineExecutor(), sc, 10.0, [3], 100, None, 4, lambda *a: None)
    lay = ("H100-SXM", 1, "H100-SXM", 1, "pd")
    small, large = pd.task(lay, 1, 1, 3, False), pd.task(lay, 2, 3, 3, False)
    assert small[4] == large[4] == 200 and pd.task(lay, 1, 1, 3, True)[4] == 800
    assert small[6]["backend"]["step_time_scale"] == pytest.approx(1 + STEP_COST_MARGIN)
    agg = _Search(InlineExecutor(), sc, 10.0, [3], 0.02, 100, None, 1, 4, lambda *a: None)
    assert agg.requests(1) == agg.requests(2) == agg.requests(5) == small[4]


def test_the_pd_table_shows_itl_names_each_rows_policy_and_searches_every_pd_policy():
    from kvsim.planning.disagg import pd_deploy
    from kvsim.planning.output import pd_lines, pd_table

    sc = pd_scenario()
    result = pd_deploy(sc, 10.0, seeds=1, num_requests=60, max_replicas=2, executor=InlineExecutor())
    # like for like: every policy is a candidate served aggregated too (fp8 KV on one side only would decide)
    assert result.meta["policies"] == ["pd", "pd-fp8"] and result.meta["aggregated_policies"] == ["agg", "pd", "pd-fp8"]
    assert {d.policy for d in result.deployments} == {"pd", "pd-fp8"}  # both searched, not the first alone
    rows = result.table()
    assert list(rows[0])[:4] == ["serving", "policy", "prefill", "decode"]
    assert {"TTFT p99 ms", "TPOT p99 ms", "ITL p99 ms"} <= set(rows[0])
    assert all(r["ITL p99 ms"] is not None for r in rows)
    agg = [r for r in rows if r["serving"] == "aggregated"]
    # the row names the policy it ran, and says so when the scenario serves that one disaggregated
    assert [r["policy"] for r in agg] == [result.aggregated_label(result.aggregated.deployments[0].policy)]
    assert (result.aggregated_label("agg"), result.aggregated_label("pd")) == ("agg", "pd, served aggregated")
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(pd_table(result))
    out = console.export_text()
    assert "ITL p99 ms" in out and "TTFT p ms" not in out
    assert any(line.startswith("policies searched: disaggregated pd, pd-fp8; aggregated agg, pd, pd-fp8")
               for line in pd_lines(result))


def test_the_ttft_split_sums_to_ttft_with_the_api_servers_time():
    """Measured pricing adds the API server's time to TTFT; the split names it, and its parts sum to TTFT."""
    import kvsim

    sc = pd_scenario(policies=[{"name": "pd"}])
    (s,) = kvsim.run(sc).summaries.values()
    split = {k: v["mean"] for k, v in s["disaggregation"]["ttft_split_s"].items()}
    assert split["api_server"] > 0  # H100 under measured kernels: the server's sourced time
    assert sum(split.values()) == pytest.approx(s["ttft_s"]["mean"], rel=1e-9)


# ---- layouts: DP and EP named, every GPU priced

def test_a_dp_ep_layout_is_named_and_priced_as_two_gpus(capsys):
    import kvsim
    from kvsim.planning.deploy import Deployment
    from kvsim.planning.parallel import Parallel
    from kvsim.scenario.layout import hourly_cost

    sc = kvsim.load_scenario(SCENARIOS / "moe.toml")
    cost = hourly_cost(sc)
    assert (cost.num_gpus, cost.usd_per_hour) == (2, pytest.approx(2 * 2.99))
    assert main(["memory", str(SCENARIOS / "moe.toml")]) == 0
    out = capsys.readouterr().out
    assert "TP 1 × DP 2 + EP (2 GPUs a replica" in out and "tp=1" not in out
    assert main(["run", str(SCENARIOS / "moe.toml"), "--policy", "paged", "--set", "workload.num_requests=40",
                 "--out", str(__import__("tempfile").mkdtemp()), "--force"]) == 0
    out = capsys.readouterr().out
    assert "Qwen3-30B-A3B on 2 × H100-SXM as TP 1 × DP 2 + EP × 1 replica" in out and "TP 1 × 1 replica" not in out
    d = Deployment("H100-SXM", Parallel(1, 2, True), 3, 6, "paged", True, 5.0, None, None, None, None, None,
                   6 * 2.99, 0.0, 0.0, "test")
    assert d.answer().startswith("6 × H100-SXM as TP 1 × DP 2 + EP × 3 replicas, $17.94/h")
    assert d.layout_name == "TP 1 × DP 2 + EP"


def test_a_disaggregated_policy_costs_both_pools():
    from kvsim.scenario.layout import hourly_cost

    sc = pd_scenario(disaggregation={"link": {"preset": "infiniband-ndr"}, "prefill": {"num_replicas": 2},
                                     "decode": {"num_replicas": 1, "tensor_parallel_size": 2}})
    assert hourly_cost(sc, sc.policies[1]).num_gpus == 2 + 2
    assert hourly_cost(sc, sc.policies[0]).num_gpus == 1  # served aggregated on [hardware]


# ---- impossible requests are bad input

def test_impossible_target_requests_are_one_line_naming_the_flag(capsys):
    chat = str(SCENARIOS / "chat.toml")
    assert main(["plan", chat, "--target-rate", "20", "--tp", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("kvsim: error: --tp 3: ") and "attention heads" in err
    for bad in ("inf", "nan", "-1"):
        with pytest.raises(SystemExit) as exited:  # argparse's: the guard around main turns it into the exit code
            main(["plan", chat, "--target-rate", bad])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--target-rate" in err and "workload.arrival.rate" not in err
    from kvsim.planning.deploy import deploy

    with pytest.raises(KvsimError, match="--target-rate"):
        deploy(make_scenario(), math.inf)


# ---- the deployment search recommends what vllm serve runs

def test_the_deployment_search_recommends_what_vllm_serve_runs(tmp_path):
    from kvsim.planning.deploy import deploy
    from kvsim.planning.output import deploy_lines, skipped_line

    sc = serial_scenario(tmp_path, cost={"gpu_hour_usd": {"H100-SXM": 3.0}, "source": "test"},
                         policies=[{"name": "slab", "allocator": "contiguous", "enable_chunked_prefill": False},
                                   {"name": "int4", "kv_cache_dtype": "int4"}, {"name": "paged"}])
    result = deploy(sc, 25.0, gpus=["H100-SXM"], tensor_parallel=(1, 3), seeds=1, top=1, headroom=False,
                    executor=InlineExecutor())
    assert [d.policy for d in result.deployments] == ["paged"] and result.meta["policies"] == ["paged"]
    kinds = {(s["policy"], s["kind"]) for s in result.skipped}
    assert {("slab", "not_vllm"), ("int4", "not_vllm"), ("*", "tensor_parallel")} <= kinds
    line = skipped_line(result.skipped)
    assert "\n" not in line and len(line) < 200 and line.startswith(f"{len(result.skipped)} layouts left out: ")
    assert "2 use a policy vllm serve cannot run" in line and "1 split the model's heads unevenly" in line
    run = next(x for x in deploy_lines(result) if x.startswith("run it: "))
    assert "vllm serve Llama-3.1-8B" in run and "--max-num-seqs 1" in run and "--max-model-len 1024" in run
    with pytest.raises(KvsimError, match="--policy: no candidate policy vllm serve can run"):
        deploy(sc, 25.0, gpus=["H100-SXM"], tensor_parallel=(1,), policy="slab", seeds=1, executor=InlineExecutor())


def test_serve_flags_name_the_layout_and_the_policys_settings():
    from kvsim.scenario.layout import serve_flags, serve_problem

    sc = make_scenario(hardware={"gpu": "H100-SXM", "gpu_memory_utilization": 0.85})
    fp8 = sc.policies[0].model_copy(update={"kv_cache_dtype": "fp8", "enable_chunked_prefill": False})
    assert serve_flags(sc, fp8, 1, 2, True) == ("--data-parallel-size 2 --enable-expert-parallel --kv-cache-dtype fp8 "
                                                "--no-enable-chunked-prefill --max-model-len 4096 --max-num-seqs 64 "
                                                "--max-num-batched-tokens 2048 --gpu-memory-utilization 0.85")
    assert serve_problem(fp8) == ""
    assert "per_token" in serve_problem(fp8.model_copy(update={"kv_cache_scales": "per_token"}))


# ---- ties rank by what the user gets; three req/s, three names

def capacity(name, clients, rps, low, high, mean=None):
    return SimpleNamespace(policy=name, safe_rate=clients, mean_rate=mean or (low + high) / 2, ci_low=low, ci_high=high,
                           at_safe_rate={"throughput_rps": rps})


def test_tied_closed_loops_rank_by_the_req_s_their_clients_get():
    from kvsim.planning.capacity import best, ties

    # closed_loop.toml's plan on 7d38f5d: all safe at 123 clients, knees 130.67 / 129 / 129
    chunked = capacity("paged-chunked", 123, 18.3, 111, 148, 130.67)  # the higher knee, fewer requests/s
    fp8 = capacity("paged-fp8", 123, 20.0, 105, 159, 129.0)
    paged = capacity("paged", 123, 18.1, 105, 159, 129.0)
    slow = capacity("slow", 40, 30.0, 35, 45)  # more req/s, but not tied: fewer clients safe
    groups = ties([chunked, paged, fp8, slow], "clients")
    assert [[a.policy for a in g] for g in groups] == [["paged-fp8", "paged-chunked", "paged"], ["slow"]]
    assert [a.policy for a in ties([chunked, fp8], "req/s")[0]] == ["paged-chunked", "paged-fp8"]  # open loop
    result = SimpleNamespace(policies=[chunked, paged, fp8, slow], meta={"load_unit": "clients"})
    assert best(result).policy == "paged-fp8"


def test_a_closed_loops_three_rates_are_named_as_what_they_are():
    from kvsim.planning.output import _there
    from kvsim.results.headline import HEAD_FIGURES
    from kvsim.results.report import _rate_text

    sent = _rate_text({"process": "immediate"}, 22.94, {"max_concurrency": 123})
    assert sent.endswith("sent 22.94 req/s (first to last request sent)")
    assert HEAD_FIGURES[0].label == "completed req/s"
    there = _there(capacity("p", 123, 20.0, 1, 2), "clients", {"safe_check_step_time_scale": 1.05})
    assert there == ", completing 20 req/s there over the safe check's whole runs (every step 5% dearer)"


# ---- kvsim memory

def test_memory_for_a_sliding_window_model_shows_its_groups_and_says_what_each_row_is(capsys):
    assert main(["memory", str(SCENARIOS / "chat.toml"), "--set", "model.name=gpt-oss-20b"]) == 0
    out = capsys.readouterr().out
    assert "vLLM v0.11.0 KV cache groups (hybrid manager; paged" in out  # chat's first policy is contiguous
    assert "SlidingWindowSpec" in out and "decoding / naive" not in out
    assert re.search(r"fit decoding .*2,179", out) and re.search(r"fit, no window .*1,226", out)
    assert "fit decoding: sequences past their prefill" in out.replace("\n", " ").replace("  ", " ")
