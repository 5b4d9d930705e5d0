"""Measured serving runs: llm-d inference-perf result folders read as they were written, their figures
stated from a simulation as inference-perf states them, and the server terms fitted to runs (recovering
known terms from runs kvsim made with them, holding groups out)."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibrate.inference_perf import PER_CHUNK, PER_LINE, pool_lengths, predicted_figures, read_run
from kvsim.errors import KvsimError
from kvsim.results.distributions import LogHistogram

CONFIG = """api:
  type: completion
  streaming: true
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 3
    num_prompts_per_group: 4
    system_prompt_len: 100
    question_len: 400
    output_len: {output}
load:
  type: constant
  stages:
  - rate: 2.0
    duration: 30
  - rate: 4.0
    duration: 30
server:
  type: vllm
  ignore_eos: true
"""


def dist(mean, **q):
    out = {"mean": mean, "min": mean * 0.5, "median": mean, "p25": mean * 0.95, "p75": mean * 1.05,
           "p90": mean * 1.1, "p99": mean * 1.3, "max": mean * 2}
    out.update(q)
    return out


def stage_doc(ttft, token_s, n, lines=2):
    """A stage file whose TPOT counts `lines` lines a token, as inference-perf's releases did."""
    e2e = ttft + (n - 1) * token_s
    div = n * lines + (2 if lines == 2 else 0) - 1
    return {"load_summary": {"requested_rate": 2.0, "achieved_rate": 2.0},
            "successes": {"count": 60, "latency": {
                "time_to_first_token": dist(ttft), "request_latency": dist(e2e),
                "time_per_output_token": dist((e2e - ttft) / div), "inter_token_latency": dist((e2e - ttft) / div)},
                "prompt_len": {"mean": 521.0, "p25": 515.0, "p75": 527.0, "min": 505.0, "max": 540.0},
                "output_len": {"mean": 180.0}},
            "failures": {"count": 0}}


def write_run(root: Path, output=100, lines=2, config=CONFIG) -> Path:
    results = root / "exp" / "results"
    results.mkdir(parents=True)
    (results / "config.yaml").write_text(config.format(output=output))
    for i, ttft in enumerate((0.03, 0.04)):
        (results / f"stage_{i}_lifecycle_metrics.json").write_text(json.dumps(stage_doc(ttft, 0.01, output, lines)))
    return root / "exp"


def test_an_inference_perf_folder_reads_as_it_ran(tmp_path):
    run = read_run(write_run(tmp_path))
    assert (run.num_groups, run.prompts_per_group, run.output_len, run.ignore_eos) == (3, 4, 100, True)
    assert [(s.rate, s.duration_s, s.num_requests) for s in run.stages] == [(2.0, 30.0, 60), (4.0, 30.0, 120)]
    assert run.stages[1].measured["ttft", "mean"] == 0.04 and run.stages[0].measured["ttft", "p50"] == 0.03
    # every SSE line counted: (E2E - TTFT) / TPOT = 2N + 1
    assert run.timing == PER_LINE and PER_LINE.tpot_divisor(100) == 201 and PER_CHUNK.tpot_divisor(100) == 99
    # the pool's lengths: the 500 ids drawn re-tokenize to 521 - 1 (BOS) tokens, the system prompt's 100 to 104
    prefix, question = pool_lengths(run, run.stages[0])
    assert prefix == 1 + 104 and question["mean"] == pytest.approx(521 - 105)
    assert question["sigma"] == pytest.approx(12 / 1.349 / 416) and (question["min"], question["max"]) == (400, 435)
    wl = run.workload(run.stages[1])
    assert wl["prefix"] == {"num_groups": 3, "prefix_len": 105, "prompts_per_group": 4}
    assert wl["num_requests"] == 120 and wl["arrival"] == {"process": "poisson", "rate": 4.0}
    assert wl["output_len"] == {"dist": "fixed", "value": 100}
    assert read_run(tmp_path / "exp" / "results").stages[0].measured == run.stages[0].measured  # the results folder too


def test_a_stream_counted_by_chunks_is_told_from_its_figures(tmp_path):
    assert read_run(write_run(tmp_path, lines=1)).timing == PER_CHUNK


