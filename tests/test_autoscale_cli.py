"""A day of traffic from the command line as users run it: `kvsim run` on an autoscaled day (the
deployment line, the autoscaler's lines in the terminal and the report, throughput over the window
replayed), `kvsim plan`'s autoscaling flags misused, and sections that cannot go together: one line,
exit 2, nothing written."""

import json
from html import escape
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]
DAY = """
[model]
name = "Llama-3.1-8B"
[[policies]]
name = "paged"
[workload]
seed = 1
start_s = 120
duration_s = 480
arrival = { process = "poisson", curve = { points = [[0, 2], [240, 10], [480, 2]] } }
prompt_len = { dist = "lognormal", mean = 800, sigma = 0.6, max = 4000 }
output_len = { dist = "lognormal", mean = 150, sigma = 0.6, max = 800 }
[slo]
ttft_ms = 800
tpot_ms = 25
percentile = 95
[autoscaling]
policy = "hpa"
min_replicas = 1
max_replicas = 3
window_s = 120
[autoscaling.hpa]
metric = "num_requests_running"
target = 4
"""


def test_kvsim_run_on_an_autoscaled_day_says_what_the_autoscaler_did(tmp_path):
    """The terminal's (piped) lines: the pool as the autoscaler runs it, then per policy its replicas,
    attainment and bill, each figure as summary.json has it; report.html opens with the same lines;
    a window of the day (start_s 120 to 480) is measured over its own 360 s, not from 0."""
    toml = tmp_path / "day.toml"
    toml.write_text(DAY)
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "kvsim", "run", str(toml), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "summary.json").read_text())
    s = doc["policies"]["paged"]
    a = s["autoscaling"]
    assert doc["meta"]["autoscaling"] == {"policy": "hpa", "min_replicas": 1, "max_replicas": 3}
    first = proc.stdout.splitlines()[0]
    assert first.startswith("Llama-3.1-8B on H100-SXM TP 1 replicas (1 GPU each), 1 to 3 under a Kubernetes HPA; ")
    reps = a["replicas"]
    lines = [f"paged: a Kubernetes HPA on num_requests_running (target 4): {reps['min']}-{reps['peak']} replicas, "
             f"{reps['mean']:.1f} on average, {reps['created'] - 1} added, {reps['scale_decisions']} scale decisions; "
             f"a replica serves {a['startup']['total_s']:.0f} s after it is asked for",
             f"paged: SLO attainment {a['attainment']:.2%} of requests (target 95.00%); "
             f"{a['windows_meeting_target']} of 3 windows of 120 s (hours 0.03-0.13) meet it",
             f"paged: {a['replica_hours']:,.1f} replica-hours = {a['gpu_hours']:,.1f} GPU-hours, ${a['usd']:,.2f} at "
             f"${a['usd_per_gpu_hour']:g} a GPU-hour, ${a['usd_per_m_tokens']:,.2f} per million tokens"]
    for line in lines:
        assert line in proc.stdout.splitlines(), (line, proc.stdout)
    html = (out / "report.html").read_text()
    assert all(escape(line) in html for line in lines), "report.html opens with the terminal's lines"
    assert a["attainment"] == s["slo_attainment"] and a["num_windows"] == 3 and reps["peak"] > 1
    assert a["replica_hours"] == a["gpu_hours"]  # TP 1: a GPU a replica
    finished = s["requests"]["finished"]
    assert s["duration_s"] < 480 and s["duration_s"] > 360 - 1  # from 120 s to the last finish
    assert s["throughput"]["requests_per_s"] == pytest.approx(finished / s["duration_s"])
    assert finished / s["duration_s"] > 3  # the window's ~6 req/s, not diluted over its first 120 s


@pytest.mark.parametrize("argv,names", [
    (["--grid", "autoscaling.hpa.target=8,32"], ("--grid", "--autoscale")),
    (["--attainment", "0.9"], ("--attainment", "--autoscale")),
    (["--autoscale", "--target-rate", "5"], ("--autoscale", "--target-rate")),
    (["--autoscale", "--policy", "paged", "--policy", "paged"], ("--autoscale", "--policy")),
    (["--autoscale", "--grid", "hpa.target=8"], ("--grid hpa.target", "autoscaling.")),
    (["--autoscale", "--grid", "autoscaling.hpa.nope=1"], ("day.toml", "autoscaling.hpa.nope")),
    (["--autoscale", "--grid", "autoscaling.min_replicas=5"], ("day.toml", "min_replicas (5)", "max_replicas (3)")),
])
def test_plan_autoscale_misused_is_one_line_and_writes_nothing(tmp_path, capsys, argv, names):
    toml = tmp_path / "day.toml"
    toml.write_text(DAY)
    code, out, err = run_cli(capsys, "plan", toml, "--quiet", "--out", tmp_path / "plan", *argv)
    assert_one_line_error(code, err, *names)
    assert out == "" and not (tmp_path / "plan").exists()


def test_plan_autoscale_without_an_autoscaling_section(tmp_path, capsys):
    toml = tmp_path / "day.toml"
    toml.write_text(DAY.split("[autoscaling]")[0])
    code, out, err = run_cli(capsys, "plan", toml, "--autoscale", "--quiet")
    assert_one_line_error(code, err, "day.toml", "[autoscaling]")


@pytest.mark.parametrize("extra,names", [
    ("[kv_offload]\nkv_offloading_size = 8\n", ("autoscaling", "KV offload")),
    ("[hardware]\nnum_replicas = 2\n", ("hardware.num_replicas", "autoscaling.initial_replicas")),
])
def test_sections_an_autoscaled_pool_cannot_have(tmp_path, capsys, extra, names):
    toml = tmp_path / "day.toml"
    toml.write_text(extra + DAY)
    code, out, err = run_cli(capsys, "run", toml, "--quiet", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "day.toml", *names)
    assert not (tmp_path / "o").exists()
