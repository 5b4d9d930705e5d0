"""Hostile input, third sweep (issue 21): nothing lost, nothing exposed. A case per class: symlinks at and
in the output, races forced at the exact point (a folder or file appearing between the check and the
swap), SIGKILL at the swap, resource limits, closed and full stdout, an ASCII locale, signals to a pool
with idle workers, inherited SIG_IGN, the dashboard shared with a team, measured-run archives.

Each in-process case runs the CLI in test_hostile's box (an unrelated folder and an earlier results
folder) and asserts: the exit code, one stderr line naming the culprit (or none for a run that must
succeed), no traceback, and nothing under the test's folder created, changed or deleted outside the
output it names (the earlier results stay byte for byte). The subprocess cases also assert that no
process is left.
"""

import csv
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import kvsim
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.guard import one_line
from kvsim.results import writer as results_writer
from kvsim.results.target import recover_leftovers
from test_hostile import ROOT, Box, _child, assert_one_line_error, snapshot
from test_hostile import box, earlier_results  # noqa: F401 (fixtures)

MARKER = ".kvsim-results.json"
FORMULA = '=HYPERLINK("http://x")\u202eevil'  # a policy name a spreadsheet would run, with a bidi override
SECOND_POLICY = '[[policies]]\nname = "=HYPERLINK(\\"http://x\\")\\u202eevil"'  # the same, in TOML


def _marker_listing(*names: str) -> str:
    return json.dumps({"format": "kvsim-results", "version": 1, "files": sorted(names)})


def _folder(b: Box, rel: str, files_: dict) -> Path:
    folder = b.work / rel
    folder.mkdir(parents=True)
    for name, text in files_.items():
        (folder / name).write_text(text)
    return folder


def _wrap(target: str, before: Callable, calls: int = 1):
    """monkeypatch helper: run `before(*args)` ahead of the first `calls` calls of `target`."""
    def patch(mp, b: Box):
        module, name = target.rsplit(".", 1)
        real = getattr(sys.modules[module], name)
        count = [0]

        def wrapped(*args, **kwargs):
            count[0] += 1
            if count[0] <= calls:
                before(b, *args)
            return real(*args, **kwargs)
        mp.setattr(target, wrapped)
    return patch


def _appear(rel: str, content: dict):
    """A user's folder appears at work/rel (the race)."""
    return lambda b, *args: _folder(b, rel, content)


def _replace_earlier(b: Box, *args) -> None:
    """The user moves the earlier results aside and puts their own folder at --out."""
    os.rename(b.earlier, b.work / "moved-earlier")
    _folder(b, "results/earlier", {"thesis.tex": "mine"})


@dataclass
class Case:
    build: Callable[[Box], list]  # writes the inputs, returns the command line (--out earlier added for a run)
    names: tuple  # what the one error line must name; () for a run that must succeed
    patch: Callable = None  # (monkeypatch, box): a race or an OS failure injected at its point
    code: int = 2
    out: str = None  # the path (relative to the box) a successful run may change
    check: Callable = None  # (box): what must hold afterwards


def _link(b: Box, name: str, target) -> str:
    os.symlink(target, b.work / name)
    return name


def _marker_link(b: Box) -> str:
    """A folder of user files whose marker is a link to a real marker elsewhere that lists them."""
    (b.inp / "marker.json").write_text(_marker_listing("thesis.tex", "summary.json"))
    _folder(b, "mine", {"thesis.tex": "mine", "summary.json": "{}"})
    os.symlink(b.inp / "marker.json", b.work / "mine" / MARKER)
    return "mine"


def _hard_marker(b: Box) -> str:
    (b.inp / "marker.json").write_text(_marker_listing("thesis.tex"))
    _folder(b, "mine", {"thesis.tex": "mine"})
    os.link(b.inp / "marker.json", b.work / "mine" / MARKER)
    return "mine"


