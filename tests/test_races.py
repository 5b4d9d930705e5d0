"""The last races (issue 25): what the user puts at an output path while kvsim runs is never deleted or
overwritten, whatever kvsim checked before, and what kvsim leaves beside it is its own to clean.

Each race is forced at its exact point by wrapping the step kvsim takes next (as test_hostile_classes
does), in this process; a killed run is a child process. The rule under test: what was at the output
when the command started (nothing, an earlier kvsim results folder, an earlier calibration) is the only
thing it may replace, and only as it was then: a folder or file that appears later, or one changed or
replaced since (an inode number is reused at once on ext4: the same number is not the same file), is
left as it is, with one line and exit code 2. Also: a temporary name already taken, a temporary left by
a killed run, a Vidur table of vocab size 0, and a folder given where a table is expected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kvsim.calibrate.fit  # noqa: F401 (wrapped below: the fit is where calibrate spends its time)
from kvsim.cli import main
from kvsim.results.target import HOST
from test_hostile import ROOT, assert_one_line_error, snapshot
from test_hostile import box, earlier_results  # noqa: F401 (fixtures)
from test_hostile_classes import ALL_REDUCE_ZERO, MARKER, _folder, _replace_earlier, _wrap

ALL_REDUCE = ALL_REDUCE_ZERO.replace("0,2", "0.03,2")  # an all-reduce table calibrate fits in a second
OTHER_CALIBRATION = json.dumps({"written_by": "kvsim calibrate", "coefficients": {"step_overhead_s": 0.004}})


def _calibrate(b, out: str = "cal.json") -> list:
    return ["calibrate", str(b.file("all_reduce.csv", ALL_REDUCE)), "--gpu", "H100-SXM", "-o", out, "--max-error",
            "10"]


def _run(b, *extra) -> list:
    return [str(b.scenario()), "--quiet", *extra]


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name != MARKER)


def _unchanged_but(before: dict, after: dict, *outs: str) -> None:
    keep = lambda snap: {k: v for k, v in snap.items() if not any(k == o or k.startswith(o + "/") for o in outs)}
    assert keep(after) == keep(before)


# ---- (a) the results folder's swap -----------------------------------------------------------------

def test_force_never_takes_a_folder_that_appeared_after_the_start(box, capsys, monkeypatch):
    """--force consents to what was at --out when the command started: nothing. A user's folder that
    appears before the no-replace rename is left whole (it used to be vetted again, swapped out and
    deleted with its files)."""
    argv = _run(box, "--out", "results/new", "--force")
    before = snapshot(box.root)
    with monkeypatch.context() as mp:
        _wrap("kvsim.results.writer.rename_noreplace", lambda b, *a: _folder(b, "results/new", {"precious.txt": "mine"})
              )(mp, box)
        code = main(argv)
    assert_one_line_error(code, capsys.readouterr().err, ("results/new", "appeared while kvsim ran"))
    assert (box.work / "results/new/precious.txt").read_text() == "mine"
    assert os.listdir(box.work / "results/new") == ["precious.txt"] and _hidden(box.work / "results") == []
    _unchanged_but(before, snapshot(box.root), "work/results/new")


def test_force_never_takes_a_folder_put_in_place_of_the_earlier_results(box, capsys, monkeypatch):
    """--force on earlier results: the user moves them aside and puts their own folder there before the
    exchange. Their folder stays at --out with its files, the earlier results where they moved them."""
    earlier = snapshot(box.earlier)
    with monkeypatch.context() as mp:
        _wrap("kvsim.results.writer.rename_exchange", _replace_earlier)(mp, box)
        code = main(_run(box, "--out", str(box.earlier), "--force"))
    assert_one_line_error(code, capsys.readouterr().err, ("earlier", "changed while kvsim ran"))
    assert os.listdir(box.earlier) == ["thesis.tex"] and (box.earlier / "thesis.tex").read_text() == "mine"
    assert snapshot(box.work / "moved-earlier") == earlier and _hidden(box.work / "results") == []


def test_a_folder_of_kvsim_names_reusing_the_inode_is_not_the_earlier_results(box, capsys, monkeypatch):
    """The user deletes the earlier results and makes a folder of their own holding a `summary.json`:
    ext4 gives it the freed inode number at once, and its names are names kvsim writes. Not vetted."""
    def replace(b, *args):
        inode = os.stat(b.earlier).st_ino
        for p in b.earlier.iterdir():
            p.unlink()
        b.earlier.rmdir()
        _folder(b, "results/earlier", {"summary.json": "my own summary"})
        replace.reused = os.stat(b.earlier).st_ino == inode
    with monkeypatch.context() as mp:
        _wrap("kvsim.results.writer.rename_exchange", replace)(mp, box)
        code = main(_run(box, "--out", str(box.earlier)))
    assert_one_line_error(code, capsys.readouterr().err, ("earlier",))
    assert os.listdir(box.earlier) == ["summary.json"]
    assert (box.earlier / "summary.json").read_text() == "my own summary" and _hidden(box.work / "results") == []


@pytest.mark.parametrize("content", [{"precious.txt": "mine"}, {}], ids=["with files", "empty"])
def test_the_two_rename_fallback_never_takes_a_folder_appearing_between_its_renames(box, capsys, monkeypatch,
                                                                                    content):
    """Without RENAME_EXCHANGE the swap is two renames, --out missing between them: a folder made there
    then is kept (an empty one used to be replaced, one with files cost the earlier results, left hidden
    and removed by the next run), and the line says where the earlier results are."""
    import kvsim.results.writer as writer

    real, calls = os.rename, []

    def rename(a, b):
        calls.append(a)
        real(a, b)
        if len(calls) == 1:  # --out moved aside: the user's folder appears
            _folder(box, "results/earlier", content)
    earlier = snapshot(box.earlier)
    with monkeypatch.context() as mp:
        mp.setattr(writer, "rename_exchange", lambda a, b: False)
        mp.setattr(writer.os, "rename", rename)
        code = main(_run(box, "--out", str(box.earlier)))
    err = capsys.readouterr().err
    assert_one_line_error(code, err, ("earlier", "appeared while kvsim ran", "the earlier results are in"))
    assert sorted(os.listdir(box.earlier)) == sorted(content)
    kept = box.work / "results" / err.rsplit("the earlier results are in ", 1)[1].split()[0].rstrip(")").split("/")[-1]
    assert snapshot(kept) == earlier


def test_a_swap_without_interference_still_replaces_the_earlier_results(box, monkeypatch):
    for exchange in (True, False):
        if not exchange:
            monkeypatch.setattr("kvsim.results.writer.rename_exchange", lambda a, b: False)
        assert main(_run(box, "--out", str(box.earlier), "--set", f"workload.seed={7 + exchange}")) == 0
        assert json.loads((box.earlier / "summary.json").read_text())["policies"]["paged"]
        assert _hidden(box.work / "results") == []


# ---- (b) single files: calibrate -o, validate --out ------------------------------------------------

def test_calibrate_never_replaces_a_calibration_that_appeared_during_the_fit(box, capsys, monkeypatch):
    """Nothing at -o when calibrate started; another calibration is written there during the fit (another
    run, a copy): kvsim calibrate wrote its like, but not this one, and it is not replaced."""
    with monkeypatch.context() as mp:
        _wrap("kvsim.calibrate.fit.fit", lambda b, *a: (b.work / "cal.json").write_text(OTHER_CALIBRATION))(mp, box)
        code = main(_calibrate(box))
    assert_one_line_error(code, capsys.readouterr().err, ("cal.json", "appeared while kvsim ran"))
    assert (box.work / "cal.json").read_text() == OTHER_CALIBRATION and _hidden(box.work) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["RENAME_EXCHANGE", "without it"])
def test_calibrate_replaces_its_earlier_file_only_as_it_was(box, capsys, monkeypatch, exchange):
    """An earlier calibration at -o, vetted when calibrate started, rewritten in place by the user during
    the fit (the same inode): not replaced. Left alone, it is replaced, with or without RENAME_EXCHANGE."""
    if not exchange:
        monkeypatch.setattr("kvsim.scenario.publish.rename_exchange", lambda a, b: False)
    assert main(_calibrate(box)) == 0
    first = (box.work / "cal.json").read_text()
    edited = first.replace('"written_by": "kvsim calibrate"', '"written_by": "kvsim calibrate", "note": "mine"')
    with monkeypatch.context() as mp:
        _wrap("kvsim.calibrate.fit.fit", lambda b, *a: (b.work / "cal.json").write_text(edited))(mp, box)
        code = main(_calibrate(box))
    assert_one_line_error(code, capsys.readouterr().err, ("cal.json", "changed while kvsim ran"))
    assert (box.work / "cal.json").read_text() == edited and _hidden(box.work) == []
    assert main(_calibrate(box)) == 0
    assert "note" not in (box.work / "cal.json").read_text() and _hidden(box.work) == []


def test_without_exchange_a_file_appearing_after_the_earlier_one_moved_aside_stays(box, capsys, monkeypatch):
    """Without RENAME_EXCHANGE calibrate moves its earlier file aside, then publishes with no-replace: a file
    made at -o between the two stays, and the earlier calibration is kept under the name the line gives."""
    monkeypatch.setattr("kvsim.scenario.publish.rename_exchange", lambda a, b: False)
    assert main(_calibrate(box)) == 0
    first = (box.work / "cal.json").read_text()
    with monkeypatch.context() as mp:
        _wrap("kvsim.scenario.publish.rename_noreplace", lambda b, *a: (b.work / "cal.json").write_text("mine"))(mp, box)
        code = main(_calibrate(box))
    err = capsys.readouterr().err
    assert_one_line_error(code, err, ("cal.json: a file appeared there while kvsim replaced its earlier one",))
    kept = Path(err.rsplit("the earlier file is now ", 1)[1].rstrip(")\n"))
    assert (box.work / "cal.json").read_text() == "mine" and kept.read_text() == first
    assert _hidden(box.work) == [kept.name] and kept.name.startswith(".cal.json.kept-")
    assert main(_calibrate(box)) == 2 and kept.read_text() == first  # refused (cal.json is the user's); kept stays
    assert "cal.json: already exists" in capsys.readouterr().err


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "hard link"])
def test_validate_never_overwrites_a_file_appearing_before_it_publishes(box, capsys, monkeypatch, renameat2):
    with monkeypatch.context() as mp:
        if not renameat2:
            mp.setattr("kvsim.scenario.publish._RENAMEAT2", None)
        _wrap("kvsim.scenario.publish.rename_noreplace", lambda b, *a: (b.work / "e.json").write_text("mine"))(mp, box)
        code = main(["validate", str(box.scenario()), "--measured", str(box.earlier), "--out", "e.json"])
    assert_one_line_error(code, capsys.readouterr().err, ("e.json", "kvsim does not overwrite"))
    assert (box.work / "e.json").read_text() == "mine" and _hidden(box.work) == []


# ---- (c) temporary names ---------------------------------------------------------------------------

def test_a_temporary_name_already_taken_is_left_and_another_used(box, monkeypatch):
    """Someone's file holds the hidden name kvsim draws first: kvsim draws again, publishes, and leaves
    that file as it was and nothing else beside the output."""
    draws = iter(["deadbeef", "0badc0de", "feedf00d", "c0ffee00"])
    monkeypatch.setattr("kvsim.scenario.publish.secrets.token_hex", lambda n: next(draws))
    for name in (f".e.json.tmp-{os.getpid()}-deadbeef", f".e.json.tmp-{os.getpid()}-{HOST}-deadbeef"):
        (box.work / name).write_text("someone's")
    taken = sorted(_hidden(box.work))
    assert main(["validate", str(box.scenario()), "--measured", str(box.earlier), "--out", "e.json"]) == 0
    assert json.loads((box.work / "e.json").read_text())["records"]
    assert _hidden(box.work) == taken and all((box.work / n).read_text() == "someone's" for n in taken)


KILLED_AT_PUBLISH = """
import os, signal, sys
import kvsim.scenario.publish as publish
publish.rename_noreplace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
import kvsim.calibrate.fit  # noqa: F401 (wrapped below: the fit is where calibrate spends its time)
from kvsim.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_temporary_of_a_killed_run_is_removed_by_the_next(box):
    """SIGKILL (the OOM killer, a closed laptop) between writing the hidden temporary and publishing it:
    the next run of a command writing that file removes it (a dead process of this machine made it)."""
    argv = ["validate", str(box.scenario()), "--measured", str(box.earlier), "--out", "e.json"]
    env = {**os.environ, "HOME": str(box.root / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_PUBLISH, *argv], cwd=box.work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = _hidden(box.work)
    assert len(left) == 1 and left[0].startswith(".e.json.tmp-"), left
    (box.work / ".e.json.tmp-1-mine").write_text("a user's file of a similar name")
    assert main(argv) == 0
    assert _hidden(box.work) == [".e.json.tmp-1-mine"] and (box.work / "e.json").is_file()


# ---- (d), (e) calibrate's tables -------------------------------------------------------------------

def _vidur_mlp(b, vocab: str) -> Path:
    ops = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
    head = [f"time_stats.{op}.median" for op in ops] + ["n_head", "n_kv_head", "n_embd", "n_expanded_embd",
                                                         "vocab_size", "use_gated_mlp", "num_tokens",
                                                         "num_tensor_parallel_workers"]
    row = [f"{0.01 * (i + 1)}" for i in range(len(ops))] + ["32", "8", "4096", "14336", vocab, "True", "512", "1"]
    folder = b.inp / "h100" / "llama"
    folder.mkdir(parents=True)
    (folder / "mlp.csv").write_text(",".join(head) + "\n" + ",".join(row) + "\n")
    return folder / "mlp.csv"


def test_a_vidur_table_of_vocab_size_zero_is_one_line(box, capsys):
    path = _vidur_mlp(box, "0")
    before = snapshot(box.root)
    code = main(["calibrate", str(path), "-o", "cal.json"])
    assert_one_line_error(code, capsys.readouterr().err, ("mlp.csv:2: vocab_size: must be a whole number >= 1",))
    assert snapshot(box.root) == before


@pytest.mark.parametrize("where", ["first", "second", "only, with --serving", "-o", "validate --out"])
def test_a_folder_where_a_file_is_expected_is_named(box, capsys, where):
    folder = box.inp / "tables"
    folder.mkdir()
    table = str(box.file("all_reduce.csv", ALL_REDUCE))
    argv = {"first": ["calibrate", str(folder), table, "--gpu", "H100-SXM", "-o", "cal.json"],
            "second": ["calibrate", table, str(folder), "--gpu", "H100-SXM", "-o", "cal.json"],
            "only, with --serving": ["calibrate", str(folder), "--serving", str(box.scenario()), table, "-o", "t.npz"],
            "-o": ["calibrate", table, "--gpu", "H100-SXM", "-o", str(folder)],
            "validate --out": ["validate", str(box.scenario()), "--measured", str(box.earlier), "--out",
                               str(box.inp / "e.json")]}[where]
    if where == "validate --out":
        (box.inp / "e.json").mkdir()
        folder = box.inp / "e.json"
    before = snapshot(box.root)
    code = main(argv)
    assert_one_line_error(code, capsys.readouterr().err, (f"{folder}: ", "folder"))
    assert snapshot(box.root) == before
