"""kvsim validate: the error table against hand-made measured summaries and vllm bench results, the CLI,
the triton backend's step log (without a GPU), and the GPU validation script's pipeline on the CPU."""

import copy
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvsim
from kvsim.batch import Batch
from kvsim.calibrate.validate import median_abs_error, validate
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.pipeline import run_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """name = "small"
[model]
name = "Qwen3-0.6B"
[engine]
max_model_len = 2048
max_num_seqs = 64
max_num_batched_tokens = 2048
[[policies]]
name = "paged"
[[policies]]
name = "paged-fp8"
kv_cache_dtype = "fp8"
[workload]
seed = 4
num_requests = 40
arrival = { process = "poisson", rate = 25.0 }
prompt_len = { dist = "uniform", min = 50, max = 400 }
output_len = { dist = "uniform", min = 10, max = 60 }
[output]
report_html = false
[backend]
name = "triton"
"""


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SCENARIO)
    return kvsim.load_scenario(path)


def predicted(scenario, calibration="triton") -> dict:
    backend = scenario.backend.model_copy(update={"name": "analytic", "calibration": calibration})
    return run_scenario(scenario.model_copy(update={"backend": backend}), None, write=False).summaries


def measured_folder(tmp_path, summaries: dict, name: str = "small") -> Path:
    out = tmp_path / "measured"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"scenario": name, "meta": {}, "policies": summaries}))
    return out


def test_error_table_against_a_hand_made_triton_run(tmp_path, scenario):
    pred = predicted(scenario)
    real = copy.deepcopy(pred)
    real["paged"]["ttft_s"]["p50"] *= 2.0  # measured twice the predicted: error -50%
    real["paged"]["throughput"]["output_tokens_per_s"] /= 1.25  # error +25%
    real["paged"]["kv"]["num_blocks"] = pred["paged"]["kv"]["num_blocks"] + 100
    real["paged"]["backend"] = {"step_times": {"decode": {"steps": 10, "measured_s": 0.1, "predicted_s": 0.09,
                                                          "median_ratio": 0.9}}}
    del real["paged-fp8"]
    records = validate(scenario, measured_folder(tmp_path, real))
    assert {r["policy"] for r in records} == {"paged"}
    by = {r["figure"]: r for r in records}
    assert by["TTFT p50"]["error"] == pytest.approx(-0.5)
    assert by["TTFT p50"]["measured"] == pytest.approx(2e3 * pred["paged"]["ttft_s"]["p50"])  # in ms
    assert by["output tok/s"]["error"] == pytest.approx(0.25)
    assert by["KV blocks"]["error"] == pytest.approx(-100 / (pred["paged"]["kv"]["num_blocks"] + 100))
    assert by["TPOT mean"]["error"] == pytest.approx(0.0) and by["peak running"]["error"] == 0.0
    assert by["decode steps (10)"]["kind"] == "step" and by["decode steps (10)"]["error"] == pytest.approx(-0.1)
    serving = [r for r in records if r["kind"] == "serving"]
    assert len(serving) == 10 and median_abs_error(records) == pytest.approx(0.0)  # 7 of 10 exact
    (tmp_path / "x").mkdir()
    again = kvsim.validate(scenario.source, measured_folder(tmp_path / "x", real))
    assert again == records  # the library API, from a path, gives the same plain records


def test_error_table_against_a_vllm_bench_result(tmp_path, scenario):
    pred = predicted(scenario, calibration=None)["paged"]  # a bench result: the shipped vLLM calibration
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({
        "completed": 40, "num_prompts": 40, "output_throughput": pred["throughput"]["output_tokens_per_s"] * 2,
        "median_ttft_ms": pred["ttft_s"]["p50"] * 1e3, "p99_ttft_ms": 0, "mean_tpot_ms": pred["tpot_s"]["mean"] * 500}))
    records = validate(scenario, bench)
    by = {r["figure"]: r for r in records}
    assert set(by) == {"TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT mean", "E2E p50", "E2E p99",
                       "output tok/s", "KV blocks", "peak running"}
    assert by["TTFT p50"]["error"] == pytest.approx(0.0) and by["TPOT mean"]["error"] == pytest.approx(1.0)
    assert by["output tok/s"]["error"] == pytest.approx(-0.5)
    assert by["TTFT p99"]["measured"] == 0.0 and by["TTFT p99"]["error"] is None  # no error against zero
    assert by["KV blocks"]["measured"] is None and by["KV blocks"]["error"] is None  # not in the JSON
    assert {r["policy"] for r in records} == {"paged"}


def test_validate_refuses_a_run_of_another_scenario(tmp_path, scenario):
    with pytest.raises(KvsimError, match=r"measured scenario 'other', not 'small'"):
        validate(scenario, measured_folder(tmp_path, {"paged": {}}, name="other"))
    (tmp_path / "y").mkdir()
    with pytest.raises(KvsimError, match=r"policy nope is not in"):
        validate(scenario, measured_folder(tmp_path / "y", {"nope": {}}))
    with pytest.raises(KvsimError, match=r"no summary\.json"):
        validate(scenario, tmp_path)
    (tmp_path / "bad.json").write_text('{"policies": 3}')
    with pytest.raises(KvsimError, match=r"bad\.json: not a `vllm bench serve --save-result` JSON"):
        validate(scenario, tmp_path / "bad.json")


