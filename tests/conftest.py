"""Shared test helpers: small requests, sequences and scenarios.

TRITON_INTERPRET must be set before anything imports triton, whatever order pytest collects the
test files in, so it is set here, before any test module is imported.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

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
