"""The command line: `python -m kvsim [run] SCENARIO.toml`, `memory`, `schema`, `dashboard`, and the commands that
the planning and calibration packages register (`plan`, `sweep`, `profile`, `calibrate`, `validate`).

Each command is a subparser with a `handler(args, console) -> exit code`. Bad input ends with one
line on stderr naming the file, key or line, and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from importlib import import_module
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.scenario.args import add_scenario_arguments, scenario_from_args

# Packages above `run` that add commands of their own: each has `add_commands(subparsers)`.
COMMAND_MODULES = ("kvsim.planning.cli", "kvsim.calibrate.cli")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block goes to --help, as every other error is one line)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {text!r}")
    return int(text)


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
    run.set_defaults(handler=cmd_run)
    mem = sub.add_parser("memory", help="print the KV capacity breakdown and KV memory growth table")
    add_scenario_arguments(mem)
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
    dash.set_defaults(handler=cmd_dashboard)
    for name in COMMAND_MODULES:
        import_module(name).add_commands(sub)
    p.commands = sub.choices  # command name -> subparser (main inserts `run` before a bare scenario)
    return p


class LazyConsole:
    """rich's Console, built (and rich imported) when a command first prints: a quiet run needs neither."""

    def __init__(self, **options):
        self._options, self._console = options, None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


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
                from rich.progress import Progress as Bar
                self.bar = Bar(console=self.console, transient=True)
                self.bar.start()
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
        result = run_scenario(scenario, args.out, args.policy, progress, force=args.force)
    finally:
        progress.close()
    if not args.quiet:
        from kvsim.results.report import comparison_table, verdict_lines

        for line in verdict_lines(result.summaries, result.meta):
            console.print(line, markup=False, highlight=False)
        console.print(comparison_table(result.summaries, transpose=console.width < 150))
        for run in result.runs:
            console.print(f"[dim]{run.name}: simulated in {run.wall_s:.2f} s wall ({run.events} engine events)[/dim]")
        console.print(f"results: {result.out_dir}")
    return 0


def cmd_memory(args, console) -> int:
    from kvsim.perf.memory import check_fits
    from kvsim.results.memory_report import render_memory
    from kvsim.scenario.catalog import gpu_spec, model_spec

    scenario = scenario_from_args(args)
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    check_fits(scenario, model, gpu, scenario.policies)  # the same rules as `run`
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
    import os

    if not DASHBOARD_APP.is_file():
        raise KvsimError(f"{DASHBOARD_APP}: dashboard not found (app/ ships with the source tree: "
                         "install kvsim from a clone with pip install -e .)")
    cmd = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP)]
    if args.port is not None:
        cmd += ["--server.port", str(args.port)]
    if args.headless is not None:
        cmd += ["--server.headless", args.headless]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached


class Terminated(BaseException):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so the results writer removes its temporary folder."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    for sig in _SIGNALS:  # a second signal must not interrupt the clean-up of the first
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _one_line(text: str, limit: int = 2000) -> str:
    """A message as one printable line (names from files may hold newlines or escapes)."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def main(argv=None) -> int:
    # Before numpy loads (every command imports it lazily): kvsim calls no multi-threaded BLAS, and
    # starting (and at exit joining) OpenBLAS's pool of threads costs ~50 ms a process. A user's
    # own setting is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    commands = parser.commands
    if argv and argv[0] not in commands and not argv[0].startswith("-"):
        argv.insert(0, "run")
    args = parser.parse_args(argv)
    console = LazyConsole() if sys.stdout.isatty() else LazyConsole(width=160)  # pipes and logs: no truncated table
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _on_signal) for sig in _SIGNALS} if in_main else {}
    try:
        return args.handler(args, console)
    except KvsimError as exc:
        print(f"kvsim: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"kvsim: terminated ({signal.Signals(exc.signum).name})", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:  # `kvsim schema | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