def test_validate_cli_prints_and_writes_the_table(tmp_path, scenario, capsys):
    folder = measured_folder(tmp_path, predicted(scenario))
    out = tmp_path / "errors.csv"
    assert main(["validate", scenario.source, "--measured", str(folder), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "policy paged-fp8" in text and "median |error| over all serving figures: 0.0%" in text
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 20 and {r["policy"] for r in rows} == {"paged", "paged-fp8"}
    assert main(["validate", scenario.source, "--measured", str(folder), "--out", str(out)]) == 2  # not overwritten
    assert "already exists" in capsys.readouterr().err
    assert main(["validate", scenario.source, "--measured", str(folder), "--out", str(tmp_path / "e.txt")]) == 2
    assert "must end in .csv or .json" in capsys.readouterr().err
    assert main(["validate", scenario.source, "--measured", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured results not found" in err
    # --set as on every scenario command: another name no longer matches the measured run
    assert main(["validate", scenario.source, "--set", "name=other", "--measured", str(folder)]) == 2
    assert "measured scenario 'small', not 'other'" in capsys.readouterr().err


def test_step_log_of_the_triton_backend(tmp_path, scenario, monkeypatch):
    from kvsim.backends.triton_engine.backend import STEP_LOG_COLUMNS, StepLog
    from kvsim.perf.calibration import load_calibration, shipped_path
    from kvsim.perf.roofline import StepModel
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.sequence import Request, Sequence

    monkeypatch.setenv("KVSIM_STEP_LOG", str(tmp_path / "steps.csv"))
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    log = StepLog(scenario, scenario.policies[0], model, gpu, [1, 2, 4, 8], 4096)
    seqs = []
    for i, ctx in enumerate((100, 300)):
        s = Sequence(Request(i, 0.0, ctx, 10))
        s.num_computed_tokens = ctx
        seqs.append(s)
    decode = Batch()
    for s in seqs:
        decode.add(s, 1)
    log.add(decode, 0.004)
    prefill = Batch()
    prefill.add(Sequence(Request(9, 0.0, 64, 4)), 64)
    log.add(prefill, 0.010)
    log.close()
    sm = StepModel(model, gpu, 1, "auto", load_calibration(shipped_path("H100-SXM", "triton")), 16, (1, 2, 4, 8), 4096)
    summary = log.summary()
    assert summary["calibration"] == "shipped:H100-SXM-triton.json"
    assert summary["decode"]["predicted_s"] == pytest.approx(sm.step_time(decode))
    assert summary["prefill"]["median_ratio"] == pytest.approx(sm.step_time(prefill) / 0.010)
    rows = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert list(rows[0]) == list(STEP_LOG_COLUMNS)
    assert (rows[0]["phase"], rows[0]["decode_context"], rows[0]["graph_batch"], rows[0]["cuda_graph"]) == \
        ("decode", "301", "2", "1")
    assert (rows[0]["decode_max_context"], rows[0]["max_model_len"]) == ("301", "4096")
    assert rows[1]["phase"] == "prefill" and rows[1]["num_prefill_tokens"] == "64" and rows[1]["step_s"] == "0.01"
    # benchmarks/reprice_steps.py prices the log again: the same calibration gives the logged prices
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/reprice_steps.py"), str(tmp_path / "steps.csv")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("| steps.csv | auto | decode | **all**"))
    before, after = line.split("|")[7], line.split("|")[9]
    assert float(before) == float(after) == pytest.approx(sm.step_time(decode) / 0.004, abs=5e-4)


def test_gpu_validation_script_runs_on_the_cpu(tmp_path):
    """benchmarks/validate_gpu.py end to end with the analytic backend standing in for the GPU."""
    out = tmp_path / "val"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/validate_gpu.py"), "--out", str(out),
                           "--set", "backend.name=analytic", "--set", "workload.num_requests=12"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    names = ("busy_chat", "shared_prompts", "long_prompts", "validate_h100")
    for name in names:
        doc = json.loads((out / f"{name}-validation.json").read_text())
        assert doc["scenario"] == name and doc["records"] and (out / "runs" / name / "summary.json").exists()
    table = (out / "validation.md").read_text()
    assert all(f"| {n} |" in table for n in names) and "scenarios within the 5% target" in table
    assert subprocess.run([sys.executable, str(ROOT / "benchmarks/validate_gpu.py"), "--out", str(out)],
                          capture_output=True, text=True).returncode != 0  # never into an existing folder


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("scenarios/**/*.toml")))
def test_shipped_triton_scenarios_pass_the_engines_checks(path):
    """The GPU validation runs must not stop on a setting the triton engine refuses (checked without a GPU)."""
    from kvsim.backends.triton_engine.backend import _check_scenario
    from kvsim.scenario.catalog import model_spec

    sc = kvsim.load_scenario(ROOT / path)
    if sc.backend.name == "triton":
        _check_scenario(sc, model_spec(sc))
