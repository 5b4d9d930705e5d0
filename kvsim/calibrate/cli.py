"""The `profile`, `calibrate` and `validate` commands."""

from __future__ import annotations

import math
import os
from pathlib import Path

from kvsim.errors import KvsimError, check_int
from kvsim.calibrate.outputs import vet_output as _vet_output
from kvsim.calibrate.outputs import written_by_calibrate as _written_by_calibrate
from kvsim.scenario.args import add_scenario_arguments, scenario_from_args


MAX_FOLDS = 100  # k-fold hold-out: each fold is a fit; more folds than observations are empty
MAX_ERROR_BOUND = 10.0  # --max-error: 1000% accepts any fit worth writing; inf would be written as Infinity
AIC_REPO = "https://github.com/ai-dynamo/aiconfigurator"  # NVIDIA AIConfigurator: vLLM kernel timings (Apache-2.0)
AIC_DATA = "aic-core/src/aiconfigurator_core/systems/data"  # its GPU folders (h100_sxm, ...), as of 095f58a


def add_commands(sub) -> None:
    """Register this package's subcommands on the `kvsim` parser."""
    prof = sub.add_parser("profile", help="time the triton engine over a grid of step shapes (GPU) into a CSV")
    prof.add_argument("--model", action="append", required=True, help="model preset (repeatable)")
    prof.add_argument("--kv-cache-dtype", action="append", default=None,
                      help="KV cache dtype (repeatable; default auto). auto gets the full grid, others a cut-down one")
    prof.add_argument("--gpu", help="GPU preset the rows are for (default: from the device name)")
    prof.add_argument("--device", default="cuda:0")
    prof.add_argument("--grid", choices=("fit", "heldout", "both", "serving"), default="fit",
                      help="the regular grid (fit), random shapes off it (heldout), both, or the shapes serving "
                           "produces (ragged decode batches, long cached prefixes) with random ragged ones held out")
    prof.add_argument("--heldout-per-phase", type=int, default=20, help="random shapes per phase (heldout grid)")
    prof.add_argument("--repeats", type=int, default=5, help="timed repeats per shape (at least; median kept)")
    prof.add_argument("--passes", type=int, default=2, help="passes over the grid; the least median is kept")
    prof.add_argument("--max-seconds", type=float, default=math.inf, help="stop starting new shapes after this")
    prof.add_argument("--max-model-len", type=int, default=16384, help="longest context in the grid")
    prof.add_argument("-o", "--out", type=Path, required=True, help="CSV to write")
    prof.set_defaults(handler=cmd_profile)

    cal = sub.add_parser("calibrate", help="fit the step-time model's coefficients to measured tables")
    cal.add_argument("tables", nargs="*", type=Path, metavar="TABLE",
                     help="kvsim profile CSVs, Vidur mlp.csv / all_reduce.csv operator profiles, or one NVIDIA "
                          "AIConfigurator data folder (<gpu>/ with gemm/, attention/, comm/) converted into a "
                          "kernel-table file (-o FILE.npz) that backend.kernel_tables prices with")
    cal.add_argument("--serving", nargs=2, action="append", default=[], type=Path, metavar=("SCENARIO", "RESULT"),
                     help="a vllm bench serve --save-result JSON and the scenario it ran (fit by simulating it); with "
                          "--server-terms, RESULT may also be an llm-d inference-perf result folder (its stages "
                          "replayed on the scenario's server)")
    cal.add_argument("--server-terms", nargs="?", const="", default=None, metavar="TERMS",
                     help="fit the server terms around the measured kernels (API server, what a step costs beyond "
                          "its kernels) to the --serving runs, with a hold-out error per term, and write a "
                          "server-terms "
                          "file for backend.server_terms; TERMS: comma-separated names (default: "
                          "api_server_s,piecewise_layer_s)")
    cal.add_argument("-o", "--out", type=Path, required=True, help="calibration JSON to write")
    cal.add_argument("--gpu", help="GPU preset of tables whose path does not say it (Vidur)")
    cal.add_argument("--start", help="starting coefficients: a calibration JSON, or 'vllm' / 'triton' (shipped for "
                     "--gpu); coefficients the tables cannot move keep these values and their provenance")
    cal.add_argument("--free", help="comma-separated coefficients to fit (default: every one the tables move)")
    cal.add_argument("--fix", help="comma-separated coefficients to keep at their starting values")
    cal.add_argument("--per-table", help="comma-separated coefficients fitted once per table (tables profiled on "
                     "different machines: the host-side ones); the calibration written holds the first table's")
    cal.add_argument("--only", help="comma-separated observation kinds to use: step, gemm, elementwise, allreduce, "
                     "serving (default: all the tables hold)")
    cal.add_argument("--folds", type=int, default=5, help="k of the k-fold hold-out (default 5)")
    cal.add_argument("--max-error", type=float, default=None,
                     help="refuse a fit whose hold-out median |error| is above this fraction (default 0.10; "
                          "any phase or slice of 10+ observations: twice it)")
    cal.add_argument("--engine", default="", help="the engine the tables measured, recorded in the file")
    cal.add_argument("--vllm-version", help="AIConfigurator folder: the vLLM release whose tables to convert "
                     "(default: the newest with every table)")
    cal.set_defaults(handler=cmd_calibrate)

    val = sub.add_parser("validate", help="compare a scenario's analytic prediction with a measured run")
    add_scenario_arguments(val)
    val.add_argument("--measured", type=Path, required=True,
                     help="results folder of a GPU (triton backend) run of the scenario, or a vllm bench serve JSON")
    val.add_argument("--policy", action="append", help="only this policy (repeatable)")
    val.add_argument("--out", type=Path, help="write the error table here (.csv or .json)")
    val.set_defaults(handler=cmd_validate)