def _trace_replaced(b: Box) -> list:
    rows = "".join(f"{i * 0.05:.2f},100,10\n" for i in range(300))
    scenario = b.trace("csv", "t.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows, num_requests=1000,
                       lengths='prompt_len = { dist = "trace" }\noutput_len = { dist = "trace" }')
    text = scenario.read_text().replace('name = "paged"', 'name = "paged"\n[[policies]]\nname = "second"')
    scenario.write_text(text)
    return [scenario, "--out", "fresh"]


def _replace_trace_after_first_policy(mp, b: Box) -> None:
    import kvsim.pipeline as pipeline
    real, calls = pipeline.simulate_policy, []

    def first_then_replace(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        (b.inp / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n")
        return out
    mp.setattr(pipeline, "simulate_policy", first_then_replace)


def _both_policies_replayed_the_first_read(b: Box) -> None:
    doc = json.loads((b.work / "fresh" / "summary.json").read_text())
    assert [p["requests"]["received"] for p in doc["policies"].values()] == [300, 300]


def _measured(b: Box, ttft: float, e2e: float = 1.0) -> Path:
    """A results folder of scenario s whose policy 'paged' measured the given TTFT p50 and E2E p50."""
    summary = {"ttft_s": {"p50": ttft}, "e2e_s": {"p50": e2e}, "throughput": {"output_tokens_per_s": 100.0}}
    folder = b.inp / "measured"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"scenario": "s", "policies": {"paged": summary}}))
    return folder


def _finite_error_table(b: Box) -> None:
    text = (b.work / "e.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the error table"))
    figures = {r["figure"]: r for r in doc["records"]}
    assert figures["TTFT p50"]["measured"] == 5e-321 * 1e3 and figures["TTFT p50"]["error"] is None


def _zip(b: Box, *entries) -> Path:
    path = b.inp / "run.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in entries:
            zf.writestr(name, text)
    return path


def _formula_cells(b: Box) -> None:
    for name in ("requests.csv", "timeseries.csv"):
        with open(b.work / "fresh" / name, newline="", encoding="utf-8") as f:
            assert {row[0] for row in list(csv.reader(f))[1:]} == {"paged", "'" + FORMULA}, name
    doc = json.loads((b.work / "fresh" / "summary.json").read_text())
    assert sorted(doc["policies"]) == sorted(["paged", FORMULA])  # the name itself is kept where it is data


def _marker_listing_a_folder(b: Box) -> str:
    _folder(b, "mine/data", {"notes.txt": "mine"})
    (b.work / "mine" / MARKER).write_text(_marker_listing("data"))
    return "mine"


def _report_html_folder(b: Box) -> str:
    _folder(b, "old/report.html", {"index": "mine"})
    (b.work / "old" / "summary.json").write_text("{}")
    return "old"


def _sweep_cells(b: Box) -> None:
    text = (b.work / "sw" / "sweep.csv").read_text()
    assert "'@SUM(1+1)" in text and ",@SUM" not in text


ALL_REDUCE_ZERO = "time_stats.all_reduce.median,num_workers,size\n0,2,2048\n0,2,4096\n"
VIDUR_SERVING = '{"completed": 30, "num_prompts": 30, "request_rate": 20.0, "output_throughput": 100.0, ' \
                '"median_ttft_ms": 1e300}'

