"""Measured serving runs as cases to simulate: what ran, what it measured, and the same figures from kvsim.

A `ServingCase` is one measured run (a `vllm bench serve --save-result` JSON, or one load stage of an
llm-d inference-perf result folder) with the scenario that reproduces it: the user's scenario for the
server (model, GPUs, engine) and, for inference-perf, the workload the folder says it sent
(kvsim.calibrate.inference_perf). `simulate_case(case, terms)` runs it with server terms `terms`
(kvsim.perf.server.ServerTerms, through a `backend.server_terms` file as a user's run reads them) and
returns the figures the benchmark reports, stated as that benchmark states them: (metric, stat) ->
seconds, metric in ttft, tpot, itl, e2e and stat in mean, p50, p90, p99.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.perf.basis import pricing_basis
from kvsim.results.metrics import Metrics
from kvsim.scenario.catalog import gpu_spec, model_spec
from kvsim.scenario.limits import MAX_DURATION_S

STATS = ("mean", "p50", "p90", "p99")
# vllm bench serve's figures: key -> (metric, stat)
BENCH_KEYS = {f"{s}_{m}_ms": (name, stat) for m, name in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"),
                                                          ("e2el", "e2e"))
              for s, stat in (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99"))}


@dataclass(slots=True)
class ServingCase:
    """One measured run and the scenario that reproduces it. `timing`: how the tool counted TPOT and
    ITL (kvsim.calibrate.inference_perf.StreamTiming, with `output_tokens` each request generated), or
    None for a request's own (E2E - TTFT) / (tokens - 1) and the gaps between its tokens (vllm bench)."""

    name: str
    group: str  # cases of one group (an experiment) are held out together
    scenario: object  # kvsim.scenario.config.Scenario
    measured: dict  # (metric, stat) -> seconds
    timing: object = None
    output_tokens: int = 0
    rate: float = 0.0  # requests per second offered (0: a closed loop or unknown)
    notes: list = field(default_factory=list)


@dataclass(slots=True)
class CaseOutcome:
    figures: dict  # (metric, stat) -> seconds, as the case's tool states them
    overloaded: bool  # the engine fell behind the arrivals (kvsim.results.verdict)
    prefix_hit_rate: float
    num_blocks: int
    summary: dict


def simulate_scenario(scenario):
    """(Metrics, summary) of the scenario's first policy: no results folder, one time-series bucket."""
    from kvsim.perf.measured import request_overhead_s
    from kvsim.pipeline import simulate_policy

    model, gpu = model_spec(scenario), gpu_spec(scenario)
    policy = scenario.policies[0]
    basis = pricing_basis(scenario, model, gpu)
    metrics = Metrics(policy.name, scenario.slo, MAX_DURATION_S, None,
                      request_overhead_s=request_overhead_s(scenario, basis, gpu))
    summary, _ = simulate_policy(scenario, policy, model, gpu, metrics, None, basis)
    return metrics, summary


def with_terms(scenario, terms_path: Optional[Path], max_requests: Optional[int] = None):
    """The scenario priced with the server terms in `terms_path` (None: as it is), its request count
    capped at `max_requests`."""
    update = {}
    if terms_path is not None:
        update["backend"] = scenario.backend.model_copy(update={"server_terms": str(terms_path)})
    wl = scenario.workload
    if max_requests is not None and (wl.num_requests is None or wl.num_requests > max_requests):
        update["workload"] = wl.model_copy(update={"num_requests": max_requests})
    if not update:
        return scenario
    return scenario.model_copy(update=update).located(scenario.source, scenario.base_dir)


def write_terms(path: Path, terms, provenance: Optional[dict] = None) -> None:
    Path(path).write_text(json.dumps({"terms": terms.to_dict(), "provenance": provenance or {}}))


def simulate_case(case: ServingCase, terms=None, max_requests: Optional[int] = None) -> CaseOutcome:
    """The case simulated with server terms `terms` (None: the scenario's own)."""
    with tempfile.TemporaryDirectory(prefix="kvsim-terms-") as folder:
        path = None
        if terms is not None:
            path = Path(folder) / "server_terms.json"
            write_terms(path, terms)
        metrics, summary = simulate_scenario(with_terms(case.scenario, path, max_requests))
    figures = case_figures(metrics.latencies(), metrics.itl, case)
    return CaseOutcome(figures, not summary["verdict"]["stable"], summary.get("prefix_hit_rate") or 0.0,
                       summary["kv"]["num_blocks"], summary)


