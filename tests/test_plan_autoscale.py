"""plan --autoscale (kvsim.planning.autoscale): the lower bound against brute force on a small trace,
a fixed pool reproducing today's results byte for byte, and the command as users run it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.planning.autoscale import lower_bound, window_attainment, window_counts
from kvsim.planning.executors import InlineExecutor
from kvsim.pipeline import run_scenario
from kvsim.scenario.workload import generate_requests

from conftest import make_scenario

ROOT = Path(__file__).resolve().parents[1]
DAY = {"seed": 2, "num_requests": None, "duration_s": None,
       "arrival": {"process": "poisson", "rate": None, "curve": {"points": [[0, 2], [300, 14], [600, 4], [900, 9]]}},
       "prompt_len": {"dist": "lognormal", "mean": 1500, "sigma": 0.6, "max": 6000},
       "output_len": {"dist": "lognormal", "mean": 250, "sigma": 0.6, "max": 1000}}


def small_day(**autoscaling):
    return make_scenario(workload=DAY, slo={"ttft_ms": 600, "tpot_ms": 25, "percentile": 95},
                         autoscaling={"policy": "hpa", "min_replicas": 1, "max_replicas": 4, "window_s": 150,
                                      "hpa": {"metric": "num_requests_running", "target": 20}, **autoscaling})


def test_the_lower_bound_is_the_brute_force_fewest_replicas_per_window():
    """Per window, the search's answer is the first count of 1, 2, ... that meets the target when
    every count is simulated (and, on this trace, every count above it meets it too)."""
    sc = small_day()
    counts, start, span = window_counts(sc, 150.0)
    assert len(counts) == 6 and counts.sum() == len(list(generate_requests(sc)))
    searches = lower_bound(InlineExecutor(), sc, "paged", counts, 150.0, start, span, 0.95, 4, lambda: None)
    most = 4
    for s in searches:
        brute = {n: window_attainment(sc, "paged", s.start, s.end, n)[0] for n in range(1, most + 1)}
        passing = [n for n, a in brute.items() if a >= 0.95]
        first = passing[0] if passing else None
        assert s.replicas == first, (s.index, s.tried, brute)
        assert passing == list(range(first, most + 1)) if first else True  # monotone here
        for n, a in s.tried.items():
            assert a == brute[n]  # the same simulation, whoever runs it
    assert {s.replicas for s in searches} != {1}  # the trace needs more than one replica somewhere


def test_a_fixed_pool_reproduces_todays_results_byte_for_byte(tmp_path):
    """[autoscaling] policy = "fixed" with 3 replicas writes the requests and time series of
    hardware.num_replicas = 3 to the byte, and the same summary plus its autoscaling section."""
    base = dict(workload={"num_requests": 400, "arrival": {"process": "poisson", "rate": 12.0}})
    today = make_scenario(hardware={"num_replicas": 3}, **base)
    fixed = make_scenario(autoscaling={"policy": "fixed", "fixed": {"replicas": 3}, "window_s": 10.0}, **base)
    a = run_scenario(today, tmp_path / "today")
    b = run_scenario(fixed, tmp_path / "fixed")
    for name in ("requests.csv", "timeseries.csv"):
        assert (tmp_path / "today" / name).read_bytes() == (tmp_path / "fixed" / name).read_bytes()
    sa, sb = a.summaries["paged"], dict(b.summaries["paged"])
    auto = sb.pop("autoscaling")
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
    assert auto["replicas"]["peak"] == 3 and auto["attainment"] == sa["slo_attainment"]
    assert auto["replica_hours"] == pytest.approx(3 * auto["horizon_s"] / 3600)


def test_plan_autoscale_from_the_command_line(tmp_path):
    toml = tmp_path / "day.toml"
    toml.write_text("""
[model]
name = "Llama-3.1-8B"
[[policies]]
name = "paged"
[workload]
seed = 1
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
target = 16
""")
    out = tmp_path / "plan"
    proc = subprocess.run([sys.executable, "-m", "kvsim", "plan", str(toml), "--autoscale", "--workers", "2",
                           "--grid", "autoscaling.hpa.target=8,32", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "static pool at the peak" in proc.stdout and "lower bound" in proc.stdout
    doc = json.loads((out / "plan.json").read_text())
    assert len(doc["candidates"]) == 2 and doc["static"]["replicas"] >= 1 and doc["lower"]["replica_hours"] > 0
    assert {"plan.csv", "windows.csv", "autoscale.html"} <= {p.name for p in out.iterdir()}
    n, usd = doc["static"]["replicas"], doc["static"]["usd"]
    assert f"static pool at the peak: {n} replica{'s' if n != 1 else ''} all day: ${usd:,.2f} " in proc.stdout
    assert f"fewest replicas per 120 s window): ${doc['lower']['usd']:,.2f} " in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "kvsim", "plan", str(toml), "--autoscale", "--grid",
                          "autoscaling.hpa.target=-1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "autoscaling.hpa.target" in bad.stderr


def test_plan_autoscale_is_the_same_bytes_inline_on_a_pool_and_on_ray():
    """Every task is a pure function of its arguments and results are keyed by task: one worker, two
    worker processes and a local Ray give the same plan.json."""
    from kvsim.planning.autoscale import plan_autoscale
    from kvsim.planning.output import json_text

    sc = small_day()
    grid = ["autoscaling.hpa.target=10,40"]
    inline = json_text(plan_autoscale(sc, grid=grid, workers=1).to_dict())
    assert json.loads(inline)["static"]["replicas"] >= 1 and len(json.loads(inline)["candidates"]) == 2
    assert json_text(plan_autoscale(sc, grid=grid, workers=2).to_dict()) == inline
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, object_store_memory=200 << 20, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    try:
        assert json_text(plan_autoscale(sc, grid=grid, ray="local").to_dict()) == inline
    finally:
        ray.shutdown()
