"""Energy (kvsim.perf.energy, kvsim.results.energy): the power model's arithmetic, the meter's figures,
fused runs against step by step, and bad input."""

import pytest
from conftest import make_scenario

from kvsim.backends.analytic import AnalyticBackend
from kvsim.perf.energy import GPU_POWER, EnergyModel, StepWork, energy_model
from kvsim.pipeline import run_scenario
from kvsim.scenario.catalog import gpu_spec, model_spec


def test_a_steps_joules_follow_its_utilisation_up_to_the_limit():
    p = GPU_POWER["H100-SXM"]
    m = EnergyModel(p, 700.0, 350.0, 1.5, 0.1, peak_flops=1e15, bandwidth=3e12)
    # 10 ms moving 15 GB (half the bandwidth) and 2.5 PFLOP-ms (a quarter of the peak)
    j = m.step_joules(0.01, 2.5e12, 1.5e10)
    assert j == pytest.approx((p.idle_w + p.active_w + 0.5 * p.memory_w + 0.25 * p.compute_w) * 0.01)
    assert m.step_joules(0.01, 1e13, 3e10) == pytest.approx(7.0)  # above the limit: 700 W
    assert m.step_joules(0.0, 1e12, 1e9) == 0.0


def test_a_runs_energy_figures_add_up():
    sc = make_scenario(energy={"pue": 1.3, "usd_per_kwh": 0.1}, policies=[{"name": "paged"}])
    s = run_scenario(sc, write=False).summaries["paged"]
    e = s["energy"]
    assert e["gpu_joules"] == pytest.approx(e["gpu_busy_joules"] + e["gpu_idle_joules"])
    assert e["host_joules"] == pytest.approx(350.0 * s["duration_s"])
    assert e["facility_joules"] == pytest.approx(1.3 * (e["gpu_joules"] + e["host_joules"]))
    assert e["kwh"] == pytest.approx(e["facility_joules"] / 3.6e6)
    tokens = s["throughput"]["output_tokens_per_s"] * s["duration_s"]
    assert e["joules_per_output_token"] == pytest.approx(e["facility_joules"] / tokens)
    assert e["energy_usd_per_million_output_tokens"] == pytest.approx(e["kwh"] * 0.1 * 1e6 / tokens)
    assert e["gpu_hour_usd_per_million_output_tokens"] == pytest.approx(2.99 * s["duration_s"] / 3600 * 1e6 / tokens)
    assert 70.0 < e["mean_gpu_power_w"] < 700.0
    assert e["gpu_idle_joules"] > 0  # a light load leaves the engine idle between requests
    assert "energy" not in run_scenario(make_scenario(), write=False).summaries["paged"]


@pytest.mark.parametrize("spec", [None, {"method": "eagle3", "num_speculative_tokens": 3}])
def test_fused_runs_draw_what_their_steps_do(monkeypatch, spec):
    extra = {"speculative": spec} if spec else {}
    sc = make_scenario(energy={}, **extra)
    fused = run_scenario(sc, write=False).summaries["paged"]["energy"]
    monkeypatch.setattr(AnalyticBackend, "fuses_decode_runs", False)
    plain = run_scenario(sc, write=False).summaries["paged"]["energy"]
    for key in ("gpu_joules", "gpu_busy_joules", "busy_hbm_utilization", "busy_compute_utilization"):
        assert fused[key] == pytest.approx(plain[key], rel=1e-6), key


def test_step_work_counts_weights_once_a_step_and_kv_per_key():
    sc = make_scenario()
    model = model_spec(sc)
    w = StepWork(model, 1, "auto")
    f1, b1 = w.step(rows=64, sampled=64, pairs=64 * 1000, keys=64 * 1000)
    f2, b2 = w.step(rows=128, sampled=128, pairs=128 * 1000, keys=128 * 1000, steps=2)
    assert f2 == pytest.approx(2 * f1) and b2 == pytest.approx(2 * b1)
    assert w.weights == pytest.approx(model.weight_bytes - 2 * model.vocab_size * model.hidden_size, rel=0.01)
    assert w.kv_per_key == 32 * 2 * 8 * 128 * 2  # layers x K,V x KV heads x head_dim x 2 bytes


def test_an_idle_draw_at_the_limit_is_refused():
    from kvsim.errors import KvsimError

    sc = make_scenario(energy={"gpu_idle_w": 300.0, "gpu_max_w": 250.0})
    with pytest.raises(KvsimError, match="energy.gpu_idle_w: an idle draw of 300 W leaves nothing"):
        energy_model(sc, gpu_spec(sc), model_spec(sc))
