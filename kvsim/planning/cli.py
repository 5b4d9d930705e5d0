"""The `plan` and `sweep` commands."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.scenario.args import add_scenario_arguments, scenario_from_args


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value < math.inf:  # nan and inf are no rate, resolution or count
            raise argparse.ArgumentTypeError(f"must be positive{' and finite' if kind is float else ''}, got {text}")
        return value
    return parse


def _k_list(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected draft token counts like 1,2,3,4, got {text!r}") from None
    if not ks or any(not 1 <= k <= 16 for k in ks):
        raise argparse.ArgumentTypeError(f"draft token counts from 1 to 16, got {text!r}")
    return ks


def _executor_arguments(p) -> None:
    p.add_argument("--workers", type=_positive(int), help="local worker processes (default: every core)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster: 'auto', or an address "
                                                    "(needs pip install 'kvsim[cluster]')")
    p.add_argument("--quiet", action="store_true", help="no tables, no progress bar")
    p.add_argument("--force", action="store_true", help="let --out replace a folder kvsim did not write "
                                                        "(never one holding the scenario's inputs)")


def _fraction(text: str) -> float:
    value = _positive(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def add_commands(sub) -> None:
    """Register this package's subcommands on the `kvsim` parser."""
    plan = sub.add_parser("plan", help="maximum sustainable rate per policy under the SLO; with --target-rate, "
                                       "the cheapest deployments")
    add_scenario_arguments(plan)
    plan.add_argument("--policy", action="append", help="only this policy (repeatable; with --target-rate: the "
                                                        "candidate policies, default every one vllm serve can run; "
                                                        "--disaggregated: every one served disaggregated)")
    plan.add_argument("--seeds", type=_positive(int), default=3, help="seeds per rate (default 3)")
    plan.add_argument("--resolution", type=_positive(float), default=0.02,
                      help="relative rate resolution of the search (default 0.02: ±2%%)")
    plan.add_argument("--requests", type=_positive(int), help="requests per simulated point "
                                                              "(default: the scenario's, at most 3000)")
    plan.add_argument("--tune", action="store_true", help="also search each policy's max_num_seqs and "
                                                          "max_num_batched_tokens (vLLM's --max-num-seqs, "
                                                          "--max-num-batched-tokens) for a higher safe rate")
    plan.add_argument("--target-rate", type=_positive(float), metavar="R",
                      help="search deployments (GPU, TP, replicas) meeting the SLO at R req/s")
    plan.add_argument("--gpu", action="append", help="candidate GPU preset (repeatable; default: all)")
    plan.add_argument("--tp", action="append", type=_positive(int), help="candidate TP degree (repeatable; default 1 2 4 8)")
    plan.add_argument("--max-replicas", type=_positive(int), default=64)
    plan.add_argument("--top", type=_positive(int), default=3, help="deployments listed, each with its own safe "
                                                                    "rate searched (default 3)")
    plan.add_argument("--disaggregated", action=argparse.BooleanOptionalAction, default=None,
                      help="with --target-rate: search prefill:decode instance counts x GPU and TP per pool beside "
                           "the aggregated layouts (default: when the scenario has a [disaggregation] section)")
    plan.add_argument("--headroom", action=argparse.BooleanOptionalAction, default=True,
                      help="search each listed deployment's own safe rate (--no-headroom: only whether it "
                           "meets the target, faster)")
    plan.add_argument("--autoscale", action="store_true",
                      help="search the [autoscaling] section's autoscaler settings for the cheapest meeting the "
                           "attainment target over the day, beside the static pool at the peak and the lower bound")
    plan.add_argument("--grid", action="append", metavar="autoscaling.KEY=V1,V2",
                      help="with --autoscale: an axis of settings (repeatable; default: the autoscaler's main knob "
                           "x min_replicas)")
    plan.add_argument("--attainment", type=_fraction, metavar="SHARE",
                      help="with --autoscale: the share of requests that must meet every per-request SLO bound "
                           "(default: autoscaling.attainment_target, else slo.percentile / 100)")
    plan.add_argument("--offload-gib", metavar="G1,G2,...",
                      help="size the policy's CPU offload tier: its safe rate and $ per million requests at each "
                           "GiB per replica (0: no tier; vLLM's --kv-offloading-size), and whether a tier pays")
    plan.add_argument("--dram-usd-gib-hour", type=_positive(float), metavar="USD",
                      help="with --offload-gib: host DRAM's price per GiB-hour (default: the catalog's, with "
                           "its source)")
    plan.add_argument("--exhaustive", action="store_true",
                      help="simulate every point whole and run every search in full, as before early stopping "
                           "and guided searches (slower; the same answers)")
    plan.add_argument("--speculative-k", type=_k_list, metavar="K,K,...",
                      help="compare each policy without speculative decoding and with each k draft tokens (the "
                           "scenario's [speculative] method and acceptance), and say where speculation stops paying")
    plan.add_argument("--rank", choices=("rate", "energy"), default="rate",
                      help="energy: also rank the answers by joules per output token at their safe rates (adds "
                           "[energy] with its defaults when the scenario has none)")
    plan.add_argument("--out", type=Path, help="write plan.json, plan.csv and points.csv into this folder")
    _executor_arguments(plan)
    plan.set_defaults(handler=cmd_plan)
    sweep = sub.add_parser("sweep", help="simulate a grid of --set key=v1,v2 values (or --from points.csv)")
    add_scenario_arguments(sweep)
    sweep.add_argument("--from", dest="points_file", type=Path, help="CSV of points: a header of dotted keys, "
                                                                      "a row per point")
    sweep.add_argument("--out", type=Path, help="folder for sweep.csv and sweep.html "
                                                "(default: <output.dir>/<scenario name>-sweep)")
    _executor_arguments(sweep)
    sweep.set_defaults(handler=cmd_sweep)


