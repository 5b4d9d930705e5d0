"""Shared test helpers: small requests, sequences and scenarios.

TRITON_INTERPRET must be set before anything imports triton, whatever order pytest collects the
test files in, so it is set here, before any test module is imported.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KVSIM_CACHE_DIR", "off")  # no answers kept on disk between tests (tests/test_answer_cache.py)

import copy  # noqa: E402

import numpy as np  # noqa: E402

from kvsim.scenario.config import scenario_from_dict  # noqa: E402
from kvsim.sequence import Request, Sequence  # noqa: E402


def make_seq(rid: int, prompt_len: int, output_len: int = 8, tokens=None, arrival: float = 0.0) -> Sequence:
    """A fresh sequence; `tokens` (if given) is the shareable prompt content."""
    ids = None if tokens is None else np.asarray(tokens, dtype=np.int32)
    return Sequence(Request(rid, arrival, prompt_len, output_len, ids))


BASE_SCENARIO = {
    "name": "t",
    "model": {"name": "Llama-3.1-8B"},
    "hardware": {"gpu": "H100-SXM"},
    "engine": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
    "policies": [{"name": "paged"}],
    "workload": {"seed": 1, "num_requests": 100, "arrival": {"process": "poisson", "rate": 10.0},
                 "prompt_len": {"dist": "uniform", "min": 100, "max": 600},
                 "output_len": {"dist": "uniform", "min": 20, "max": 200}},
    "output": {"report_html": False},
}


def merge(base: dict, over: dict) -> dict:
    """`base` with `over` merged in (nested dicts merged key by key; other values replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def scenario_dict(**sections) -> dict:
    """BASE_SCENARIO with sections overridden, e.g. scenario_dict(engine={"block_size": 32})."""
    return merge(BASE_SCENARIO, sections)


def make_scenario(**sections):
    return scenario_from_dict(scenario_dict(**sections))


def per_request(monkeypatch, scenario) -> tuple[dict, dict]:
    """Run `scenario`: every finished request's (TTFT, E2E, outputs, preemptions, cached tokens) by
    (policy, id), and the summaries with each policy's time-series rows (`timeseries`)."""
    from kvsim.pipeline import run_scenario
    from kvsim.results.metrics import Metrics

    rows, series = {}, {}
    on_finish, summary = Metrics.on_finish, Metrics.summary

    def spy(self, seq):
        arrival = seq.request.arrival_time
        rows[(self.policy, seq.seq_id)] = (seq.first_token_time - arrival, seq.finish_time - arrival,
                                           seq.num_output_tokens, seq.num_preemptions, seq.num_cached_tokens)
        on_finish(self, seq)

    def keep(self, **kw):  # the time series of each policy, beside its summary
        series[self.policy] = self.timeseries_rows()
        return summary(self, **kw)

    monkeypatch.setattr(Metrics, "on_finish", spy)
    monkeypatch.setattr(Metrics, "summary", keep)
    summaries = run_scenario(scenario, write=False).summaries
    for name, s in summaries.items():
        s["timeseries"] = series[name]
    return rows, summaries


def assert_same_requests(fused: dict, plain: dict) -> None:
    """Fused decode runs gave every request what step-by-step scheduling did: counts exact, times to rounding."""
    import pytest

    assert fused.keys() == plain.keys() and fused
    for key, (ttft, e2e, *counts) in plain.items():
        f_ttft, f_e2e, *f_counts = fused[key]
        assert f_counts == counts, key
        assert f_ttft == pytest.approx(ttft, rel=1e-9, abs=1e-12), key
        assert f_e2e == pytest.approx(e2e, rel=1e-9, abs=1e-12), key
