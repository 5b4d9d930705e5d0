"""Capacity planning: a knee known in closed form, monotonicity, the cheapest deployment of a
hand-checked grid, and the same sweep CSV from one worker, a process pool and a real local Ray."""

import json
import math

import pytest

from conftest import make_scenario
from kvsim.cli import main
from kvsim.planning.capacity import plan
from kvsim.planning.deploy import deploy
from kvsim.planning.executors import InlineExecutor, PoolExecutor
from kvsim.planning.output import csv_text
from kvsim.planning.sweep import grid_points, split_values, sweep

STEP_S, OUTPUT_LEN, TTFT_BOUND_S, N = 0.01, 10, 0.05, 200
FAST = {"hbm_bandwidth_gbps": 1e6, "bf16_tflops": 1e6, "fp8_tflops": 1e6, "fp32_tflops": 1e6}  # the schema's caps


def serial_scenario(tmp_path, **over):
    """One request at a time (max_num_seqs 1), every step STEP_S (plus ~2e-5 s to read the weights), fixed
    lengths, evenly spaced arrivals: a request costs OUTPUT_LEN steps (its prefill emits the first token)."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"step_overhead_s": STEP_S, "graph_step_overhead_s": STEP_S, "per_seq_overhead_s": 0.0,
                               "allreduce_latency_s": 0.0, "gemm_pad_tokens": 0.0}))
    sections = {
        "hardware": {"gpu": "H100-SXM", **FAST},
        "engine": {"max_model_len": 1024, "max_num_seqs": 1, "max_num_batched_tokens": 1024},
        "workload": {"seed": 0, "num_requests": N, "arrival": {"process": "deterministic", "rate": 4.0},
                     "prompt_len": {"dist": "fixed", "value": 100}, "output_len": {"dist": "fixed", "value": OUTPUT_LEN}},
        "slo": {"ttft_ms": TTFT_BOUND_S * 1e3, "tpot_ms": None, "percentile": 99},
        "backend": {"calibration": str(cal)},
    }
    sections.update(over)
    return make_scenario(**sections)


def closed_form_knee(n: int = N, scale: float = 1.0) -> float:
    """Past 1/S requests back up: request i (0-based) waits i * (S - g) for gaps g < S. The p99
    request (nearest rank k = ceil(0.99 n)) has TTFT (k - 1)(S - g) + step <= TTFT_BOUND_S iff
    g >= S - (TTFT_BOUND_S - step) / (k - 1); every step `scale` x STEP_S (backend.step_time_scale)."""
    step = STEP_S * scale
    service = OUTPUT_LEN * step
    k = math.ceil(0.99 * n)
    return 1.0 / (service - (TTFT_BOUND_S - step) / (k - 1))


def test_plan_finds_the_closed_form_knee_within_its_resolution(tmp_path):
    sc = serial_scenario(tmp_path)
    result = plan(sc, seeds=2, resolution=0.02, executor=InlineExecutor())
    (answer,) = result.policies
    knee = closed_form_knee()  # 10.0203 req/s on 200 requests
    assert abs(answer.mean_rate / knee - 1) <= 0.02, (answer.mean_rate, knee)
    # nothing random: every seed would give the same requests, so one is simulated and the plan says so
    assert len(answer.seed_max_rates) == answer.replications == 1 and result.meta["seeds_asked"] == 2
    assert "draws nothing at random" in result.meta["replications_note"]
    # the knee re-searched with every step 5% cheaper and dearer: the closed forms at 0.95 and 1.05 x STEP_S
    fast, slow = closed_form_knee(scale=0.95), closed_form_knee(scale=1.05)
    assert abs(answer.knee_faster_steps / fast - 1) <= 0.02 and abs(answer.knee_slower_steps / slow - 1) <= 0.02
    assert slow < knee < fast
    # the interval: the seeds agree (no spread), so it is the resolution's, widened by those ratios
    k0 = answer.seed_max_rates[0]
    assert answer.ci_low == pytest.approx(k0 * 0.98 * answer.knee_slower_steps / k0)
    assert answer.ci_high == pytest.approx(k0 * 1.02 * answer.knee_faster_steps / k0)
    assert answer.ci_low <= slow and fast <= answer.ci_high
    # the safe rate holds for the long run too, with every step 5% dearer than priced: 800 requests
    # queue longer, their knee at 1.05 x STEP_S is 9.53
    long_knee, step = closed_form_knee(4 * N, 1.05), (1 - 0.02) / (1 + 0.02)
    assert long_knee * step ** 2 * 0.995 <= answer.safe_rate <= long_knee * 1.005, (answer.safe_rate, long_knee)
    assert result.meta["safe_check_step_time_scale"] == 1.05
    assert answer.safe_rate <= answer.mean_rate and result.meta["long_run_requests"] == 4 * N
    assert answer.at_safe_rate["sustainable_share"] == 1.0
    assert answer.at_safe_rate["worst_ttft_ms_at_pct"] <= TTFT_BOUND_S * 1e3
    assert answer.sustainable_at_scenario_rate and answer.headroom == pytest.approx(answer.safe_rate / 4.0 - 1)
    # every rate tried below the knee passed and every one above failed
    for p in result.points:
        if p["phase"] == "search" and abs(p["rate"] / knee - 1) > 5e-3:  # the weights' 0.2% aside
            assert p["sustainable"] == (p["rate"] < knee), p
    assert answer.binding == "max_num_seqs"


def kv_bound(**policy):
    """Llama-3.1-8B with a KV cache of about 1,300 blocks (activation reserve eats the rest): long
    fixed prompts, so the KV cache binds long before compute does."""
    return make_scenario(
        engine={"max_model_len": 4096, "max_num_seqs": 256, "max_num_batched_tokens": 4096,
                "activation_reserve_gib": 54.0},
        policies=[{"name": "p", **policy}],
        workload={"seed": 5, "num_requests": 300, "arrival": {"process": "poisson", "rate": 2.0},
                  "prompt_len": {"dist": "fixed", "value": 3000}, "output_len": {"dist": "fixed", "value": 200}},
        slo={"ttft_ms": 3000, "tpot_ms": 200})


def test_more_memory_or_fp8_never_lowers_the_max_rate_when_memory_binds():
    def max_rate(sc):
        (a,) = plan(sc, seeds=1, resolution=0.05, executor=InlineExecutor()).policies
        return a

    base = max_rate(kv_bound())
    fp8 = max_rate(kv_bound(kv_cache_dtype="fp8"))
    sc = kv_bound()
    h200 = max_rate(sc.model_copy(update={"hardware": sc.hardware.model_copy(update={"gpu": "H200"})}))
    assert base.binding == "kv_cache"
    assert fp8.safe_rate >= base.safe_rate and h200.safe_rate >= base.safe_rate
    assert fp8.mean_rate > 1.2 * base.mean_rate  # twice the blocks: a clear gain, not noise


def test_deployment_search_returns_the_cheapest_passing_layout(tmp_path):
    # Every layout serves one request at a time in OUTPUT_LEN steps of STEP_S (10 req/s a replica),
    # so 25 req/s needs 3 replicas on any GPU and TP: the cheapest is the cheaper GPU at TP 1.
    sc = serial_scenario(tmp_path, cost={"gpu_hour_usd": {"H100-SXM": 3.0, "H200": 2.0}, "source": "test"})
    sc = sc.model_copy(update={"hardware": sc.hardware.model_copy(update={k: None for k in FAST})})
    fast = {g: dict(FAST) for g in ("H100-SXM", "H200")}
    result = deploy(_with_fast_gpus(sc, fast), 25.0, gpus=["H100-SXM", "H200"], tensor_parallel=(1, 2), seeds=1,
                    top=1, executor=InlineExecutor())
    best = result.deployments[0]
    assert (best.gpu, best.tensor_parallel_size, best.num_replicas) == ("H200", 1, 3)
    assert best.meets_target and best.usd_per_hour == pytest.approx(6.0) and best.price_source == "test"
    assert 25.0 <= best.safe_rate <= best.mean_rate < 31.0  # three replicas of ~10 req/s, safe from the target up
    # per-million-token costs charge the hour to 25 req/s of 100 input and 10 output tokens
    assert best.usd_per_m_input == pytest.approx(6.0 / (25 * 3600 * 100) * 1e6)
    assert best.usd_per_m_output == pytest.approx(6.0 / (25 * 3600 * 10) * 1e6)
    for d in result.deployments:
        assert d.num_replicas == 3 and d.usd_per_hour >= best.usd_per_hour
    assert {(d.gpu, d.tensor_parallel_size) for d in result.deployments} == {("H200", 1)}  # top 1: the rest dearer



class _WideInline(InlineExecutor):
    workers = 64  # as a 64-core machine reports itself; runs inline all the same


def test_deployment_search_visits_the_same_points_whatever_the_worker_count(tmp_path):
    sc = serial_scenario(tmp_path, cost={"gpu_hour_usd": {"H100-SXM": 3.0, "H200": 2.0}, "source": "test"})
    sc = sc.model_copy(update={"hardware": sc.hardware.model_copy(update={k: None for k in FAST})})
    sc = _with_fast_gpus(sc, {g: dict(FAST) for g in ("H100-SXM", "H200")})
    runs = [deploy(sc, 25.0, gpus=["H100-SXM", "H200"], tensor_parallel=(1, 2, 4), seeds=1, top=1, executor=ex)
            for ex in (InlineExecutor(), _WideInline())]
    assert [d.row() for d in runs[0].deployments] == [d.row() for d in runs[1].deployments]
    assert runs[0].points == runs[1].points

def _with_fast_gpus(sc, fast):
    """Datasheet overrides apply to the scenario's own GPU only, so patch the presets for the test."""
    import kvsim.scenario.catalog as catalog
    from dataclasses import replace

    for name, values in fast.items():
        catalog.GPUS[name] = replace(catalog.GPUS[name], **values)
    return sc


