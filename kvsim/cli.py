"""The command line: `python -m kvsim [run] SCENARIO.toml`, `memory`, `schema`, `dashboard`, and the commands that
the planning and calibration packages register (`plan`, `sweep`, `profile`, `calibrate`, `validate`).

Each command is a subparser with a `handler(args, console) -> exit code`. Bad input ends with one
line on stderr naming the file, key or line, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import import_module
from pathlib import Path

from kvsim import guard
from kvsim.errors import KvsimError
from kvsim.guard import one_line as _one_line
from kvsim.scenario.args import add_scenario_arguments, scenario_from_args
from kvsim.terminal import PIPE_WIDTH, stdout_console  # noqa: F401 (PIPE_WIDTH: the width of piped output)

# Packages above `run` that add commands of their own: each has `add_commands(subparsers)`.
COMMAND_MODULES = ("kvsim.planning.cli", "kvsim.calibrate.cli")
CHECK_FAILED = 1  # `kvsim run --check`: some policy is not sustainable (as diff and grep: 1 = a difference, 2 = trouble)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block goes to --help, as every other error is one line)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {text!r}")
    return int(text)


def _workers(text: str) -> int:
    from kvsim.scenario.limits import MAX_WORKERS

    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {MAX_WORKERS}], got {text!r}")
    return int(text)


def _address(text: str) -> str:
    """A host name or IP address to listen on (Streamlit's --server.address)."""
    import ipaddress
    import re

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        if re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                        r"[A-Za-z0-9])?)*", text):
            return text
    raise argparse.ArgumentTypeError(f"not an IP address or host name: {text!r}")


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="kvsim", description="Replay LLM request arrivals against KV-cache policies.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="simulate a scenario's policies and write a results folder")
    add_scenario_arguments(run)
    run.add_argument("--out", type=Path, help="results folder (default: <output.dir>/<scenario name>)")
    run.add_argument("--force", action="store_true",
                     help="replace the results folder even if kvsim did not write it (its contents are deleted)")
    run.add_argument("--policy", action="append", help="run only this policy (repeatable)")
    run.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    run.add_argument("--workers", type=_workers, help="policies simulated at once, on worker processes (default: one "
                                                      "per policy, up to the cores; the GPU backend runs one at a time)")
    run.add_argument("--check", action="store_true",
                     help=f"exit with code {CHECK_FAILED} when a policy misses its SLO or falls behind the arrivals "
                          "(for CI gates on capacity plans; bad input stays code 2)")
    run.set_defaults(handler=cmd_run)
    mem = sub.add_parser("memory", help="print the KV capacity breakdown and KV memory growth table")
    add_scenario_arguments(mem)
    mem.add_argument("--json", action="store_true", help="print the figures as JSON (kvsim.memory's records)")
    mem.set_defaults(handler=cmd_memory)
    schema = sub.add_parser("schema", help="print the scenario JSON schema")
    schema.add_argument("--markdown", action="store_true",
                        help="a Markdown table of every key (docs/scenario-reference.md) instead")
    schema.set_defaults(handler=cmd_schema)
    dash = sub.add_parser("dashboard", help="start the what-if sizing dashboard (Streamlit, app/Home.py)")
    dash.add_argument("--server.port", dest="port", type=_port, metavar="PORT",
                      help="port to serve on (Streamlit's default: 8501)")
    dash.add_argument("--server.headless", dest="headless", choices=("true", "false"),
                      help="true: do not open a browser window")
    dash.add_argument("--server.address", dest="address", default="127.0.0.1", type=_address, metavar="ADDRESS",
                      help="interface to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the "
                           "network, without authentication: see the README before sharing it)")
    dash.set_defaults(handler=cmd_dashboard)
    for name in COMMAND_MODULES:
        import_module(name).add_commands(sub)
    p.commands = sub.choices  # command name -> subparser (main inserts `run` before a bare scenario)
    return p


