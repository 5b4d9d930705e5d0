"""`kvsim calibrate --server-terms --serving SCENARIO RESULT ... -o FILE`: the server terms around the measured
kernels fitted to your own serving runs, with a hold-out error per term, written as a server-terms file
that a scenario prices with (`backend.server_terms = "FILE"`).

RESULT is a `vllm bench serve --save-result` JSON of the scenario's workload, or an llm-d inference-perf
result folder (its stages replayed on the scenario's server: kvsim.calibrate.inference_perf). Runs of one
RESULT form a group; with two groups or more, each is predicted by terms fitted to the others
(kvsim.calibrate.server_fit.leave_groups_out).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from kvsim.errors import KvsimError

DEFAULT_TERMS = ("api_server_s", "piecewise_layer_s")  # the shipped fit's (benchmarks/serving_groundtruth.py select)
# the figures each term moves most: its hold-out error is theirs
TERM_METRICS = {"api_server_s": ("ttft",), "graph_step_overhead_s": ("tpot",), "step_overhead_s": ("ttft", "tpot"),
                "piecewise_layer_s": ("ttft", "tpot"), "host_step_s": ("tpot",),
                "host_per_seq_s": ("tpot",)}


def serving_cases(pairs: list) -> tuple[list, object, str, str]:
    """(cases, starting terms, GPU, vLLM release) from (scenario path, result path) pairs; one line when a
    scenario is not priced by measured kernels or the runs mix GPUs or releases."""
    from kvsim.calibrate.serving_runs import bench_case, inference_perf_cases, is_inference_perf
    from kvsim.perf.basis import pricing_basis
    from kvsim.perf.server import server_terms
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.scenario.config import load_scenario

    cases, seen, start = [], set(), None
    for scenario_path, result in pairs:
        sc = load_scenario(scenario_path)
        gpu = gpu_spec(sc)
        basis = pricing_basis(sc, model_spec(sc), gpu)
        if basis.pricing != "measured":
            raise KvsimError(f"{scenario_path}: --server-terms fits the terms around measured kernels, but this "
                             f"scenario is priced by {basis.pricing} ({basis.why})")
        seen.add((gpu.name, basis.vllm_version))
        if start is None:
            start = server_terms(sc, gpu.name)[0]
        if is_inference_perf(result):
            cases += inference_perf_cases(sc, result, group=str(result))
        else:
            cases.append(bench_case(sc, result, group=str(result)))
    if len(seen) > 1:
        raise KvsimError("--server-terms: the runs' scenarios mix GPUs or vLLM releases ("
                         + ", ".join(f"{g} vLLM {v}" for g, v in sorted(seen)) + "): fit one GPU and release at a time")
    gpu, version = seen.pop()
    return cases, start, gpu, version


def term_names(text) -> list[str]:
    from kvsim.calibrate.server_fit import BOUNDS

    names = [n.strip() for n in (text or "").split(",") if n.strip()] or list(DEFAULT_TERMS)
    bad = [n for n in names if n not in BOUNDS]
    if bad:
        raise KvsimError(f"--server-terms: cannot fit {bad[0]} (fittable: {', '.join(BOUNDS)})")
    return list(dict.fromkeys(names))


def term_holdout(names: list, cases: list, figures: list) -> dict:
    """Per term: the hold-out median |error| of the figures it moves most (TERM_METRICS)."""
    from kvsim.calibrate.server_fit import error_rows

    rows = error_rows(cases, figures)
    out = {}
    for n in names:
        errs = [abs(r["error"]) for r in rows if r["metric"] in TERM_METRICS[n]]
        out[n] = statistics.median(errs) if errs else None
    return out


def cmd_server_terms(args, console) -> int:
    from rich.table import Table

    from kvsim.calibrate.outputs import vet_output, written_by_calibrate
    from kvsim.calibrate.server_fit import error_rows, fit_terms, leave_groups_out, summary
    from kvsim.scenario.publish import write_text_atomic

    if args.tables:
        raise KvsimError("calibrate --server-terms: give --serving SCENARIO RESULT pairs, not tables")
    if not args.serving:
        raise KvsimError("calibrate --server-terms: give at least one --serving SCENARIO RESULT")
    vetted = vet_output(args.out, "server terms", "a file kvsim calibrate did not write", written_by_calibrate)
    names = term_names(args.server_terms)
    cases, start, gpu, version = serving_cases(args.serving)
    fit = fit_terms(cases, start, names)
    inside = error_rows(cases, fit.point.figures)
    groups = list(dict.fromkeys(c.group for c in cases))
    held = leave_groups_out(cases, fit) if len(groups) > 1 else None
    outside = error_rows(cases, held.figures) if held else []
    per_term = term_holdout(names, cases, held.figures) if held else {}

    table = Table(title=f"server terms fitted to {len(cases)} runs ({len(groups)} groups), {gpu}, "
                        f"vLLM {version} kernels")
    for col in ("term", "start", "fitted", "held-out fits", "hold-out median |error|"):
        table.add_column(col, justify="left" if col == "term" else "right")
    for n in names:
        spread = [getattr(t, n) for t in held.terms.values()] if held else []
        table.add_row(n, f"{getattr(start, n):.4g}", f"{getattr(fit.terms, n):.4g}",
                      f"{min(spread):.4g} … {max(spread):.4g}" if spread else "-",
                      "-" if per_term.get(n) is None else f"{per_term[n]:.1%}")
    console.print(table)
    ins, out = summary(inside), summary(outside) if outside else None
    console.print(f"in sample: median |error| {ins['median_abs_error']:.1%} over {ins['figures']} figures"
                  + (f"; held out (each group by the others' fit): {out['median_abs_error']:.1%}" if out else
                     "; one group only: no hold-out (give runs of two or more)"))
    sources = [f"{s} + {r}" for s, r in args.serving]
    prov = {n: (f"fitted by kvsim calibrate --server-terms to {ins['figures']} figures of {len(cases)} runs "
                f"({', '.join(sources)}) on {gpu}, vLLM {version} kernel tables"
                + (f"; hold-out median |error| {per_term[n]:.1%} ({'/'.join(TERM_METRICS[n])}, each group by the "
                   "others' fit)" if per_term.get(n) is not None else "")) for n in names}
    doc = {"written_by": "kvsim calibrate", "gpu": gpu, "vllm_version": version,
           "description": "server terms around the measured kernels (kvsim.perf.server.ServerTerms)",
           "terms": fit.terms.to_dict(), "provenance": prov,
           "fit": {"terms": names, "runs": len(cases), "groups": len(groups), "simulations": fit.simulations,
                   "in_sample": _rounded(ins), "holdout": _rounded(out) if out else None,
                   "holdout_per_term": {k: _round(v) for k, v in per_term.items()}}}
    write_text_atomic(Path(args.out), json.dumps(doc, indent=2, allow_nan=False) + "\n", "server terms",
                      vetted=vetted)
    console.print(f"server terms: {args.out} (backend.server_terms = \"{Path(args.out).name}\" prices with them)")
    return 0


def _round(v):
    return round(v, 4) if isinstance(v, float) else v


def _rounded(d: dict) -> dict:
    return {k: _round(v) for k, v in d.items()}
