"""The command line: one-line errors with exit code 2 and nothing left behind, schema, memory, a good run."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

GOOD = """\
name = "tiny"
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100-SXM"
[engine]
max_model_len = 4096
{engine}
[[policies]]
name = "paged"
[[policies]]
name = "contiguous"
allocator = "contiguous"
enable_chunked_prefill = false
[workload]
seed = 5
num_requests = 40
arrival = {{ process = "poisson", rate = {rate} }}
prompt_len = {{ dist = "uniform", min = 50, max = 500 }}
output_len = {{ dist = "uniform", min = 5, max = 60 }}
{workload}
"""


def write_scenario(folder: Path, name="s.toml", *, engine="", rate="20.0", workload="", text=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text if text is not None else GOOD.format(engine=engine, rate=rate, workload=workload))
    return path


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *names):
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvsim: error: ")
    assert "Traceback" not in err
    for name in names:
        assert name in lines[0], (name, lines[0])


def trace_workload(path: Path) -> str:
    return (f'[workload.trace]\nformat = "csv"\npath = "{path.name}"\n')


BAD_CASES = {
    "unknown key": dict(engine="max_num_seqz = 4", names=("s.toml", "engine.max_num_seqz", "unknown key")),
    "wrong type": dict(engine='max_num_seqs = "many"', names=("s.toml", "engine.max_num_seqs")),
    "negative rate": dict(rate="-2.0", names=("s.toml", "workload.arrival.rate")),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_scenario_values(tmp_path, capsys, case):
    spec = dict(BAD_CASES[case])
    names = spec.pop("names")
    scenario = write_scenario(tmp_path / "in", **spec)
    out_dir = tmp_path / "out" / "res"
    code, _, err = run_cli(capsys, scenario, "--out", out_dir, "--quiet")
    assert_one_line_error(code, err, *names)
    assert not (tmp_path / "out").exists()


def _assert_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())


def test_missing_trace_file(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in", workload=trace_workload(Path("absent.csv")))
    code, _, err = run_cli(capsys, scenario, "--out", tmp_path / "out" / "res", "--quiet")
    assert_one_line_error(code, err, "absent.csv", "workload.trace.path")
    _assert_nothing_written(tmp_path)


def test_malformed_trace_row_names_the_line(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    trace = folder / "bad.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,12.5,4\n1.0,10,5\n")
    scenario = write_scenario(folder, workload=trace_workload(trace))
    code, _, err = run_cli(capsys, scenario, "--out", tmp_path / "out" / "res", "--quiet")
    assert_one_line_error(code, err, "bad.csv:3")
    _assert_nothing_written(tmp_path)


def test_model_too_large_for_the_gpu(tmp_path, capsys):
    text = GOOD.format(engine="", rate="1.0", workload="").replace("Llama-3.1-8B", "Llama-3.1-70B")
    scenario = write_scenario(tmp_path / "in", text=text)
    code, _, err = run_cli(capsys, scenario, "--out", tmp_path / "out" / "res", "--quiet")
    assert_one_line_error(code, err, "s.toml", "Llama-3.1-70B", "tensor_parallel_size")
    _assert_nothing_written(tmp_path)


def test_unknown_policy_name(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in")
    code, _, err = run_cli(capsys, scenario, "--policy", "paged", "--policy", "pagd", "--out",
                           tmp_path / "out" / "res", "--quiet")
    assert_one_line_error(code, err, "--policy", "pagd")
    _assert_nothing_written(tmp_path)


def test_missing_scenario_file(tmp_path, capsys):
    code, _, err = run_cli(capsys, tmp_path / "nowhere.toml", "--out", tmp_path / "out" / "res")
    assert_one_line_error(code, err, "nowhere.toml")
    _assert_nothing_written(tmp_path)


def test_invalid_toml_names_the_file(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in", text="[model\nname = 1\n")
    code, _, err = run_cli(capsys, scenario, "--out", tmp_path / "out" / "res")
    assert_one_line_error(code, err, "s.toml")
    _assert_nothing_written(tmp_path)


def test_schema_is_json_with_policies(capsys):
    code, out, _ = run_cli(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert "policies" in schema["properties"]
    assert "workload" in schema["required"]


def test_memory_prints_the_capacity_breakdown(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in")
    code, out, err = run_cli(capsys, "memory", scenario)
    assert code == 0 and err == ""
    assert "KV" in out
    # Llama-3.1-8B, bf16: 2 (K, V) * 32 layers * 8 KV heads * 128 dims * 2 bytes = 128 KiB a token,
    # 16 tokens a block
    assert f"{2 * 32 * 8 * 128 * 2 * 16:,}" in out
    assert not (tmp_path / "results").exists()


def test_good_run_writes_the_results_folder(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in")
    out_dir = tmp_path / "out" / "res"
    code, out, err = run_cli(capsys, scenario, "--out", out_dir)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == [".kvsim-results.json", "report.html", "requests.csv",
                                                         "summary.json", "timeseries.csv"]
    assert [p.name for p in out_dir.parent.iterdir()] == ["res"]  # no temp folder left beside it
    assert "paged" in out and "contiguous" in out  # the comparison table
    summary = json.loads((out_dir / "summary.json").read_text())
    assert set(summary["policies"]) == {"paged", "contiguous"}
    with open(out_dir / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    keys = sorted((r["policy"], int(r["request_id"])) for r in rows)
    assert keys == sorted((p, i) for p in ("paged", "contiguous") for i in range(40))
    for policy, s in summary["policies"].items():
        mine = [r for r in rows if r["policy"] == policy]
        assert sum(r["status"] == "finished" for r in mine) == s["requests"]["finished"]
    with open(out_dir / "timeseries.csv", newline="") as f:
        series = list(csv.DictReader(f))
    assert {r["policy"] for r in series} == {"paged", "contiguous"}
    page = (out_dir / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "contiguous" in page


def test_policy_flag_runs_only_that_policy(tmp_path, capsys):
    scenario = write_scenario(tmp_path / "in")
    out_dir = tmp_path / "res"
    code, _, err = run_cli(capsys, scenario, "--policy", "contiguous", "--out", out_dir, "--quiet")
    assert code == 0, err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary["policies"]) == ["contiguous"]


def test_report_html_false_writes_no_report(tmp_path, capsys):
    text = GOOD.format(engine="", rate="20.0", workload="") + "[output]\nreport_html = false\n"
    scenario = write_scenario(tmp_path / "in", text=text)
    code, _, err = run_cli(capsys, scenario, "--out", tmp_path / "res", "--quiet")
    assert code == 0, err
    assert not (tmp_path / "res" / "report.html").exists()


def test_python_dash_m_entry_point(tmp_path):
    bad = write_scenario(tmp_path / "in", "bad.toml", rate="-1.0")
    good = write_scenario(tmp_path / "in", "good.toml")
    cmd = [sys.executable, "-m", "kvsim"]
    proc = subprocess.run(cmd + [str(bad), "--out", str(tmp_path / "out" / "bad")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, "bad.toml", "workload.arrival.rate")
    assert not (tmp_path / "out").exists()
    proc = subprocess.run(cmd + ["run", str(good), "--out", str(tmp_path / "out" / "good"), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "good" / "summary.json").is_file()


def test_plan_disaggregated_without_a_disaggregation_section_is_one_line(capsys):
    """`plan --target-rate R --disaggregated` on a scenario with no pools or link was an internal error
    (AttributeError in at_load); it is bad input naming the flag, and nothing is simulated."""
    code, _, err = run_cli(capsys, "plan", ROOT / "scenarios" / "chat.toml", "--target-rate", "14", "--disaggregated")
    assert_one_line_error(code, err, "--disaggregated", "[disaggregation]")