class Progress:
    """A progress bar that appears only once a run has taken more than a second."""

    def __init__(self, console, enabled: bool):
        self.console, self.enabled, self.bar = console, enabled, None

    def __call__(self, label: str, total):
        start, task, done = time.perf_counter(), None, 0

        def tick(n: int) -> None:
            nonlocal task, done
            done += n
            if not self.enabled or (task is None and time.perf_counter() - start < 1.0):
                return
            if self.bar is None:
                self.bar = self.console.progress_bar()
            if task is None:
                task = self.bar.add_task(f"simulating {label}", total=total, completed=done)
            else:
                self.bar.update(task, completed=done)
        return tick

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def cmd_run(args, console) -> int:
    from kvsim.pipeline import run_scenario

    scenario = scenario_from_args(args)
    progress = Progress(console, not args.quiet and console.is_terminal)
    try:
        result = run_scenario(scenario, args.out, args.policy, progress, force=args.force, workers=args.workers)
    finally:
        progress.close()
    if not args.quiet:
        from kvsim.results.report import comparison_table, verdict_lines

        for line in verdict_lines(result.summaries, result.meta):
            console.print(line, markup=False, highlight=False)
        console.print(comparison_table(result.summaries, transpose=console.width < 150))
        from kvsim.results.disagg_report import disaggregation_lines

        from kvsim.results.fleet_figures import autoscaling_lines

        for line in disaggregation_lines(result.summaries) + autoscaling_lines(result.summaries):
            console.print(line, markup=False, highlight=False)
        for run in result.runs:
            console.print(f"[dim]{run.name}: simulated in {run.wall_s:.2f} s wall ({run.events} engine events)[/dim]")
        console.print(f"results: {result.out_dir}")
    if args.check:
        return check_verdicts(result.summaries)
    return 0


def check_verdicts(summaries: dict) -> int:
    """`--check`: 0 when every policy meets its SLO and keeps up with the arrivals, else one line
    naming the others on stderr and CHECK_FAILED."""
    from kvsim.results.verdict import judge

    failed = {name: judge(s) for name, s in summaries.items()}
    failed = {name: v for name, v in failed.items() if not v.sustainable}
    if not failed:
        return 0
    print("kvsim: check failed: " + "; ".join(f"{name}: {v.summary_text()}" for name, v in failed.items()),
          file=sys.stderr)
    return CHECK_FAILED


def cmd_memory(args, console) -> int:
    from kvsim.perf.memory import check_fits
    from kvsim.results.memory_report import memory_records, render_memory
    from kvsim.scenario.catalog import gpu_spec, model_spec

    scenario = scenario_from_args(args)
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    check_fits(scenario, model, gpu, scenario.policies, simulate=False)  # `run`'s rules, less what it cannot simulate
    if args.json:
        print(json.dumps(memory_records(scenario, model, gpu), indent=2))
        return 0
    for renderable in render_memory(scenario, model, gpu):
        console.print(renderable)
    return 0


def cmd_schema(args, console) -> int:
    if args.markdown:
        from kvsim.scenario.reference import schema_markdown
        print(schema_markdown(), end="")
    else:
        from kvsim.scenario.config import json_schema
        print(json_schema())
    return 0


DASHBOARD_APP = Path(__file__).resolve().parent.parent / "app" / "Home.py"


def cmd_dashboard(args, console) -> int:
    """Become `streamlit run app/Home.py` (exec: Ctrl-C and kill reach the server itself)."""
    if not DASHBOARD_APP.is_file():
        raise KvsimError(f"{DASHBOARD_APP}: dashboard not found (app/ ships with the source tree: "
                         "install kvsim from a clone with pip install -e .)")
    cmd = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP)]
    if args.port is not None:
        cmd += ["--server.port", str(args.port)]
    if args.headless is not None:
        cmd += ["--server.headless", args.headless]
    cmd += ["--server.address", args.address]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached


def _check_output(args) -> None:
    if guard.stdout_closed() and not getattr(args, "quiet", False):
        raise KvsimError("standard output is closed: pass --quiet (run, plan, sweep) or redirect it (> FILE)")


def dispatch(argv=None) -> int:
    """Parse the command line and run its command (`main` without the guard: kvsim.__main__.main, the console
    script and `python -m kvsim`, sets the guard up before importing this module)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    commands = parser.commands
    if argv and argv[0] not in commands and not argv[0].startswith("-"):
        argv.insert(0, "run")
    args = parser.parse_args(argv)
    _check_output(args)
    return args.handler(args, stdout_console())


def main(argv=None) -> int:
    """The `kvsim` command: `dispatch` under kvsim.guard (one line and an exit code, whatever happens)."""
    return guard.run(lambda: dispatch(argv))