@pytest.fixture(autouse=True)
def restore_gpus():
    import kvsim.scenario.catalog as catalog

    saved = dict(catalog.GPUS)
    yield
    catalog.GPUS.clear()
    catalog.GPUS.update(saved)


def test_split_values_and_grid():
    assert split_values('1, 2,[3, 4],"a,b"') == ["1", "2", "[3, 4]", '"a,b"']
    keys, points = grid_points(["a.b=1,2", "c=x"])
    assert keys == ["a.b", "c"] and points == [["a.b=1", "c=x"], ["a.b=2", "c=x"]]


GRID = {"workload.arrival.rate": [6.0, 30.0], "engine.max_num_seqs": [8, 64]}


def small():
    return make_scenario(workload={"seed": 2, "num_requests": 120, "arrival": {"process": "poisson", "rate": 10.0},
                                   "prompt_len": {"dist": "uniform", "min": 100, "max": 600},
                                   "output_len": {"dist": "uniform", "min": 20, "max": 200}},
                         policies=[{"name": "paged"}, {"name": "fp8", "kv_cache_dtype": "fp8"}])


def test_sweep_csv_is_the_same_inline_on_a_pool_and_on_ray():
    ray = pytest.importorskip("ray")
    sc = small()
    inline = sweep(sc, GRID, executor=InlineExecutor())
    text = csv_text(inline.rows, inline.columns)
    assert len(inline.rows) == 8 and text.count("\n") == 9
    pool = PoolExecutor(2)
    try:
        assert csv_text(*_rows(sweep(sc, GRID, executor=pool))) == text
    finally:
        pool.close()
    ray.init(num_cpus=2, object_store_memory=200 << 20, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    try:
        assert csv_text(*_rows(sweep(sc, GRID, ray="local"))) == text
    finally:
        ray.shutdown()


def _rows(result):
    return result.rows, result.columns


def test_plan_cli_writes_its_files_and_bad_input_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "paged"\n'
                    '[workload]\nnum_requests = 100\narrival = { process = "poisson", rate = 5.0 }\n')
    out = tmp_path / "plan"
    assert main(["plan", str(path), "--seeds", "1", "--resolution", "0.2", "--workers", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    assert doc["policies"][0]["policy"] == "paged" and 0 < doc["policies"][0]["safe_rate"]
    assert (out / "plan.csv").read_text().startswith("policy,safe_rate,mean_rate,ci_low,ci_high")
    assert "safe req/s" in capsys.readouterr().out
    assert main(["plan", str(path), "--seeds", "1", "--resolution", "0.2", "--workers", "1", "--out", str(out)]) == 0
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["plan", str(path), "--set", "engine.bogus=1"]) == 2
    assert main(["sweep", str(path)]) == 2
    assert main(["plan", str(path), "--out", str(foreign)]) == 2  # refused before anything runs
    assert main(["sweep", str(path), "--set", "workload.num_requests=10", "--out", str(foreign)]) == 2
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("kvsim: error:") for line in err)


