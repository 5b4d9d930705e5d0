"""The step-pricing Protocol (kvsim.perf.pricing): the searches derived by bisection answer as
StepModel's closed forms do, and a pricer with only `step_time` and `decode_run_time` drives whole
simulations, fused decode runs included, to StepModel's results."""

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from kvsim.backends.analytic import AnalyticBackend
from kvsim.batch import Batch, DecodeShape
from kvsim.perf.calibration import Calibration
from kvsim.perf.pricing import DecodeRunPrice, RunPricer, RunSearch, StepPricer, run_within, steps_within
from kvsim.perf.roofline import StepModel
from kvsim.pipeline import run_scenario
from kvsim.scenario.catalog import GPUS, MODELS

from conftest import make_scenario

LLAMA8, H100 = MODELS["Llama-3.1-8B"], GPUS["H100-SXM"]
KEY = replace(Calibration(), decode_key_s=2.6e-8)  # the serial term on: regimes change inside runs


class StepByStep(RunSearch):
    """A pricer written as a measured-kernel pricer would be: each step priced alone, a run summed
    step by step, the searches inherited (bisection)."""

    def __init__(self, model: StepModel):
        self.model = model

    def step_time(self, batch: Batch) -> float:
        return self.model.step_time(batch)

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        n, read, longest = shape[:3]  # a dense model: no windowed reads
        return sum(self.model.step_time(Batch(num_decode_seqs=n, decode_context_tokens=read + i * n,
                                              decode_max_context=longest + i if longest else 0))
                   for i in range(k))


@st.composite
def shapes(draw):
    n = draw(st.integers(1, 300))
    per_seq = draw(st.integers(1, 6000))
    longest = draw(st.sampled_from([0, per_seq, 4 * per_seq]))
    return DecodeShape(n, n * per_seq, longest)


@settings(max_examples=60, deadline=None)
@given(cal=st.sampled_from([Calibration(), KEY]), shape=shapes(), max_steps=st.integers(1, 120),
       budget=st.floats(1e-4, 1.0) | st.just(math.inf))
def test_bisection_searches_answer_as_the_closed_forms(cal, shape, max_steps, budget):
    closed = StepModel(LLAMA8, H100, 1, "auto", cal)
    searched = StepByStep(closed)
    assert isinstance(searched, RunPricer) and isinstance(closed, RunPricer)
    k, seconds, first = run_within(searched, shape, max_steps, budget)
    ck, cseconds, cfirst = closed.decode_run_within(shape, max_steps, budget)
    # the same k, unless the budget falls within rounding of a run's end
    assert k == ck or closed.decode_run_time(shape, min(k, ck)) == pytest.approx(budget, rel=1e-9)
    assert seconds == pytest.approx(closed.decode_run_time(shape, k), rel=1e-9)
    assert first == pytest.approx(cfirst, rel=1e-12) and first == closed.step_time(
        Batch(num_decode_seqs=shape.num_seqs, decode_context_tokens=shape.read_tokens,
              decode_max_context=shape.longest))
    assert k == max_steps or seconds >= budget
    if math.isfinite(budget):
        within = steps_within(searched, shape, budget)
        assert searched.decode_run_time(shape, within) >= budget
        assert within == 1 or searched.decode_run_time(shape, within - 1) < budget
        assert searched.decode_steps_within(shape, budget) == within


def test_run_price_is_a_record():
    price = run_within(StepByStep(StepModel(LLAMA8, H100, 1, "auto", Calibration())), DecodeShape(8, 800), 5)
    assert isinstance(price, DecodeRunPrice) and price.steps == 5 and price.seconds > 4 * price.first_s


def test_a_two_method_pricer_drives_a_simulation_to_step_models_results(monkeypatch):
    """Plugged into the analytic backend, a pricer that only prices steps (and sums them for runs)
    gives the closed forms' results: the same requests, steps and figures (to rounding)."""
    sc = make_scenario(hardware={"memory_gib": 20.0}, backend={"calibration": "triton"},
                       workload={"num_requests": 60, "arrival": {"rate": 20.0}})
    closed = run_scenario(sc, write=False).summaries["paged"]
    init = AnalyticBackend.__init__

    def with_step_by_step(self, *args):
        init(self, *args)
        self.pricer = StepByStep(self.pricer)
        self.execute, self.decode_run, self.decode_run_time = (
            self.pricer.step_time, self.pricer.decode_run_within, self.pricer.decode_run_time)

    monkeypatch.setattr(AnalyticBackend, "__init__", with_step_by_step)
    searched = run_scenario(sc, write=False).summaries["paged"]
    assert isinstance(StepByStep(None), StepPricer)
    for key in ("engine_steps", "preemptions", "requests"):
        assert searched[key] == closed[key], key
    for key in ("ttft_s", "e2e_s", "itl_s"):
        for stat, value in closed[key].items():
            assert searched[key][stat] == pytest.approx(value, rel=1e-9), (key, stat)
    assert searched["kv"]["mean_used_fraction"] == pytest.approx(closed["kv"]["mean_used_fraction"], rel=1e-9)
