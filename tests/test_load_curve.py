"""Time-varying arrivals (kvsim.scenario.load_curve) and the [autoscaling] section's bad input: one
line naming the key, exit code 2."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.errors import KvsimError
from kvsim.scenario.load_curve import RateCurveConfig, rate_curve
from kvsim.scenario.workload import arrival_window, expected_count, generate_requests

from conftest import make_scenario, scenario_dict

ROOT = Path(__file__).resolve().parents[1]


def curve_scenario(curve: dict, process: str = "poisson", **workload):
    return make_scenario(workload={"arrival": {"process": process, "rate": None, "curve": curve}, "num_requests": None,
                                   **workload})


@settings(max_examples=50, deadline=None)
@given(rates=st.lists(st.floats(0.0, 50.0), min_size=2, max_size=8), step=st.booleans(), u=st.floats(0.0, 1.0))
def test_the_cumulative_rate_inverts(rates, step, u):
    if sum(rates[:-1]) == 0:  # a step curve ends at its last point: its rate is never used
        rates[0] = 1.0
    points = [[100.0 * i, r] for i, r in enumerate(rates)]
    curve = rate_curve(RateCurveConfig(points=points, interpolation="step" if step else "linear"))
    target = u * curve.total
    t = float(curve.invert(np.array([target]))[0])
    assert 0.0 <= t <= curve.end_s
    assert float(curve.cumulative(t)) == pytest.approx(target, rel=1e-9, abs=1e-7)


def test_deterministic_arrivals_follow_the_curve_exactly():
    """Deterministic gaps of 1 in operational time: the k-th arrival is where Λ(t) = k. A 2/s then
    4/s step: 2 arrivals a second for 10 s, then 4 a second."""
    sc = curve_scenario({"points": [[0, 2], [10, 4], [20, 4]], "interpolation": "step"}, "deterministic")
    times = [r.arrival_time for r in generate_requests(sc)]
    assert len(times) == 60 == expected_count(sc)
    assert times[:3] == pytest.approx([0.5, 1.0, 1.5]) and times[19] == pytest.approx(10.0)
    assert times[20] == pytest.approx(10.25) and times[-1] == pytest.approx(20.0)
    assert arrival_window(sc) == 20.0


def test_poisson_arrivals_per_window_match_the_curve():
    sc = curve_scenario({"points": [[0, 5], [1800, 40], [3600, 5]]}, seed=3)
    times = np.array([r.arrival_time for r in generate_requests(sc)])
    curve = rate_curve(sc.workload.arrival.curve)
    counts = np.histogram(times, bins=12, range=(0, 3600))[0]
    expected = curve.window_counts(300.0)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))  # Poisson: within 5 sigma
    assert len(times) == pytest.approx(curve.total, rel=0.02)


def test_a_diurnal_curve_with_a_burst():
    cfg = RateCurveConfig(shape="diurnal", min_rate=5, max_rate=35, peak_s=54000,
                          bursts=[{"start_s": 32400, "duration_s": 900, "factor": 2.0}])
    curve = rate_curve(cfg)
    assert curve.end_s == 86400 and curve.mean_rate == pytest.approx(20.0 + (curve.total - 20 * 86400) / 86400)
    assert float(curve.rate_at(54000.0)) == pytest.approx(35.0) and float(curve.rate_at(54000 - 43200)) == pytest.approx(5.0)
    base = float(rate_curve(RateCurveConfig(shape="diurnal", min_rate=5, max_rate=35, peak_s=54000)).rate_at(32800.0))
    assert float(curve.rate_at(32800.0)) == pytest.approx(2 * base, rel=1e-3)


def test_a_window_of_the_day_replays_the_same_requests():
    sc = curve_scenario({"points": [[0, 5], [600, 20], [1200, 5]]}, seed=1)
    day = [r for r in generate_requests(sc) if 300 <= r.arrival_time <= 700]
    win = list(generate_requests(curve_scenario({"points": [[0, 5], [600, 20], [1200, 5]]}, seed=1, start_s=300.0,
                                                duration_s=700.0)))
    assert win == day and win[0].request_id > 0


@pytest.mark.parametrize("workload,autoscaling,message", [
    ({"arrival": {"process": "poisson", "curve": {"points": []}}}, None,
     r"workload.arrival.curve.points: a rate table needs at least two \[seconds, rate\] points"),
    ({"arrival": {"process": "poisson", "curve": {"points": [[0, 1], [10, 2], [5, 3]]}}}, None,
     r"workload.arrival.curve.points: times must increase: point 2 \(5 s\) is not after point 1 \(10 s\)"),
    ({"arrival": {"process": "poisson", "curve": {"points": [[0, 0], [10, 0]]}}}, None,
     r"workload.arrival.curve: the curve's rate is 0 throughout"),
    ({"arrival": {"process": "poisson", "rate": 2.0, "curve": {"points": [[0, 1], [10, 2]]}}}, None,
     r"workload.arrival: give rate or curve, not both"),
    (None, {"policy": "hpa", "startup": {"container_start_s": -5}, "hpa": {"target": 2}},
     r"autoscaling.startup.container_start_s: must be at least 0, got -5"),
    (None, {"policy": "hpa", "min_replicas": 5, "max_replicas": 2, "hpa": {"target": 2}},
     r"autoscaling: min_replicas \(5\) must not exceed max_replicas \(2\)"),
    (None, {"policy": "hpa", "hpa": {"metric": "gpu_utilization", "target": 2}},
     r"autoscaling.hpa.metric: must be 'num_requests_waiting', 'num_requests_running', 'kv_cache_usage_perc' or "
     r"'gateway_queue_size'"),
    (None, {"policy": "hpa", "hpa": {"metric": "gateway_queue_size", "target": 2}},
     r"autoscaling: hpa.metric 'gateway_queue_size' is the gateway's, not a replica's"),
    (None, {"policy": "keda", "min_replicas": 0, "keda": {"metric": "num_requests_waiting", "threshold": 2}},
     r"autoscaling: keda.metric 'num_requests_waiting' is reported by replicas: with min_replicas = 0 none runs"),
    (None, {"policy": "wva", "min_replicas": 0}, r"autoscaling: min_replicas = 0 \(scale to zero\) is KEDA's"),
    (None, {"policy": "hpa"}, r"autoscaling: policy 'hpa' needs \[autoscaling.hpa\]"),
    (None, {"policy": "hpa", "hpa": {"target": 1}, "wva": {}}, r"autoscaling: \[autoscaling.wva\] is set but policy is 'hpa'"),
])
def test_bad_input_is_one_line_naming_the_key(workload, autoscaling, message):
    data = scenario_dict()
    if workload:
        data["workload"].update(workload)
        data["workload"].pop("num_requests", None)
    if autoscaling:
        data["autoscaling"] = autoscaling
    from kvsim.scenario.config import scenario_from_dict

    with pytest.raises(KvsimError, match=r"^<scenario>: " + message) as err:
        scenario_from_dict(data)
    assert "\n" not in str(err.value)


def test_bad_input_from_the_command_line_exits_2_with_one_line(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text('[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "p"\n[workload]\n'
                    'arrival = { process = "poisson", curve = { points = [[0, 1], [60, 5], [30, 2]] } }\n')
    proc = subprocess.run([sys.executable, "-m", "kvsim", "run", str(toml), "--quiet", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "workload.arrival.curve.points: times must increase" in proc.stderr
    assert not (tmp_path / "o").exists()
