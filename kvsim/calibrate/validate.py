"""`kvsim validate`: a scenario's analytic prediction against what a real engine measured.

The measured side is a kvsim results folder (its summary.json, from a run of the same scenario on the
`triton` backend), a `.zip` of one (read in place, checked as kvsim.scenario.archive says), or a
`vllm bench serve --save-result` JSON of the same workload (refused when its request count, lengths or
rate are not the scenario's: kvsim.calibrate.tables.check_bench_workload). The scenario is
simulated again with `backend = "analytic"`, calibrated as the scenario says or, when it says
nothing, with the shipped calibration of the engine that measured: kvsim's triton engine for a
results folder, vLLM for a bench result. Each figure becomes a plain record (figure, unit, measured,
predicted, error = predicted / measured - 1), so a table, a CSV or a dashboard page can show them.
"""

from __future__ import annotations

import math
import os
import stat
import statistics

from kvsim.calibrate.tables import bench_result, check_bench_workload
from kvsim.errors import KvsimError
from kvsim.scenario.archive import ZIP_MAGIC, read_zipped
from kvsim.scenario.files import decode_text, open_regular, parse_json, read_text, user_path

RESULT_FILE = "summary.json"

# (figure, unit, where kvsim's summary.json holds it, factor to the unit, vllm bench serve key)
FIGURES = (
    ("TTFT p50", "ms", ("ttft_s", "p50"), 1e3, "median_ttft_ms"),
    ("TTFT p99", "ms", ("ttft_s", "p99"), 1e3, "p99_ttft_ms"),
    ("ITL p50", "ms", ("itl_s", "p50"), 1e3, "median_itl_ms"),
    ("ITL p99", "ms", ("itl_s", "p99"), 1e3, "p99_itl_ms"),
    ("TPOT mean", "ms", ("tpot_s", "mean"), 1e3, "mean_tpot_ms"),
    ("E2E p50", "s", ("e2e_s", "p50"), 1.0, "median_e2el_ms"),
    ("E2E p99", "s", ("e2e_s", "p99"), 1.0, "p99_e2el_ms"),
    ("output tok/s", "tok/s", ("throughput", "output_tokens_per_s"), 1.0, "output_throughput"),
    ("KV blocks", "blocks", ("kv", "num_blocks"), 1.0, None),
    ("peak running", "seqs", ("peak_running",), 1.0, None),
)


def _pick(summary: dict, path: tuple):
    for key in path:
        if not isinstance(summary, dict) or key not in summary:
            return None
        summary = summary[key]
    return summary if isinstance(summary, (int, float)) and not isinstance(summary, bool) else None