@pytest.mark.parametrize("change, message", [
    (lambda c: c.replace("type: shared_prefix", "type: random"), "'random' data is not read"),
    (lambda c: c.replace("output_len: {output}", "output_len: {output}\n    enable_multi_turn_chat: true"),
     "multi-turn chat is not read"),
    (lambda c: c.replace("type: constant", "type: concurrent"), "'concurrent' load is not read"),
    (lambda c: c.replace("streaming: true", "streaming: false"), "measures no TTFT"),
    (lambda c: c.replace("num_groups: 3", "num_groups: -3"), "num_groups: must be between"),
    (lambda c: c + "x: &a [1]\ny: *a\n", "anchors and aliases are not read"),
    (lambda c: c + "  bad: [\n", "invalid YAML"),
])
def test_what_kvsim_cannot_replay_is_one_line(tmp_path, change, message):
    with pytest.raises(KvsimError, match=message) as err:
        read_run(write_run(tmp_path, config=change(CONFIG)))
    assert "config.yaml" in str(err.value) and "\n" not in str(err.value)


def test_no_results_is_one_line(tmp_path):
    with pytest.raises(KvsimError, match="not an inference-perf result folder"):
        read_run(tmp_path)
    folder = write_run(tmp_path)
    for p in (folder / "results").glob("stage_*"):
        p.unlink()
    with pytest.raises(KvsimError, match="no stage_"):
        read_run(folder)


def test_a_simulation_is_stated_as_inference_perf_states_it():
    """N = 5 tokens, every line counted: 12 lines, so TPOT = (E2E - TTFT) / 11 and 7 of the 11 line gaps
    are an event's blank line (zero); ITL's upper percentiles are the token gaps'."""
    ttft, e2e = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.5, 0.6, 0.9, 1.2])
    gaps = LogHistogram()
    gaps.add_many([0.1] * 50 + [0.2] * 50)
    fig = predicted_figures({"ttft_s": ttft, "e2e_s": e2e}, gaps, 5, PER_LINE)
    assert fig["ttft", "mean"] == pytest.approx(0.25) and fig["e2e", "p50"] == pytest.approx(0.75)
    assert fig["tpot", "mean"] == pytest.approx(np.mean((e2e - ttft) / 11))
    assert fig["tpot", "p90"] == pytest.approx(np.percentile((e2e - ttft) / 11, 90))
    assert PER_LINE.zero_gaps(5) == pytest.approx(7 / 11)
    # the 90th percentile of the line gaps is the (0.9 - 7/11) / (4/11) = 72.5th of the token gaps
    assert fig["itl", "p90"] == pytest.approx(gaps.percentile(72.5))
    assert ("itl", "p50") not in fig  # below the zero gaps' share: a client's parse time, not predicted


# ---- the fit of the server terms ---------------------------------------------------------------------
SCENARIO = """name = "fit"
[model]
name = "Llama-3.1-8B"
[engine]
max_num_seqs = 64
[[policies]]
name = "paged"
[workload]
seed = 1
num_requests = 160
arrival = {{ process = "poisson", rate = {rate} }}
prompt_len = {{ dist = "fixed", value = 300 }}
output_len = {{ dist = "fixed", value = 24 }}
prefix = {{ num_groups = 2, prefix_len = 64, prompts_per_group = 4 }}
"""
TRUE = {"api_server_s": 0.006, "piecewise_layer_s": 4e-5}


def bench_json(path: Path, sc, figures: dict) -> Path:
    """A vllm bench serve result of the scenario's workload with these figures."""
    from kvsim.scenario.workload import generate_requests

    reqs = list(generate_requests(sc))
    doc = {"completed": len(reqs), "num_prompts": len(reqs), "request_rate": sc.workload.arrival.rate,
           "total_input_tokens": sum(r.prompt_len for r in reqs),
           "total_output_tokens": sum(r.output_len for r in reqs),
           "output_throughput": 100.0}
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
    for (metric, stat), v in figures.items():
        doc[f"{'median' if stat == 'p50' else stat}_{names[metric]}_ms"] = v * 1e3
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def truth_runs(tmp_path_factory):
    """Two runs (4 and 12 req/s) kvsim measured with known terms, written as vllm bench serve results."""
    from kvsim.calibrate.serving_runs import bench_case, simulate_case
    from kvsim.perf.server import shipped_terms
    from kvsim.scenario.config import load_scenario

    root = tmp_path_factory.mktemp("runs")
    true = replace(shipped_terms("H100-SXM")[0], **TRUE)
    pairs = []
    for rate in (4, 12):
        path = root / f"r{rate}.toml"
        path.write_text(SCENARIO.format(rate=rate))
        sc = load_scenario(path)
        placeholder = bench_json(root / f"r{rate}.json", sc, {("ttft", "mean"): 1.0})
        figures = simulate_case(bench_case(sc, placeholder), true).figures
        pairs.append((path, bench_json(root / f"r{rate}.json", sc, figures)))
    return root, pairs