def _where_aic_data_is(table: Path) -> None:
    """A TABLE that does not exist and is named as an AIConfigurator GPU folder: where that data comes from."""
    from kvsim.calibrate.aiconfigurator import AIC_GPUS

    if table.name in AIC_GPUS.values() and not os.path.lexists(table):
        raise KvsimError(f"{table}: no such folder (NVIDIA AIConfigurator's kernel timings: git clone {AIC_REPO}, "
                         f"then give aiconfigurator/{AIC_DATA}/{table.name})")


def _names(text, option: str) -> list[str]:
    from kvsim.perf.calibration import COEFFICIENTS

    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in COEFFICIENTS]
    if bad:
        raise KvsimError(f"{option}: unknown coefficient {bad[0]} (known: {', '.join(COEFFICIENTS)})")
    return names


def _start(args):
    """The starting Calibration and the provenance of its figures."""
    import json

    from kvsim.perf.calibration import ENGINES, Calibration, load_calibration, shipped_path

    if not args.start:
        return Calibration(), {}
    path = Path(args.start)
    if args.start in ENGINES:
        if not args.gpu:
            raise KvsimError(f"--start {args.start}: name the GPU preset with --gpu")
        path = shipped_path(args.gpu, args.start)
    cal = load_calibration(path)
    try:
        prov = json.loads(path.read_text()).get("provenance") or {}
    except (OSError, ValueError, AttributeError):
        prov = {}
    return cal, {k: f"{v} (from {path.name})" for k, v in prov.items()}


def cmd_profile(args, console) -> int:
    from kvsim.calibrate.profile import ProfileOptions, run_profile

    vetted = _vet_output(args.out, "the profile", "a file it did not create")
    opts = ProfileOptions(grid=args.grid, heldout_per_phase=args.heldout_per_phase, repeats=args.repeats,
                          passes=args.passes, max_seconds=args.max_seconds, max_model_len=args.max_model_len)
    rows = run_profile(args.model, args.kv_cache_dtype or ["auto"], args.out, opts, gpu=args.gpu, device=args.device,
                       vetted=vetted)
    console.print(f"{rows} step shapes timed: {args.out}")
    return 0