@pytest.mark.parametrize("calibration, prompt, tpot_ms, bound", [
    # 8 ms of GEMMs a token: a step of n decoders takes ~8n ms
    ({"compute_efficiency": 0.002, "attention_efficiency": 0.002}, 64, 100, "compute"),
    # 67 GB/s: the weights take 0.24 s a step, each 4k-token context ~8 ms more (no token budget to speak of)
    ({"memory_efficiency": 0.02}, 4000, 600, "bandwidth"),
])
def test_plan_names_compute_or_bandwidth_when_step_time_binds(tmp_path, calibration, prompt, tpot_ms, bound):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"step_overhead_s": 0.0, "graph_step_overhead_s": 0.0, "per_seq_overhead_s": 0.0,
                               "gemm_pad_tokens": 0.0, **calibration}))
    sc = make_scenario(engine={"max_model_len": 8192, "max_num_seqs": 1024, "max_num_batched_tokens": 65536},
                       workload={"seed": 0, "num_requests": 150, "arrival": {"process": "deterministic", "rate": 1.0},
                                 "prompt_len": {"dist": "fixed", "value": prompt},
                                 "output_len": {"dist": "fixed", "value": 16}},
                       slo={"ttft_ms": None, "tpot_ms": tpot_ms, "percentile": 99}, backend={"calibration": str(cal)})
    result = plan(sc, seeds=1, resolution=0.1, executor=InlineExecutor())
    (answer,) = result.policies
    assert answer.binding == bound, answer.binding_detail
    # the counterfactual shows its baseline: the same point as it is, beside 2x FLOP/s and 2x bandwidth
    base = next(p for p in result.points if p["phase"] == "counterfactual_baseline")
    assert base["rate"] == answer.first_unsustainable_rate and not base["sustainable"]
    assert f"(SLO margin {base['slo_margin']:+.0%} as it is)" in answer.binding_detail