def test_the_fit_recovers_the_terms_that_made_the_runs(truth_runs):
    from kvsim.calibrate.server_cli import serving_cases
    from kvsim.calibrate.server_fit import error_rows, fit_terms, leave_groups_out, summary
    from kvsim.perf.server import shipped_terms

    _, pairs = truth_runs
    cases, start, gpu, version = serving_cases(pairs)
    assert (gpu, len(cases)) == ("H100-SXM", 2) and start == shipped_terms("H100-SXM", version)[0]
    start = replace(start, api_server_s=0.0102, piecewise_layer_s=0.0)  # far from the terms that made the runs
    fit = fit_terms(cases, start, list(TRUE))
    for name, value in TRUE.items():
        assert getattr(fit.terms, name) == pytest.approx(value, rel=0.15), name
    assert summary(error_rows(cases, fit.point.figures))["median_abs_error"] < 0.01
    again = fit_terms(cases, start, list(TRUE))
    assert again.terms == fit.terms  # deterministic: seeded simulations, a deterministic solver
    held = leave_groups_out(cases, fit)
    assert set(held.terms) == {c.group for c in cases}
    assert summary(error_rows(cases, held.figures))["median_abs_error"] < 0.03


def test_kvsim_calibrate_server_terms_writes_a_file_a_scenario_prices_with(truth_runs, tmp_path):
    from kvsim.cli import main
    from kvsim.perf.server import load_server_terms

    root, pairs = truth_runs
    out = tmp_path / "terms.json"
    args = ["calibrate", "--server-terms", "api_server_s"]
    for scenario, result in pairs:
        args += ["--serving", str(scenario), str(result)]
    assert main(args + ["-o", str(out)]) == 0
    terms, prov = load_server_terms(out)
    doc = json.loads(out.read_text())
    assert doc["written_by"] == "kvsim calibrate" and doc["fit"]["groups"] == 2 and doc["vllm_version"]
    assert "fitted by kvsim calibrate --server-terms" in prov["api_server_s"] and "hold-out" in prov["api_server_s"]
    assert 0.004 < terms.api_server_s < 0.009  # piecewise_layer_s kept at 0: api absorbs part of it
    assert main(args + ["-o", str(out)]) == 0  # its own file: replaced
    scenario = pairs[0][0].read_text().replace("[[policies]]", f'[backend]\nserver_terms = "{out}"\n\n[[policies]]')
    (tmp_path / "s.toml").write_text(scenario)
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "res"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["policies"]["paged"]["backend"]["pricing"]["server_terms"]["api_server_s"] == terms.api_server_s