def _stat(values: np.ndarray, stat: str) -> float:
    if not len(values):
        return math.nan
    return float(np.mean(values)) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def case_figures(latencies: dict, token_gaps, case: ServingCase) -> dict:
    """A simulation's figures as the case's tool states them (kvsim.calibrate.inference_perf for a
    stream counted by lines); vllm bench's: TPOT per request over its own tokens, ITL the token gaps."""
    from kvsim.calibrate.inference_perf import predicted_figures

    if case.timing is not None:
        return predicted_figures(latencies, token_gaps, case.output_tokens, case.timing)
    out = {}
    for stat in STATS:
        out["ttft", stat] = _stat(latencies["ttft_s"], stat)
        out["e2e", stat] = _stat(latencies["e2e_s"], stat)
        out["tpot", stat] = _stat(latencies["mean_itl_s"], stat)
        if stat == "mean":
            itl = token_gaps.stats().get("mean")
        else:
            itl = token_gaps.percentile(float(stat[1:]))
        if itl is not None:
            out["itl", stat] = float(itl)
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def relative_errors(predicted: dict, measured: dict) -> dict:
    """(metric, stat) -> predicted / measured - 1 over the figures both hold."""
    return {k: predicted[k] / measured[k] - 1 for k in measured if k in predicted and measured[k] > 0
            and math.isfinite(predicted[k])}


# ---- reading measured runs into cases ----------------------------------------------------------
def inference_perf_cases(scenario, folder: Path, group: Optional[str] = None, seed: int = 0) -> list[ServingCase]:
    """One case per load stage of an inference-perf result folder, the scenario's server (model,
    hardware, engine, first policy) sent the workload the folder says it ran."""
    from kvsim.calibrate.inference_perf import read_run
    from kvsim.scenario.config import scenario_from_dict

    run = read_run(folder)
    timing = run.timing
    base = scenario.model_dump(mode="json", exclude_none=True, exclude={"workload", "output"})
    base["policies"] = base["policies"][:1]
    cases = []
    for stage in run.stages:
        data = {**base, "workload": run.workload(stage, seed)}
        sc = scenario_from_dict(data, f"{folder} stage {stage.index}", scenario.base_dir)
        measured = {k: v for k, v in stage.measured.items() if timing is not None or k[0] in ("ttft", "e2e")}
        case = ServingCase(f"{Path(folder).name} stage {stage.index} ({stage.rate:g} req/s)", group or str(folder),
                           sc, measured, timing, run.output_len, stage.rate, list(run.notes))
        if timing is None:
            case.notes.append("TPOT and ITL not compared: the stream's counting could not be told from the figures")
        cases.append(case)
    return cases


def bench_case(scenario, result: Path, group: Optional[str] = None) -> ServingCase:
    """A `vllm bench serve --save-result` JSON and the scenario it ran (checked: same workload)."""
    from kvsim.calibrate.tables import check_bench_workload
    from kvsim.scenario.files import parse_json, read_text

    data = parse_json(read_text(result, "vllm bench serve result"), str(result))
    from kvsim.calibrate.tables import bench_result

    bench = bench_result(data, result)
    check_bench_workload(bench, scenario)
    measured = {}
    for key, (metric, stat) in BENCH_KEYS.items():
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            measured[metric, stat] = float(value) / 1e3
    if not measured:
        raise KvsimError(f"{result}: no latency figures (mean/median/p99 ttft, tpot, itl, e2el in ms)")
    arrival = scenario.workload.arrival
    return ServingCase(Path(result).name, group or str(result), scenario, measured, None, 0,
                       arrival.rate if arrival.process not in ("trace", "immediate") else 0.0)


def is_inference_perf(path: Path) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / "config.yaml").is_file() or (p / "results" / "config.yaml").is_file())