def cmd_calibrate(args, console) -> int:
    import numpy as np
    from rich.table import Table

    from kvsim.calibrate import fit as fitting
    from kvsim.calibrate.tables import read_tables, serving_observations
    from kvsim.perf.calibration import COEFFICIENTS, write_calibration

    if args.server_terms is not None:
        from kvsim.calibrate.server_cli import cmd_server_terms

        return cmd_server_terms(args, console)
    if not args.tables and not args.serving:
        raise KvsimError("calibrate: give at least one TABLE or --serving SCENARIO RESULT")
    for table in args.tables:
        _where_aic_data_is(table)
    if any(t.is_dir() for t in args.tables):
        return cmd_kernel_tables(args, console)
    vetted = _vet_output(args.out, "the calibration", "a file kvsim calibrate did not write", _written_by_calibrate)
    check_int(args.folds, "--folds", 2, MAX_FOLDS)
    max_error = fitting.MAX_HOLDOUT_ERROR if args.max_error is None else args.max_error
    if not 0 < max_error <= MAX_ERROR_BOUND:
        raise KvsimError(f"--max-error: must be a fraction in (0, {MAX_ERROR_BOUND:g}], got {max_error}")
    per_table = _names(args.per_table, "--per-table")
    obs = read_tables(args.tables, args.gpu, across_tables=not per_table)
    for scenario, result in args.serving:
        obs += serving_observations(scenario, result)
    if args.only:
        kinds = {k.strip() for k in args.only.split(",") if k.strip()}
        unknown = kinds - {"step", "gemm", "elementwise", "allreduce", "serving"}
        if unknown:
            raise KvsimError(f"--only: unknown kind {sorted(unknown)[0]} (step, gemm, elementwise, allreduce, serving)")
        obs = [o for o in obs if o.kind in kinds]
    if not obs:
        raise KvsimError("calibrate: the tables hold no observations" + (" of those kinds" if args.only else ""))
    start, start_prov = _start(args)
    train = [o for o in obs if o.grid != "heldout"]
    free = _names(args.free, "--free") or fitting.identifiable(train, start)
    free = [n for n in free if n not in _names(args.fix, "--fix")]
    final = fitting.fit(train, start, free, per_table)
    errors = fitting.holdout_errors(obs, start, free, args.folds, per_table=per_table)
    rows = fitting.slice_table(obs, errors)

    coef = Table(title=f"fit to {len(train)} observations ({len(obs) - len(train)} held-out shapes)")
    for col in ("coefficient", "start", "fitted"):
        coef.add_column(col, justify="right" if col != "coefficient" else "left")
    others = list(final.tables)
    for t in others:
        coef.add_column(f"fitted: {Path(t).name}", justify="right")
    for name in COEFFICIENTS:
        coef.add_row(name, f"{getattr(start, name):.4g}",
                     f"{getattr(final.calibration, name):.4g}" if name in final.free else "(kept)",
                     *(f"{final.tables[t][name]:.4g}" if name in final.tables[t] else "" for t in others))
    console.print(coef)
    table = Table(title="hold-out error (k-fold; held-out shapes by the fit to the rest)")
    for col in ("phase", "band", "tp", "n", "median |error|", "median error", "worst |error|"):
        table.add_column(col, justify="left" if col in ("phase", "band") else "right")
    for r in rows:
        table.add_row(r["phase"], r["band"], str(r["tp"]), str(r["n"]), f"{r['median_abs_error']:.1%}",
                      f"{r['bias']:+.1%}", f"{r['max_abs_error']:.1%}")
    console.print(table)
    held = np.abs(errors[~np.isnan(errors)])
    overall = float(np.median(held)) if held.size else None
    console.print(f"hold-out median |error| over {held.size} observations: "
                  + ("-" if overall is None else f"{overall:.1%}"))
    why = fitting.check_fit(errors, rows, max_error)
    if why is not None:
        raise KvsimError(f"calibrate: fit refused: {why} (--max-error sets the threshold); {args.out} not written")
    sources = [str(p) for p in args.tables] + [f"{s} + {r}" for s, r in args.serving]
    write_calibration(args.out, final.calibration, vetted=vetted, written_by="kvsim calibrate",
                      gpu=args.gpu, engine=args.engine,
                      provenance=fitting.provenance(final, start_prov, sources, len(train)),
                      fit={"observations": len(train), "heldout_shapes": len(obs) - len(train), "folds": args.folds,
                           "holdout_median_abs_error": None if overall is None else round(overall, 4),
                           "max_error": max_error,
                           "fitted": final.free, "slices": _rounded(rows),
                           **({"per_table": {str(t): v for t, v in final.tables.items()}} if final.tables else {})})
    console.print(f"calibration: {args.out}")
    return 0