class Bar:
    """A `progress(done, total)` callback drawing a transient rich progress bar."""

    def __init__(self, console, label: str, enabled: bool):
        self.console, self.label, self.enabled, self.bar, self.task = console, label, enabled, None, None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = self.console.progress_bar()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print_lines(console, lines) -> None:
    for line in lines:
        console.print(line, markup=False, highlight=False)


def cmd_plan(args, console) -> int:
    from kvsim.planning import output
    from kvsim.planning.capacity import plan
    from kvsim.planning.deploy import TP_DEGREES, deploy

    from kvsim.pipeline import chosen_policies

    scenario = scenario_from_args(args)
    chosen_policies(scenario, args.policy)  # an unknown --policy fails before anything runs
    if args.rank == "energy":
        from kvsim.planning.speculation import with_energy

        scenario = with_energy(scenario)
    if args.speculative_k and args.target_rate is not None:
        raise KvsimError("--speculative-k: compares a layout's policies; give it without --target-rate")
    vetted = output.check_out(args.out, scenario, args.force) if args.out is not None else None
    bar = Bar(console, "planning", not args.quiet and console.is_terminal)
    if args.autoscale or args.grid or args.attainment is not None:
        return cmd_plan_autoscale(args, console, scenario, bar, vetted)
    common = dict(seeds=args.seeds, resolution=args.resolution, num_requests=args.requests, workers=args.workers,
                  ray=args.ray, progress=bar)
    if args.offload_gib is not None:
        return _offload_plan(args, console, scenario, vetted, bar, common)
    try:
        pd = args.disaggregated if args.disaggregated is not None else scenario.disaggregation is not None
        if pd and scenario.disaggregation is None:
            raise KvsimError(f"--disaggregated: {scenario.source} has no [disaggregation] section (its pools and "
                             "link; see scenarios/disaggregated.toml, or --set disaggregation.link.preset=NAME)")
        if args.target_rate is not None and pd:
            from kvsim.planning.disagg import pd_deploy

            result = pd_deploy(scenario, args.target_rate, gpus=args.gpu, tensor_parallel=args.tp,
                               policy=args.policy, max_replicas=args.max_replicas, exhaustive=args.exhaustive,
                               **common)
        elif args.target_rate is not None:
            from kvsim.planning.disagg import aggregated

            result = deploy(aggregated(scenario), args.target_rate, gpus=args.gpu,
                            tensor_parallel=tuple(args.tp or TP_DEGREES), policy=args.policy, top=args.top,
                            max_replicas=args.max_replicas, headroom=args.headroom, exhaustive=args.exhaustive,
                            **common)
        elif args.speculative_k:
            from kvsim.planning.speculation import speculation_plan

            result = speculation_plan(scenario, args.speculative_k, policies=args.policy, **common)
        else:
            result = plan(scenario, policies=args.policy, tune=args.tune, exhaustive=args.exhaustive, **common)
    finally:
        bar.close()
    if not args.quiet:
        if args.target_rate is not None and pd:
            _print_lines(console, output.pd_lines(result))
            console.print(output.pd_table(result))
            _print_skipped(console, output.skipped_line(result.skipped, "pool layouts"))
        elif args.target_rate is not None:
            _print_lines(console, output.deploy_lines(result))
            console.print(output.deploy_table(result))
            _print_skipped(console, output.skipped_line(result.skipped))
        else:
            _print_lines(console, output.plan_lines(result))
            console.print(output.plan_table(result))
            if result.tuning:
                console.print(output.tuning_table(result))
            _print_planning_extras(console, args, result)
    if args.out is not None:
        written = output.write_plan(args.out, result, scenario, args.force, vetted)
        if not args.quiet:
            console.print(f"results: {written}")
    return 0