def test_points_from_csv(tmp_path):
    from kvsim.errors import KvsimError
    from kvsim.planning.sweep import points_from_csv

    f = tmp_path / "p.csv"
    f.write_text("workload.arrival.rate,policies.*.kv_cache_dtype\n4,fp8\n\n8,auto\n")
    assert points_from_csv(f) == (["workload.arrival.rate", "policies.*.kv_cache_dtype"],
                                  [["workload.arrival.rate=4", "policies.*.kv_cache_dtype=fp8"],
                                   ["workload.arrival.rate=8", "policies.*.kv_cache_dtype=auto"]])
    f.write_text("a,b\n1,2\n3\n")
    with pytest.raises(KvsimError, match=r"p\.csv:3: 1 values for 2 keys"):
        points_from_csv(f)


def test_an_slo_no_single_request_meets_gives_zero_and_says_so():
    from kvsim.planning.output import plan_lines

    sc = make_scenario(slo={"ttft_ms": 1, "tpot_ms": None})  # no prefill takes 1 ms
    result = plan(sc, seeds=1, resolution=0.1, executor=InlineExecutor())
    (answer,) = result.policies
    assert answer.safe_rate == answer.mean_rate == 0 and answer.headroom == -1
    assert not answer.sustainable_at_scenario_rate
    assert min(p["rate"] for p in result.points) == pytest.approx(10.0 / 64)  # six halvings, then it stops
    assert any("no safe rate found, down to 0.156 req/s" in line for line in plan_lines(result))