def _measured_document(path):
    """(parsed JSON, its name in messages) of a results folder's summary.json, a zip of one, or a JSON file."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            path = path / RESULT_FILE
            os.stat(path)
    except FileNotFoundError:
        if path.name == RESULT_FILE:
            raise KvsimError(f"{path.parent}: no {RESULT_FILE} (a kvsim results folder, or give a vllm bench JSON)") \
                from None
        raise KvsimError(f"{path}: measured results not found") from None
    except ValueError:
        raise KvsimError(f"{str(path)!r}: measured results is not a valid path") from None
    except OSError as exc:
        raise KvsimError(f"{path}: cannot read measured results ({exc.strerror})") from None
    with open_regular(path, "measured results") as f:
        try:
            zipped = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
            f.seek(0)
        except OSError as exc:
            raise KvsimError(f"{path}: cannot read measured results ({exc.strerror})") from None
        if zipped:
            data, inner = read_zipped(f, RESULT_FILE, str(path))
            source = f"{path}:{inner}"
            return parse_json(decode_text(source, data, "measured results"), source), source
    return parse_json(read_text(path, "measured results"), str(path)), str(path)


def read_measured(path) -> tuple[str, dict[str, dict]]:
    """("kvsim", {policy: summary}) from a results folder, its summary.json or a zip of it, or ("vllm",
    {"": figures in kvsim's summary layout, "bench": the BenchResult}) from a vllm bench serve result."""
    data, source = _measured_document(user_path(path, "measured results"))
    if isinstance(data, dict) and isinstance(data.get("policies"), dict):
        for name, summary in data["policies"].items():
            if not isinstance(summary, dict):
                raise KvsimError(f"{source}: policies.{name}: expected an object (a policy's summary)")
        return "kvsim", {"scenario": data.get("scenario"), **data["policies"]}
    bench = bench_result(data, source)
    summary: dict = {}
    for _, _, where, factor, key in FIGURES:
        if key is not None and key in bench.figures:
            node = summary
            for k in where[:-1]:
                node = node.setdefault(k, {})
            node[where[-1]] = bench.figures[key]  # bench_result gives seconds and tok/s
    return "vllm", {"": summary, "bench": bench}


def predict(scenario, engine: str, policies=None) -> dict[str, dict]:
    """The analytic summaries of the scenario's policies, calibrated for `engine` unless the scenario
    names a calibration."""
    from kvsim.pipeline import run_scenario

    cal = scenario.backend.calibration or ("triton" if engine == "kvsim" else None)
    backend = scenario.backend.model_copy(update={"name": "analytic", "calibration": cal})
    sc = scenario.model_copy(update={"backend": backend})
    return run_scenario(sc, None, policies, write=False).summaries


def validate(scenario, measured, policies=None) -> list[dict]:
    """One record per policy and figure: {"policy", "kind", "figure", "unit", "measured", "predicted",
    "error"} (error = predicted / measured - 1; None where a side lacks the figure or measured is zero).
    kind "serving": the serving figures; kind "step": a triton run's steps by phase, measured in all
    beside their analytic price (when the run recorded them)."""
    if not hasattr(scenario, "policies"):
        from kvsim.scenario.config import load_scenario
        scenario = load_scenario(scenario)
    from kvsim.pipeline import chosen_policies

    chosen = [p.name for p in chosen_policies(scenario, policies)] if policies is not None else None
    engine, measured_by_policy = read_measured(measured)
    names = [p.name for p in scenario.policies]
    if engine == "kvsim":
        ran = measured_by_policy.pop("scenario")
        if ran is not None and ran != scenario.name:
            raise KvsimError(f"{measured}: measured scenario '{ran}', not '{scenario.name}' ({scenario.source})")
        missing = sorted(set(measured_by_policy) - set(names))
        if missing:
            raise KvsimError(f"{measured}: policy {missing[0]} is not in {scenario.source}")
        wanted = [p for p in names if p in measured_by_policy and (not chosen or p in chosen)]
    else:
        check_bench_workload(measured_by_policy["bench"], scenario)
        wanted = [chosen[0] if chosen else names[0]]
        measured_by_policy = {wanted[0]: measured_by_policy[""]}
    if not wanted:
        raise KvsimError(f"{measured}: none of the policies asked for was measured")
    predicted = predict(scenario, engine, wanted)
    records = []
    for policy in wanted:
        for figure, unit, where, factor, _ in FIGURES:
            m, p = _pick(measured_by_policy[policy], where), _pick(predicted[policy], where)
            if m is None and p is None:
                continue
            if m is not None and not 0 <= m < math.inf:
                raise KvsimError(f"{measured}: policies.{policy}.{'.'.join(where)}: a measured figure must be a "
                                 f"non-negative number, got {m}")
            m = None if m is None else m * factor
            p = None if p is None else p * factor
            records.append(_record(policy, "serving", figure, unit, m, p))
        records += step_records(policy, measured_by_policy[policy])
    return records


def _record(policy, kind, figure, unit, m, p) -> dict:
    error = p / m - 1 if m and p is not None else None
    return {"policy": policy, "kind": kind, "figure": figure, "unit": unit, "measured": m, "predicted": p,
            "error": error if error is None or math.isfinite(error) else None}  # a measured 5e-324 s: no error


def step_records(policy: str, summary: dict) -> list[dict]:
    """A triton run's own step-level check: per phase, the measured seconds of all its steps beside the
    analytic price of the same steps (recorded by the backend as it ran)."""
    out = []
    for phase in ("decode", "prefill", "mixed"):
        where = ("backend", "step_times", phase)
        m, p = _pick(summary, (*where, "measured_s")), _pick(summary, (*where, "predicted_s"))
        if p is not None:
            out.append(_record(policy, "step", f"{phase} steps ({_pick(summary, (*where, 'steps'))})", "s", m, p))
    return out


def median_abs_error(records: list[dict], policy=None, kind: str = "serving") -> float:
    """Median |error| of the records of one kind (serving figures by default), of one policy or all."""
    errs = [abs(r["error"]) for r in records
            if r["error"] is not None and r["kind"] == kind and (policy is None or r["policy"] == policy)]
    return statistics.median(errs) if errs else math.nan