CASES = {
    # 1. symlinks: never followed when deciding what to replace or delete
    "--force onto a link to an unrelated folder": Case(
        lambda b: [b.scenario(), "--out", _link(b, "link", b.work / "unrelated"), "--force"], (), code=0,
        out="work/link", check=lambda b: (b.work / "link").is_dir() and not (b.work / "link").is_symlink()
        and (b.work / "unrelated" / "notes.txt").read_text() == "someone else's work"),
    "a link at --out without --force": Case(
        lambda b: [b.scenario(), "--out", _link(b, "link", b.work / "unrelated")],
        ("link: results path is a symbolic link: --force replaces the link itself",)),
    "a dangling link at --out": Case(
        lambda b: [b.scenario(), "--out", _link(b, "dl", b.root / "nowhere" / "deep")],
        ("dl: results path is a symbolic link",), check=lambda b: not (b.root / "nowhere").exists()),
    "a dangling link above --out": Case(
        lambda b: [b.scenario(), "--out", Path(_link(b, "dl", b.root / "nowhere")) / "res"],
        ("cannot write results to", "dl/res: No such file or directory"),
        check=lambda b: not (b.root / "nowhere").exists()),
    "a marker that is a link to a marker elsewhere": Case(
        lambda b: [b.scenario(), "--out", _marker_link(b)], ("mine: folder exists and is not a kvsim results folder",)),
    "a marker hard-linked from elsewhere": Case(
        lambda b: [b.scenario(), "--out", _hard_marker(b)], ("mine: folder exists and is not a kvsim results folder",)),
    "a marker listing a folder of user files": Case(
        lambda b: [b.scenario(), "--out", _marker_listing_a_folder(b)],
        ("mine: folder exists and is not a kvsim results folder",)),
    "a pre-marker folder with a folder named report.html": Case(
        lambda b: [b.scenario(), "--out", _report_html_folder(b)],
        ("old: folder exists and is not a kvsim results folder",)),
    # 2. races forced at the exact point
    "a folder appears at --out before the no-replace rename": Case(
        lambda b: [b.scenario(), "--out", "results/new"], ("new: folder exists and is not a kvsim results folder",),
        _wrap("kvsim.results.writer.rename_noreplace", _appear("results/new", {"thesis.tex": "mine"})),
        out="work/results/new", check=lambda b: os.listdir(b.work / "results" / "new") == ["thesis.tex"]),
    "--out replaced by a user folder before the exchange": Case(
        lambda b: [b.scenario()], ("earlier: folder exists and is not a kvsim results folder",),
        _wrap("kvsim.results.writer.rename_exchange", _replace_earlier),
        out=("work/results", "work/moved-earlier"), check=lambda b: (b.earlier / "thesis.tex").read_text() == "mine"
        and (b.work / "moved-earlier" / MARKER).is_file() and sorted(os.listdir(b.work / "results")) == ["earlier"]),
    "a file appears in the earlier results before the exchange": Case(
        lambda b: [b.scenario()], ("results folder also holds files kvsim did not write (mine.txt)",),
        _wrap("kvsim.results.writer.rename_exchange", lambda b, *a: (b.earlier / "mine.txt").write_text("mine")),
        out="work/results/earlier/mine.txt"),
    "validate --out: a file appears while it runs": Case(
        lambda b: ["validate", b.scenario(), "--measured", b.earlier, "--out", "e.json"],
        ("e.json: already exists; kvsim does not overwrite a file it did not write",),
        _wrap("kvsim.scenario.publish.rename_noreplace", lambda b, *a: (b.work / "e.json").write_text("mine")),
        out="work/e.json", check=lambda b: (b.work / "e.json").read_text() == "mine"),
    "calibrate -o: a file appears during the fit": Case(
        lambda b: ["calibrate", b.file("all_reduce.csv", ALL_REDUCE_ZERO.replace("0,2", "0.03,2")), "--gpu",
                   "H100-SXM", "-o", "cal.json", "--max-error", "10"],
        ("cal.json: already exists; kvsim does not overwrite a file it did not write",),
        _wrap("kvsim.scenario.publish.rename_noreplace", lambda b, *a: (b.work / "cal.json").write_text("{}")),
        out="work/cal.json", check=lambda b: (b.work / "cal.json").read_text() == "{}"),
    "an earlier folder kvsim may not empty": Case(
        lambda b: [b.scenario()], ("earlier: cannot replace the earlier folder", "Permission denied"),
        lambda mp, b: mp.setattr("kvsim.results.target.os.access", lambda p, mode: Path(p) != b.earlier)),
    # 3. silent wrong answers
    "a trace replaced after the first policy": Case(
        _trace_replaced, (), _replace_trace_after_first_policy, code=0, out=("work/fresh", "in/t.csv"),
        check=_both_policies_replayed_the_first_read),
    "validate: measured TTFT of 5e-321 s": Case(
        lambda b: ["validate", b.scenario(), "--measured", _measured(b, 5e-321), "--out", "e.json", "--policy",
                   "paged"], (), code=0, out="work/e.json", check=_finite_error_table),
    "validate: a negative measured E2E": Case(
        lambda b: ["validate", b.scenario(), "--measured", _measured(b, 0.1, e2e=-3.0)],
        ("policies.paged.e2e_s.p50: a measured figure must be a non-negative number, got -3.0",)),
    "calibrate --max-error inf": Case(
        lambda b: ["calibrate", b.file("all_reduce.csv", ALL_REDUCE_ZERO), "--gpu", "H100-SXM", "-o", "c.json",
                   "--max-error", "inf"], ("--max-error: must be a fraction in (0, 10], got inf",)),
    # 4. hangs
    "sweep --ray at a port nothing listens on": Case(
        lambda b: ["sweep", b.scenario(), "--set", "workload.seed=1,2", "--ray", "127.0.0.1:1", "--out", "sw"],
        ("--ray 127.0.0.1:1: cannot connect to a Ray cluster at 127.0.0.1:1",)),
    "calibrate --folds 10^9": Case(
        lambda b: ["calibrate", b.file("all_reduce.csv", ALL_REDUCE_ZERO), "--gpu", "H100-SXM", "-o", "c.json",
                   "--folds", "1000000000"], ("--folds must be an integer in [2, 100], got 1000000000",)),
    "calibrate --serving with 1e300 ms": Case(
        lambda b: ["calibrate", "--serving", b.scenario(), b.file("b.json", VIDUR_SERVING), "-o", "c.json"],
        ("b.json: median_ttft_ms: must be at most 1e+09, got 1e+300",)),
    # 5. resources and unreadable inputs
    "calibrate on an all-zero profile": Case(
        lambda b: ["calibrate", b.file("all_reduce.csv", ALL_REDUCE_ZERO), "--gpu", "H100-SXM", "-o", "c.json"],
        ("all_reduce.csv:2: time_stats.all_reduce.median: a measured time must be positive, got 0",)),
    "validate --measured on an unreadable folder": Case(
        lambda b: ["validate", b.scenario(), "--measured", b.earlier],
        ("earlier/summary.json: cannot read measured results (Permission denied)",),
        lambda mp, b: mp.setattr("kvsim.calibrate.validate.os.stat", _deny(b.earlier / "summary.json"))),
    "plan: the pool cannot start (read-only /dev/shm)": Case(
        lambda b: ["plan", b.scenario(), "--workers", "2", "--requests", "50"],
        ("cannot start 2 worker processes (Read-only file system): --workers 1 runs in this process",),
        lambda mp, b: mp.setattr("kvsim.workers.ProcessPoolExecutor", _raise(errno.EROFS))),
    "MemoryError reading a trace": Case(
        lambda b: [b.trace("csv", "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n")],
        ("out of memory: the run needs more than this process may use",),
        lambda mp, b: mp.setitem(sys.modules["kvsim.scenario.traces"]._LOADERS, "csv", _raise(None))),
    # 6. measured-run archives (validate reads a .zip with the dashboard's checks)
    "a zip with a file 'run' and 'run/summary.json'": Case(
        lambda b: ["validate", b.scenario(), "--measured", _zip(b, ("run", "x"), ("run/summary.json", "{}"))],
        ("run.zip: 'run' is both a file and a folder in the archive",)),
    "a zip with a path over 4096 characters": Case(
        lambda b: ["validate", b.scenario(), "--measured", _zip(b, ("a/" * 2100 + "summary.json", "{}"))],
        ("run.zip: 'a/a/a/", "a path longer than 4,096 characters")),
    "a zip of a results folder validates": Case(
        lambda b: ["validate", b.scenario(), "--measured", _zip(b, ("earlier/summary.json", (
            b.earlier / "summary.json").read_text())), "--out", "e.json"], (), code=0, out="work/e.json",
        check=lambda b: json.loads((b.work / "e.json").read_text())["measured"].endswith("run.zip")),
    "validate: a vllm bench of another workload": Case(
        lambda b: ["validate", b.scenario(), "--measured", b.file("bench.json", json.dumps({
            "completed": 1000, "num_prompts": 1000, "request_rate": 20.0, "output_throughput": 1e3,
            "total_input_tokens": 1_024_000, "total_output_tokens": 22_000, "median_ttft_ms": 40.0}))],
        ("bench.json: the benchmark ran another workload than", "requests 1,000 vs 30 (±5%)",
         "mean input tokens 1,024 vs ")),
    # 7. lesser
    "CSV cells a spreadsheet would run": Case(
        lambda b: [b.scenario(policy=SECOND_POLICY), "--out", "fresh"], (), code=0,
        out="work/fresh", check=_formula_cells),
    "sweep.csv cells from a points file": Case(
        lambda b: ["sweep", b.scenario(), "--from", b.file("p.csv", 'description\n"""@SUM(1+1)"""\n'), "--out", "sw"],
        (), code=0, out="work/sw", check=_sweep_cells),
    "an empty points-CSV cell": Case(
        lambda b: ["sweep", b.scenario(), "--from", b.file("p.csv", "workload.seed,engine.max_num_seqs\n1,\n")],
        ("p.csv:2: engine.max_num_seqs: empty value",)),
}


