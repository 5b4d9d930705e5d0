"""The command line in a real terminal: every command run as a user runs it, `python -m kvsim ...` with a
pseudo-terminal as its standard streams (`os.openpty`, the window size set with TIOCSWINSZ), so that rich
draws what it draws only on a terminal: progress bars (a run's after its first second), colours, tables
at the terminal's width. Wide (250) and narrow (40) terminals, TERM=dumb, a terminal of size 0 x 0, and
COLUMNS / LINES that are 0, negative, not numbers, not ASCII digits or huge. Each command must exit 0,
write its results and print no traceback; the narrow terminal's lines must fit it and no table's word
may be cut.

The cases run two at a time (the pseudo-terminals are independent), once per module.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LONG_RUN = ["--policy", "paged", "--set", "workload.num_requests=15000"]  # 2-5 s here: the bar appears after 1 s
SMALL_PLAN = ["--requests", "200", "--seeds", "1", "--resolution", "0.3"]
# what rich or a terminal reads from the environment, set per case only
TERMINAL_ENV = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                "TTY_INTERACTIVE", "KVSIM_DEBUG", "JUPYTER_COLUMNS", "JUPYTER_LINES")
ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[@-Z\\-_])")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Case:
    args: list  # after `python -m kvsim`; "{tmp}" is the case's folder
    size: tuple = (80, 24)  # columns, lines
    env: dict = field(default_factory=dict)
    bar: str | None = None  # the progress bar's label, when one must be drawn
    writes: tuple = ()  # files under the case's folder
    shows: tuple = ()  # text the output holds (escapes removed)


CASES = {
    # the README's first command, in a plain 80 x 24 terminal: five policies on workers
    "readme": Case(["scenarios/chat.toml", "--out", "{tmp}/chat"], bar="simulating",
                   writes=("chat/summary.json", "chat/requests.csv"), shows=("policy comparison", "paged-chunked")),
    "run wide": Case(["run", "scenarios/chat.toml", *LONG_RUN, "--out", "{tmp}/run"], size=(250, 50),
                     bar="simulating paged", writes=("run/summary.json",)),
    "run narrow": Case(["run", "scenarios/chat.toml", *LONG_RUN, "--out", "{tmp}/run"], size=(40, 20),
                       bar="simulating paged", writes=("run/summary.json",), shows=("TTFT p99 ms",)),
    "run TERM=dumb": Case(["run", "scenarios/chat.toml", *LONG_RUN, "--out", "{tmp}/run"], env={"TERM": "dumb"},
                          writes=("run/summary.json",), shows=("TTFT p99 ms",)),
    "run COLUMNS=0 LINES=0": Case(["run", "scenarios/chat.toml", *LONG_RUN, "--out", "{tmp}/run"],
                                  env={"COLUMNS": "0", "LINES": "0"}, bar="simulating paged",
                                  writes=("run/summary.json",), shows=("TTFT p99 ms", "results: ")),
    "run COLUMNS huge": Case(["run", "scenarios/chat.toml", *LONG_RUN, "--out", "{tmp}/run"],
                             env={"COLUMNS": "1" + "0" * 12, "LINES": "1" + "0" * 12}, bar="simulating paged",
                             writes=("run/summary.json",), shows=("TTFT p99 ms",)),
    "disaggregated run, 0 x 0 terminal": Case(["run", "scenarios/disaggregated.toml", "--set",
                                               "workload.num_requests=300", "--out", "{tmp}/pd"], size=(0, 0),
                                              writes=("pd/summary.json",), shows=("TTFT",)),
    "plan narrow": Case(["plan", "scenarios/chat.toml", "--policy", "paged", *SMALL_PLAN, "--out", "{tmp}/plan"],
                        size=(40, 20), bar="planning", writes=("plan/plan.json",)),
    "plan --target-rate": Case(["plan", "scenarios/chat.toml", "--policy", "paged", *SMALL_PLAN, "--target-rate",
                                "10", "--gpu", "H100-SXM", "--tp", "1", "--tp", "2", "--no-headroom", "--out",
                                "{tmp}/deploy"],
                               bar="planning", writes=("deploy/plan.json",), shows=("token_budget", "H100-SXM")),
    "plan closed loop, COLUMNS=-5 LINES=abc": Case(
        ["plan", "scenarios/closed_loop.toml", "--policy", "paged", *SMALL_PLAN, "--out", "{tmp}/closed"],
        size=(250, 50), env={"COLUMNS": "-5", "LINES": "abc"}, bar="planning", writes=("closed/plan.json",)),
    "sweep": Case(["sweep", "scenarios/chat.toml", "--set", "workload.num_requests=200", "--set",
                   "workload.arrival.rate=5,10", "--out", "{tmp}/sweep"], bar="sweeping 2 points",
                  writes=("sweep/sweep.csv", "sweep/sweep.html")),
    "memory narrow": Case(["memory", "scenarios/chat.toml", "--set", "model.name=gpt-oss-20b"], size=(40, 20),
                          shows=("KV capacity per GPU",)),
    "memory, COLUMNS not ASCII digits": Case(["memory", "scenarios/long_context.toml"],
                                             env={"COLUMNS": "\u00b2", "LINES": "\u0663"}, shows=("max tokens",)),
    "validate": Case(["validate", "scenarios/chat.toml", "--policy", "paged", "--set", "workload.num_requests=300",
                      "--measured", "{tmp}/measured", "--out", "{tmp}/errors.csv"], size=(40, 20),
                     writes=("errors.csv",), shows=("median |error| over all serving figures",)),
    "calibrate": Case(["calibrate", "benchmarks/results/h100_profile.csv", "-o", "{tmp}/cal.json", "--free",
                       "memory_efficiency,step_overhead_s", "--folds", "2", "--max-error", "0.5"],
                      size=(250, 50), env={"TERM": "dumb"}, writes=("cal.json",), shows=("hold-out error",)),
    "schema": Case(["schema"], size=(40, 20), env={"COLUMNS": "0"}, shows=('"$defs"',)),
    "schema --markdown": Case(["schema", "--markdown"], env={"COLUMNS": "x"}, shows=("| `workload.",)),
}


def _environment(case: Case) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
    env.update({"TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"}, **case.env)
    return env


def run_in_terminal(args: list, size: tuple, env: dict, timeout: float = 300.0) -> tuple[int, str]:
    """Run `python -m kvsim ARGS` with a pseudo-terminal of `size` (columns, lines) as stdin, stdout and
    stderr; its exit code and everything the terminal received."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", *args], stdin=slave, stdout=slave, stderr=slave,
                            cwd=ROOT, env=env, start_new_session=True)
    os.close(slave)
    out, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # EIO: every process holding the terminal has closed it
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            out += b"\n[test: timed out]"
    finally:
        os.close(master)
    return proc.wait(), out.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Every case run once, two at a time: name -> (folder, exit code, raw output)."""
    base = tmp_path_factory.mktemp("terminal")
    measured = base / "validate" / "measured"  # what `validate` compares against: a piped run's results
    subprocess.run([sys.executable, "-m", "kvsim", "run", "scenarios/chat.toml", "--policy", "paged", "--set",
                    "workload.num_requests=300", "--quiet", "--out", str(measured)], cwd=ROOT, check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)

    def one(item):
        name, case = item
        folder = base / re.sub(r"\W+", "_", name)
        folder.mkdir(exist_ok=True)
        args = [a.replace("{tmp}", str(folder)) for a in case.args]
        return name, (folder, *run_in_terminal(args, case.size, _environment(case)))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, CASES.items()))


def visible_lines(raw: str) -> list[str]:
    """The output's lines as a terminal shows them, escape sequences removed (a carriage return starts a
    line over: the progress bar redraws itself so)."""
    return [line for line in re.split(r"[\r\n]", ESCAPE.sub("", raw)) if line.strip()]


@pytest.mark.parametrize("name", list(CASES))
def test_command_in_a_terminal(sessions, name):
    case = CASES[name]
    folder, code, raw = sessions[name]
    text = "\n".join(visible_lines(raw))
    assert code == 0, f"exit code {code}:\n{text[-3000:]}"
    for bad in ("Traceback", "lost sys.stderr", "kvsim: error", "internal error", "[test: timed out]"):
        assert bad not in raw, text[-3000:]
    for path in case.writes:
        assert (folder / path).is_file() and (folder / path).stat().st_size > 0, path
    for shown in case.shows:
        assert shown in text, f"{shown!r} not in:\n{text[-3000:]}"
    if case.bar is not None:  # the bar was drawn (and, transient, wiped: the table follows on a clean line)
        assert any(line.lstrip().startswith(case.bar) and "%" in line for line in visible_lines(raw)), text[:2000]
    assert "…" not in text, f"a table cut a word:\n{text}"
    columns = case.size[0] if "COLUMNS" not in case.env else None
    if columns:
        wide = [line for line in visible_lines(raw) if len(line) > columns]
        assert not wide, f"lines wider than the terminal's {columns} columns: {wide[:3]}"
    if case.env.get("TERM") == "dumb":
        assert not COLOUR.search(raw), "colours on a dumb terminal"
    elif case.size[0] and "results: " in text:
        assert COLOUR.search(raw), "no colour on a colour terminal"


def test_the_wide_terminal_gets_the_wide_table(sessions):
    """250 columns: one row per policy, every figure's header on the header line."""
    lines = visible_lines(sessions["run wide"][2])
    header = next(line for line in lines if "policy" in line and "SLO margin" in line)
    assert "TTFT p99 ms" in header and "prefix hit %" in header
    assert any(line.startswith("│ paged ") for line in lines)


def test_plan_tables_at_80_columns_are_read_whole(sessions):
    """The deployment table (13 columns) does not fit 80 columns: drawn transposed, no figure cut."""
    folder, _, raw = sessions["plan --target-rate"]
    lines = visible_lines(raw)
    plan = json.loads((folder / "deploy" / "plan.json").read_text())
    assert all(len(line) <= 80 for line in lines)
    gpus = next(line for line in lines if line.startswith("┃ GPU"))
    assert gpus.count("H100-SXM") == len(plan["deployments"]) >= 2  # one column per deployment
    assert any(re.match(r"│ \$/hour +│ +2\.99 │ +5\.98 │", line) for line in lines)