def test_moe_deployment_search_equals_brute_force_over_tp_dp_ep(tmp_path):
    """Qwen3-30B-A3B, every engine serial (one request at a time, ~10 req/s an engine, steps priced by the
    calibration's overhead alone): at 15 req/s a single engine fails, so the cheapest layouts are two GPUs
    a deployment: TP 1 x 2 replicas, or one replica of DP 2 (experts sliced or whole). Brute force: every
    layout the search considers, each replica count from 1 up until its seeds and long run pass."""
    from kvsim.planning.deploy import _hardware, layouts
    from kvsim.planning.points import evaluate_point
    from kvsim.planning.safe import LONG_RUN

    n_req, target = 80, 15.0
    sc = serial_scenario(tmp_path, model={"name": "Qwen3-30B-A3B"}, cost={"gpu_hour_usd": {"H100-SXM": 2.0},
                                                                            "source": "test"})
    ok, _ = layouts(sc, ["paged"], ["H100-SXM"], (1, 2))
    assert len(ok) == 13  # TP 1: 1 and DP 2/4/8 with and without EP; TP 2: 2, 2 EP, DP 2/4 with and without EP

    def passes(lay, n):
        hw = {"hardware": _hardware(sc, "H100-SXM", lay[1], n)}
        return all(evaluate_point(sc, "paged", target, sc.workload.seed, n_req * min(n, 2) * k, None, hw)
                   ["sustainable"] for k in (1, LONG_RUN))

    cost = {}
    for lay in ok:
        n = next(n for n in range(1, 5) if passes(lay, n))
        cost[(str(lay[1]), n)] = 2.0 * int(lay[1]) * n
    cheapest = min(cost.values())
    assert cheapest == 4.0 and {k for k, v in cost.items() if v == cheapest} == {("1", 2), ("1 DP 2", 1),
                                                                                ("1 DP 2 EP", 1)}
    result = deploy(sc, target, gpus=["H100-SXM"], tensor_parallel=(1, 2), policy="paged", seeds=1, top=3,
                    num_requests=n_req, executor=InlineExecutor(), headroom=False)
    got = {(str(d.layout), d.num_replicas) for d in result.deployments if d.usd_per_hour == cheapest}
    assert result.deployments[0].usd_per_hour == cheapest and got == {k for k, v in cost.items() if v == cheapest}


def test_the_deployment_search_says_when_its_winner_is_estimated():
    from dataclasses import replace

    from kvsim.planning.deploy import DeployResult, Deployment, layout_basis
    from kvsim.planning.output import deploy_lines

    sc = make_scenario()
    assert layout_basis(sc, "H100-SXM", 1)[0] == "measured"
    label, why = layout_basis(sc, "MI300X", 2)
    assert label == "estimated" and "MI300X" in why and "H100 efficiencies" in why
    h100 = Deployment("H100-SXM", 1, 2, 2, "paged", True, 12.0, 25.0, 26.0, 24.0, 28.0, 0.25, 6.0, 0.1, 0.5, "test",
                      pricing="measured", pricing_why="vLLM 0.24.0 kernels timed on H100-SXM")
    mi = replace(h100, gpu="MI300X", usd_per_hour=4.0, pricing=label, pricing_why=why)
    meta = {"model": "m", "slo": {"ttft_ms": 1000.0, "percentile": 99.0}, "policies": ["paged"], "seeds": [0],
            "num_requests": 10, "long_run_requests": 40, "mean_prompt_tokens": 100.0, "mean_output_tokens": 10.0}
    lines = deploy_lines(DeployResult(20.0, meta, [mi, h100]))
    assert lines[3].startswith("cheapest: 2 × MI300X") and lines[3].endswith("; estimated")
    assert lines[4].startswith("ESTIMATED: the cheapest rests on no measured kernels or calibration for MI300X")
    assert lines[4].endswith("Cheapest measured: " + h100.answer())
    measured = deploy_lines(DeployResult(20.0, meta, [h100, mi]))
    assert len(measured) == 5 and measured[4].startswith("run it: ")  # a measured winner needs no warning