def _deny(path: Path):
    real = os.stat

    def stat(p, *args, **kwargs):
        if Path(p) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
        return real(p, *args, **kwargs)
    return stat


def _raise(code):
    def fail(*args, **kwargs):
        if code is None:
            raise MemoryError
        raise OSError(code, os.strerror(code))
    return fail


def _argv(b: Box, built: list) -> list[str]:
    argv = [str(a) for a in built]
    if argv[0].endswith(".toml") and "--out" not in argv:
        argv += ["--out", str(b.earlier)]
    return argv + (["--quiet"] if argv[0].endswith(".toml") or argv[0] in ("plan", "sweep") else [])


def _outside(snap: dict, out) -> dict:
    outs = (out,) if isinstance(out, str) else out or ()
    return {k: v for k, v in snap.items() if not any(k == o or k.startswith(o + "/") for o in outs)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_class(box, capsys, monkeypatch, name):
    case = CASES[name]
    argv = _argv(box, case.build(box))
    before = snapshot(box.root)
    if case.patch:
        case.patch(monkeypatch, box)
    code = main(argv)
    monkeypatch.undo()
    err = capsys.readouterr().err
    if case.code == 2:
        assert_one_line_error(code, err, case.names)
    else:
        assert (code, err) == (case.code, ""), err
    after = snapshot(box.root)
    hidden = [k for k in after if Path(k).name.startswith(".") and Path(k).name != MARKER]
    assert hidden == [], hidden  # no temporary or swapped-out folder left
    assert _outside(after, case.out) == _outside(before, case.out)
    if case.check:
        assert case.check(box) is not False


# ---- the library API

def test_library_api_refuses_what_it_used_to_crash_on(box):
    scenario = kvsim.load_scenario(box.scenario())
    for call, message in (
            (lambda: kvsim.run(scenario, out_dir=box.work / "x", policies=[]), "--policy: expected a list of policy"),
            (lambda: kvsim.run(scenario, progress=5), "progress must be a function"),
            (lambda: kvsim.plan(scenario, ray=5), "--ray: expected an address string"),
            (lambda: kvsim.validate(scenario, box.earlier, policies="paged"), "--policy: expected a list of policy")):
        with pytest.raises(KvsimError, match=message):
            call()
    assert not (box.work / "x").exists()


def test_long_messages_keep_their_reason_and_escape_controls():
    line = one_line("/a" * 2000 + ": no such file\u202e\n")
    assert len(line) <= 2000 and line.endswith(": no such file\\u202e\\n") and line.startswith("/a/a")


# ---- SIGKILL at the swap, and what the next run recovers

KILL_AT = """
import os, signal, sys
import kvsim.results.writer as w
{patch}
from kvsim.cli import main
sys.exit(main(sys.argv[1:]))
"""
EXCHANGE_THEN_DIE = """
real = w.rename_exchange
def die_after(a, b):
    real(a, b)
    os.kill(os.getpid(), signal.SIGKILL)
w.rename_exchange = die_after
"""
BETWEEN_TWO_RENAMES = """
w.rename_exchange = lambda a, b: False  # the fallback without renameat2: a rename aside, a no-replace rename in
w.rename_noreplace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("where", ["after the exchange", "between the fallback's two renames"])
def test_sigkill_at_the_swap_loses_nothing(box, where):
    patch = EXCHANGE_THEN_DIE if where == "after the exchange" else BETWEEN_TWO_RENAMES
    earlier = {k: v for k, v in snapshot(box.earlier).items()}
    argv = [box.scenario(num_requests=40), "--out", box.earlier, "--quiet"]
    env = {**os.environ, "HOME": str(box.root / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILL_AT.format(patch=patch), *map(str, argv)], cwd=box.work,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.name for p in box.earlier.parent.iterdir() if p.name.startswith(".earlier."))
    if where == "after the exchange":  # --out holds the new results whole, the old ones wait to be removed
        assert len(left) == 1 and left[0].startswith(".earlier.tmp-"), left
        assert json.loads((box.earlier / MARKER).read_text())["files"] == json.loads(
            (box.earlier.parent / left[0] / MARKER).read_text())["files"]
        assert snapshot(box.earlier.parent / left[0]) == earlier
    else:  # --out missing, the earlier results hidden: the next run puts them back first
        assert not box.earlier.exists() and [n[:13] for n in left] == [".earlier.old-", ".earlier.tmp-"], left
        recover_leftovers(results_writer.results_path(box.earlier))
        assert snapshot(box.earlier) == earlier
    assert main([str(a) for a in argv]) == 0
    assert [p.name for p in box.earlier.parent.iterdir()] == ["earlier"]  # cleaned: nothing hidden is left


# ---- signals, streams, limits: child processes

def _wait_for(proc, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _signal_the_group(box, proc, sig: str, workers: list[int], before) -> None:
    """`sig` to kvsim's process group: one line from kvsim, none from the workers, none of them left, and
    the folder as it was."""
    os.killpg(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    expected = "kvsim: interrupted\n" if sig == "SIGINT" else f"kvsim: terminated ({sig})\n"
    assert (proc.returncode, err) == (128 + getattr(signal, sig), expected)
    assert _gone(workers)
    assert snapshot(box.root) == before


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_to_the_process_group_with_idle_workers(box, sig):
    """4 workers for a plan of one policy and 2 seeds: some sit idle. The group gets the signal (Ctrl-C, a closed
    terminal, kill -TERM -PGID): one line from kvsim, none from the workers, no process left."""
    argv = ["plan", box.scenario(num_requests=2000), "--workers", "4", "--seeds", "2", "--quiet"]
    before = snapshot(box.root)
    proc = _child(box, argv, start_new_session=True)
    _wait_for(proc, lambda: len(_children(proc.pid)) >= 2)
    time.sleep(0.3)
    workers = _children(proc.pid)
    _signal_the_group(box, proc, sig, workers, before)


TWO_MORE_POLICIES = '[[policies]]\nname = "fp8"\nkv_cache_dtype = "fp8"\n[[policies]]\nname = "int8"\nkv_cache_dtype = "int8"'


def _run_side_by_side(box, scenario, **kw) -> subprocess.Popen:
    """`kvsim run` of three policies on two workers, once both stream rows into their part files."""
    proc = _child(box, [scenario, "--out", box.earlier, "--quiet", "--workers", "2"], **kw)
    _wait_for(proc, lambda: sum(p.stat().st_size > 0 for p in box.earlier.parent.glob(".earlier.tmp-*/.requests-*"))
              >= 2)
    return proc


@needs_proc
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_to_a_run_of_policies_side_by_side(box, sig):
    """The group gets the signal mid-run: one line from kvsim, none from the workers, no worker, part file or
    temporary folder left."""
    scenario = box.scenario(num_requests=300_000, policy=TWO_MORE_POLICIES)
    before = snapshot(box.root)
    proc = _run_side_by_side(box, scenario, start_new_session=True)
    workers = _children(proc.pid)
    assert len(workers) == 2
    _signal_the_group(box, proc, sig, workers, before)


@needs_proc
def test_workers_die_with_a_killed_run(box):
    proc = _run_side_by_side(box, box.scenario(num_requests=300_000, policy=TWO_MORE_POLICIES))
    workers = _children(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(workers)  # PR_SET_PDEATHSIG


@needs_proc
def test_workers_die_with_a_killed_plan(box):
    proc = _child(box, ["plan", box.scenario(num_requests=2000), "--workers", "3", "--seeds", "2", "--quiet"])
    _wait_for(proc, lambda: len(_children(proc.pid)) >= 2)
    workers = _children(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(workers)  # PR_SET_PDEATHSIG: no orphan sleeps on


@needs_proc
def test_a_signal_during_start_up_is_one_line(box):
    """SIGTERM as soon as the guard is in place, while kvsim is still importing its modules."""
    proc = _child(box, ["memory", box.scenario()])

    def caught_sigterm() -> bool:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt")), 16)
        return bool(caught >> (signal.SIGTERM - 1) & 1)
    _wait_for(proc, caught_sigterm)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (143, "kvsim: terminated (SIGTERM)\n")


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGINT"])
def test_an_inherited_ignored_signal_stays_ignored(box, sig):
    """`nohup kvsim run ... &`, or a background job of a script (Ctrl-C ignored): the run completes."""
    signum = getattr(signal, sig)
    proc = _child(box, [box.scenario(num_requests=20_000), "--out", "fresh", "--quiet"],
                  preexec_fn=lambda: signal.signal(signum, signal.SIG_IGN))
    _wait_for(proc, lambda: any(box.work.glob(".fresh.tmp-*/requests.csv")))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")
    assert (box.work / "fresh" / "summary.json").is_file()


def _env(box, **extra) -> dict:
    return {**os.environ, "HOME": str(box.root / "home"), "PYTHONPATH": str(ROOT), **extra}


def _kvsim(box, argv, **kw) -> subprocess.Popen:
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "kvsim", *map(str, argv)], cwd=box.work, env=_env(box),
                            stderr=subprocess.PIPE, text=True, **kw)


def test_closed_full_and_broken_stdout(box):
    scenario = box.scenario()
    proc = _kvsim(box, [scenario, "--out", "a"], stdout=None, preexec_fn=lambda: os.close(1))  # `>&-`
    assert_one_line_error(proc.wait(timeout=120), proc.stderr.read(), ("standard output is closed: pass --quiet",))
    assert not (box.work / "a").exists()
    proc = _kvsim(box, [scenario, "--out", "a", "--quiet"], stdout=None, preexec_fn=lambda: os.close(1))
    assert (proc.wait(timeout=120), proc.stderr.read()) == (0, "") and (box.work / "a" / "summary.json").is_file()
    with open("/dev/full", "w") as full:  # `> /dev/full`
        proc = _kvsim(box, [scenario, "--out", "b"], stdout=full)
        assert_one_line_error(proc.wait(timeout=120), proc.stderr.read(),
                              ("cannot write to standard output: No space left on device",))
    assert (box.work / "b" / "summary.json").is_file()  # the results were complete before the table
    proc = _kvsim(box, ["plan", scenario, "--requests", "100", "--workers", "1"])
    proc.stdout.close()  # `| head`, gone before the table
    assert (proc.wait(timeout=120), proc.stderr.read()) == (141, "")


def test_ascii_locale_prints_escapes(box):
    scenario = box.scenario(policy=SECOND_POLICY)
    env = {k: v for k, v in _env(box, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0").items()
           if k != "PYTHONIOENCODING"}
    proc = subprocess.run([sys.executable, "-X", "utf8=0", "-m", "kvsim", str(scenario), "--out", "a"], cwd=box.work,
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    out = proc.stdout.decode("ascii")  # every byte ASCII
    assert "\\xd7" in out and "\\u202e" in out  # '×' and the bidi override, escaped


def test_too_many_open_files_is_one_line(box):
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12))
    proc = _kvsim(box, ["plan", box.scenario(), "--workers", "2", "--requests", "50", "--quiet"], preexec_fn=limit)
    assert_one_line_error(proc.wait(timeout=120), proc.stderr.read(),
                          ("cannot start 2 worker processes (Too many open files)",))


def test_out_of_memory_is_one_line(box):
    """An address-space limit set once kvsim is imported (what the OS leaves a run under ulimit -v), then a
    flood of 300,000 waiting requests."""
    script = ("import resource, sys; from kvsim.cli import main; import kvsim.pipeline; "
              "vm = int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize'))) << 10; "
              "resource.setrlimit(resource.RLIMIT_AS, (vm + (40 << 20), resource.RLIM_INFINITY)); "
              "sys.exit(main(sys.argv[1:]))")
    scenario = box.scenario(num_requests=300_000, arrival='arrival = { process = "poisson", rate = 1e6 }')
    before = snapshot(box.root)
    proc = subprocess.run([sys.executable, "-c", script, str(scenario), "--out", str(box.earlier), "--quiet"],
                          cwd=box.work, env=_env(box), capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, ("out of memory",))
    assert snapshot(box.root) == before


# ---- the dashboard, shared with a team: an uploaded scenario reads only what was uploaded with it

def test_an_uploaded_scenario_names_no_file_outside_its_upload_folder(tmp_path):
    from test_dashboard import GOOD_TOML, one_error, open_app, upload

    secret = tmp_path / "secret.json"
    secret.write_text('{"db_password_hint": "hunter2"}')
    at = open_app()
    at.sidebar.radio(key="kvsim.source").set_value("uploaded TOML").run()
    good = GOOD_TOML.decode()
    trace = good.replace('arrival = { process = "poisson", rate = 5.0 }', 'arrival = { process = "trace" }')
    for key, text in (
            ("model.hf_config", good.replace('name = "Qwen3-0.6B"', f'hf_config = "{secret}"')),
            ("backend.calibration", good + f'[backend]\ncalibration = "{secret}"\n'),
            ("backend.calibration", good + f'[backend]\ncalibration = "{"../" * 12}{str(secret)[1:]}"\n'),
            ("workload.trace.path", trace + '[workload.trace]\nformat = "csv"\npath = "../../../../../../etc/passwd"\n')):
        upload(at, "kvsim.upload_toml", "mine.toml", text.encode())
        message = one_error(at)
        assert message.startswith(f"mine.toml: {key}: an uploaded scenario may name only files uploaded"), message
        assert "secret" not in message and "passwd" not in message and "hunter2" not in message
        assert not at.get("plotly_chart")