def cmd_plan_autoscale(args, console, scenario, bar, vetted) -> int:
    """`plan --autoscale` (kvsim/planning/autoscale.py)."""
    from kvsim.planning import autoscale_report as report
    from kvsim.planning.autoscale import plan_autoscale
    from kvsim.planning.output import write_outputs

    if not args.autoscale:
        raise KvsimError("--grid and --attainment go with --autoscale")
    if args.target_rate is not None or args.tune:
        raise KvsimError("--autoscale: plans the scenario's day; --target-rate and --tune plan one rate")
    if args.policy and len(args.policy) > 1:
        raise KvsimError("--autoscale: give at most one --policy (the one searched)")
    try:
        result = plan_autoscale(scenario, args.policy[0] if args.policy else None, args.grid, args.attainment,
                                args.workers, args.ray, bar)
    finally:
        bar.close()
    if not args.quiet:
        _print_lines(console, report.autoscale_lines(result))
        console.print(report.autoscale_table(result))
    if args.out is not None:
        written = write_outputs(args.out, report.autoscale_files(result, scenario.slo.model_dump()), scenario, args.force,
                                vetted)
def _offload_plan(args, console, scenario, vetted, bar, common) -> int:
    """`plan --offload-gib`: kvsim.planning.offload_sizing."""
    from kvsim.planning import output
    from kvsim.planning.offload_sizing import offload_lines, offload_plan, offload_table, parse_sizes

    for flag, given in (("--target-rate", args.target_rate), ("--tune", args.tune),
                        ("--disaggregated", args.disaggregated), ("--speculative-k", args.speculative_k)):
        if given:
            raise KvsimError(f"--offload-gib sizes the CPU tier of one aggregated policy: drop {flag}")
    sizes = parse_sizes(args.offload_gib)
    try:
        result = offload_plan(scenario, sizes, policies=args.policy, dram_usd_gib_hour=args.dram_usd_gib_hour, **common)
    finally:
        bar.close()
    if not args.quiet:
        _print_lines(console, offload_lines(result))
        console.print(offload_table(result))
    if args.out is not None:
        written = output.write_plan(args.out, result, scenario, args.force, vetted)
        if not args.quiet:
            console.print(f"results: {written}")
    return 0


def _print_planning_extras(console, args, result) -> None:
    """Speculation's payoff (--speculative-k) and the answers' energy (ranked with --rank energy; in the
    plan's order when the scenario has an [energy] section)."""
    from kvsim.planning import speculation

    if args.speculative_k:
        _print_lines(console, speculation.speculation_lines(result))
        console.print(speculation.speculation_table(result))
    _print_lines(console, speculation.energy_ranking(result, ranked=args.rank == "energy"))


def _print_skipped(console, line: str) -> None:
    """One dim line: how many layouts a search left out, by why."""
    if line:
        console.print(line, style="dim", markup=False, highlight=False)


def cmd_sweep(args, console) -> int:
    from kvsim.planning import output
    from kvsim.planning.pages import sweep_page
    from kvsim.planning.sweep import grid_points, points_from_csv, sweep
    from kvsim.scenario.config import load_scenario

    scenario = load_scenario(args.scenario)  # the --set values are the grid's axes, applied per point
    if args.points_file is not None:
        keys, points = points_from_csv(args.points_file)
        if args.overrides:  # --set beside --from: the same for every point
            _, fixed = grid_points(args.overrides)
            if len(fixed) != 1:
                raise KvsimError("with --from, --set takes one value per key")
            points = [fixed[0] + p for p in points]
    elif args.overrides:
        keys, points = grid_points(args.overrides)
    else:
        raise KvsimError("sweep: give --set key=v1,v2,... (repeatable) or --from points.csv")
    out = args.out or Path(scenario.output.dir) / f"{scenario.name or 'scenario'}-sweep"
    vetted = output.check_out(out, scenario, args.force)
    bar = Bar(console, f"sweeping {len(points)} points", not args.quiet and console.is_terminal)
    try:
        result = sweep(scenario, points, keys=keys, workers=args.workers, ray=args.ray, progress=bar)
    finally:
        bar.close()
    written = output.write_outputs(out, {"sweep.csv": output.csv_text(result.rows, result.columns),
                                         "sweep.html": sweep_page(result)}, scenario, args.force, vetted)
    if not args.quiet:
        console.print(result.to_frame()[["point", *keys, "policy", "sustainable", "ttft_ms_at_pct",
                                         "tpot_ms_at_pct", "goodput_rps", "binding"]].to_string(index=False),
                      markup=False, highlight=False)
        console.print(f"results: {written}")
    return 0