def test_server_terms_refusals_are_one_line(truth_runs, tmp_path, capsys):
    from kvsim.cli import main

    _, pairs = truth_runs
    scenario, result = pairs[0]
    other = tmp_path / "other.json"
    other.write_text("{}")
    base = ["calibrate", "--server-terms", "--serving", str(scenario), str(result), "-o"]
    assert main(base + [str(other)]) == 2  # a file kvsim did not write
    assert main(["calibrate", "--server-terms", "nope", "--serving", str(scenario), str(result), "-o",
                 str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "cannot fit nope" in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


def test_an_inference_perf_folder_becomes_one_case_a_stage_on_the_scenarios_server(tmp_path, truth_runs):
    from kvsim.calibrate.serving_runs import inference_perf_cases
    from kvsim.scenario.config import load_scenario

    _, pairs = truth_runs
    sc = load_scenario(pairs[0][0])
    cases = inference_perf_cases(sc, write_run(tmp_path))
    assert [c.rate for c in cases] == [2.0, 4.0] and all(c.timing == PER_LINE and c.output_tokens == 100 for c in cases)
    wl = cases[1].scenario.workload
    assert (wl.num_requests, wl.arrival.rate, wl.prefix.prompts_per_group, wl.output_len.value) == (120, 4.0, 4, 100)
    assert cases[1].scenario.engine.max_num_seqs == 64 and cases[1].scenario.model.name == "Llama-3.1-8B"
    assert cases[0].measured["ttft", "mean"] == 0.03 and len({c.group for c in cases}) == 1


def test_a_terms_file_holds_one_fit_per_release_of_the_tables(tmp_path):
    from kvsim.perf.server import load_server_terms

    path = tmp_path / "t.json"
    doc = {"terms": {"api_server_s": 0.01}, "provenance": {"api_server_s": "own"},
           "releases": {"0.14.0": {"terms": {"api_server_s": 0.005}, "provenance": {"api_server_s": "fit 14"}},
                        "0.19.0": {"terms": {"api_server_s": 0.006}, "provenance": {"api_server_s": "fit 19"}}}}
    path.write_text(json.dumps(doc))
    assert load_server_terms(path)[0].api_server_s == 0.01  # no release asked: the file's own
    terms, prov = load_server_terms(path, "0.14.0")
    assert terms.api_server_s == 0.005 and prov["api_server_s"] == "fit 14"
    terms, prov = load_server_terms(path, "0.16.0")  # the nearest release fitted
    assert terms.api_server_s == 0.005 and prov["api_server_s"] == "fit 14 (vLLM 0.14.0's fit, the nearest to 0.16.0)"
    assert load_server_terms(path, "0.24.0")[0].api_server_s == 0.006
    doc["releases"]["0.19.0"]["terms"] = {"api_server_s": -1}
    path.write_text(json.dumps(doc))
    with pytest.raises(KvsimError, match=r"releases\.0\.19\.0\.terms\.api_server_s: must be a non-negative number"):
        load_server_terms(path, "0.24.0")


def test_shipped_terms_say_where_they_were_fitted():
    from kvsim.perf.kernels import DATA_DIR
    from kvsim.perf.server import shipped_terms

    h100 = json.loads((DATA_DIR / "h100_sxm-server.json").read_text())
    assert h100["fitted_on"] == "H100-SXM" and set(h100["releases"]) == {"0.14.0", "0.19.0", "0.24.0"}
    # the newest release's fit is the file's own: what a run on the newest tables prices with by default
    assert {n: h100["terms"][n] for n in h100["releases"]["0.24.0"]["terms"]} == h100["releases"]["0.24.0"]["terms"]
    for version, fit in h100["releases"].items():
        terms, prov = shipped_terms("H100-SXM", version)
        assert {n: getattr(terms, n) for n in fit["terms"]} == fit["terms"]
        assert all("predicted by the fit to the other eight" in prov[n] for n in fit["terms"])
    _, prov = shipped_terms("H200", "0.18.0")
    assert prov["api_server_s"].startswith("H100-SXM's fit, estimated for H200")


def test_the_ship_script_folds_in_the_committed_serving_fits():
    """benchmarks/ship_kernel_tables.py rebuilds every <gpu>-server.json's fitted releases from
    benchmarks/results/serving_groundtruth.json, as shipped (other GPUs: H100's, labelled estimated)."""
    import importlib.util

    from kvsim.perf.kernels import DATA_DIR

    script = Path(__file__).parents[1] / "benchmarks" / "ship_kernel_tables.py"
    spec = importlib.util.spec_from_file_location("ship", script)
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    for gpu, stem in ship.AIC_GPUS.items():
        shipped = json.loads((DATA_DIR / f"{stem}-server.json").read_text())
        assert ship.fitted_releases(gpu) == shipped["releases"], gpu
        fit = json.loads(ship.SERVING_FIT.read_text())["fits"]["0.24.0"]
        assert shipped["terms"]["api_server_s"] == round(fit["terms"]["api_server_s"], 7)