def cmd_kernel_tables(args, console) -> int:
    """`kvsim calibrate AIC_GPU_FOLDER -o FILE.npz`: AIConfigurator's tables converted, then checked by
    holding whole shapes out of them (kvsim.calibrate.kernel_holdout)."""
    from rich.table import Table

    from kvsim.calibrate.aiconfigurator import AIC_GPUS, convert, versions, version_key, write_tables
    from kvsim.calibrate.kernel_holdout import holdout_rows, stats
    from kvsim.perf.calibration import Calibration, load_calibration, shipped_path
    from kvsim.perf.kernels import KernelTables
    from kvsim.scenario.catalog import GPUS

    given = next(t for t in args.tables if t.is_dir())
    if len(args.tables) != 1 or args.serving:
        raise KvsimError(f"{given}: a folder as TABLE is read as an AIConfigurator data folder (<gpu>/ with gemm/, "
                         "attention/, comm/) and converted on its own: give it alone, without --serving (profile and "
                         "Vidur tables are CSV files)")
    folder = args.tables[0].resolve()
    if args.out.suffix != ".npz":
        raise KvsimError(f"-o: {args.out}: the AIConfigurator folder {given} is converted into kernel tables, "
                         "written as .npz")
    by_stem = {v: k for k, v in AIC_GPUS.items()}
    gpu = args.gpu or by_stem.get(folder.name)
    if gpu not in GPUS:
        raise KvsimError(f"{folder}: name the GPU preset with --gpu (the folder's name {folder.name!r} is none of "
                         f"{', '.join(AIC_GPUS.values())})")
    found = versions(folder.parent, folder.name)
    if not found:
        raise KvsimError(f"{folder}: no vLLM release with gemm, attention and comm tables (an AIConfigurator "
                         f"systems/data/<gpu> folder)")
    version = args.vllm_version or max(found, key=version_key)
    if version not in found:
        raise KvsimError(f"--vllm-version: {version}: no complete tables in {folder} (found: {', '.join(found)})")
    vetted = _vet_output(args.out, "the kernel tables", "a file it did not create")
    arrays, meta = convert(folder.parent, gpu, version)
    meta["source"]["folder"] = str(folder)
    write_tables(args.out, arrays, meta, vetted)
    tables = KernelTables(args.out)
    cal_path = shipped_path(gpu)
    table = Table(title=f"{gpu}, vLLM {version}: whole shapes held out, predicted from the rest")
    for col in ("kernel family", "held out", "points", "median |error|", "p90 |error|", "extrapolated points"):
        table.add_column(col, justify="left" if col in ("kernel family", "held out") else "right")
    for family, held, inside, outside in holdout_rows(tables, GPUS[gpu], load_calibration(cal_path)
                                                      if cal_path.exists() else Calibration()):
        n, med, p90, _ = stats(inside)
        table.add_row(family, held, f"{n:,}", "-" if med is None else f"{med:.1%}",
                      "-" if p90 is None else f"{p90:.1%}", f"{len(outside):,}")
    console.print(table)
    console.print(f"kernel tables: {args.out} (backend.kernel_tables = \"{args.out.name}\" prices with them)")
    return 0


def _rounded(rows: list[dict]) -> list[dict]:
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def cmd_validate(args, console) -> int:
    import csv
    import io
    import json

    from rich.markup import escape
    from rich.table import Table

    from kvsim.calibrate.validate import median_abs_error, validate
    from kvsim.results.cells import csv_cell
    from kvsim.scenario.publish import write_text_atomic

    if args.out is not None:
        if args.out.suffix not in (".csv", ".json"):
            raise KvsimError(f"--out: {args.out}: must end in .csv or .json")
        vetted = _vet_output(args.out, "the error table", "a file it did not create")
    scenario = scenario_from_args(args)
    records = validate(scenario, args.measured, args.policy)
    for policy in dict.fromkeys(r["policy"] for r in records):
        table = Table(title=escape(f"{scenario.name}, policy {policy}: analytic prediction vs measured ({args.measured})"))
        for col in ("figure", "unit", "measured", "predicted", "error"):
            table.add_column(col, justify="left" if col in ("figure", "unit") else "right")
        for kind in ("serving", "step"):  # the serving figures' median closes their section
            for r in records:
                if r["policy"] == policy and r["kind"] == kind:
                    table.add_row(r["figure"], r["unit"], _num(r["measured"]), _num(r["predicted"]),
                                  "" if r["error"] is None else f"{r['error']:+.1%}")
            if kind == "serving":
                table.add_row("median |error|", "", "", "", f"{median_abs_error(records, policy):.1%}",
                              end_section=True)
        console.print(table)
    console.print(f"median |error| over all serving figures: {median_abs_error(records):.1%}")
    if args.out is not None:
        if args.out.suffix == ".json":
            median = median_abs_error(records)
            text = json.dumps({"scenario": scenario.name, "measured": str(args.measured),
                               "median_abs_error": median if math.isfinite(median) else None, "records": records},
                              indent=2, allow_nan=False) + "\n"
        else:
            buffer = io.StringIO()
            w = csv.DictWriter(buffer, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows({k: csv_cell(v) for k, v in r.items()} for r in records)
            text = buffer.getvalue()
        write_text_atomic(args.out, text, "the error table", vetted=vetted)
        console.print(f"error table: {args.out}")
    return 0


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.3g}" if abs(x) < 10 else f"{x:,.1f}"
