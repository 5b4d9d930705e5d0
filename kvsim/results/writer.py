"""The results folder: written into a hidden temporary sibling, renamed into place on commit.

`ResultsWriter` fills the temporary folder (requests.csv is streamed there while the simulation
runs) and renames it into place on `commit`, so a crash, a signal or a full disk never leaves a
half-written results folder, and an earlier result stays as it was until the new one is complete.

kvsim never deletes what it did not write: every results folder holds a marker file
(`.kvsim-results.json`, listing the files kvsim wrote), and the target is replaced only when it is
new, empty, or such a folder holding nothing else. `force` replaces any other folder, but never one
that holds the working directory, the home folder or one of the run's input files.
`ResultsWriter(out_dir, streams=False).commit_files({...})` writes other outputs (plan and sweep
tables) the same way.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS
from kvsim.results.figures import timeseries_arrays
from kvsim.results.report import write_report_html
from kvsim.scenario.files import read_text

MARKER = ".kvsim-results.json"
FORMAT = 1
LEGACY_FILES = frozenset({"summary.json", "requests.csv", "timeseries.csv", "report.html"})


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _marker_files(folder: Path, present: set[str]) -> set[str] | None:
    """The files kvsim wrote into `folder`, from its marker (None: not a kvsim results folder). A
    folder from before markers is recognised by holding nothing but LEGACY_FILES."""
    if MARKER not in present:
        return LEGACY_FILES if "summary.json" in present and present <= LEGACY_FILES else None
    try:
        doc = json.loads(read_text(folder / MARKER, "results marker", limit=1 << 20))
        files = doc["files"] if doc.get("format") == "kvsim-results" else None
    except (KvsimError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return set(files) | {MARKER} if isinstance(files, list) and all(isinstance(f, str) for f in files) else None


def _held_folders(inputs) -> list[tuple[Path, str]]:
    """Folders a results folder must never swallow: where the user stands, their home, the inputs."""
    held = []
    for where, what in ((Path.cwd, "the current directory"), (Path.home, "your home folder")):
        try:
            held.append((where(), what))
        except (OSError, RuntimeError):  # a deleted working directory, no home
            pass
    return held + [(Path(os.path.abspath(p)), f"input {p}") for p in inputs]


def check_target(out_dir: Path, force: bool = False, inputs=()) -> None:
    """Raise unless `out_dir` may be (re)placed by a results folder (see the module docstring)."""
    if out_dir.parent == out_dir:
        raise KvsimError(f"{out_dir}: refusing to write results over the root folder")
    if not os.path.lexists(out_dir):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise KvsimError(f"{out_dir}: results path exists and is not a folder")
    try:
        present = {p.name for p in out_dir.iterdir()}
    except OSError as exc:
        raise KvsimError(f"{out_dir}: cannot read results folder ({exc.strerror})") from None
    for held, what in _held_folders(inputs):
        if _is_within(held.resolve(), out_dir):
            raise KvsimError(f"{out_dir}: refusing to replace a folder that holds {what}: pick another --out")
    if not present or force:
        return
    ours = _marker_files(out_dir, present)
    if ours is None:
        raise KvsimError(f"{out_dir}: folder exists and is not a kvsim results folder: pass --force to replace "
                         f"it, or choose another --out")
    strangers = sorted(present - ours)
    if strangers:
        raise KvsimError(f"{out_dir}: results folder also holds files kvsim did not write ({', '.join(strangers[:3])}"
                         f"{', ...' if len(strangers) > 3 else ''}): move them, pass --force, or choose another --out")


def _cannot_write(out_dir: Path, exc: OSError) -> KvsimError:
    return KvsimError(f"cannot write results to {out_dir}: {exc.strerror or exc}")


class _GuardedFile:
    """A text file whose write errors (disk full, file too large) become one-line KvsimErrors."""

    __slots__ = ("file", "out_dir")

    def __init__(self, path: Path, out_dir: Path):
        self.file, self.out_dir = open(path, "w", newline="", encoding="utf-8"), out_dir

    def write(self, text: str) -> int:
        try:
            return self.file.write(text)
        except OSError as exc:
            raise _cannot_write(self.out_dir, exc) from None

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as exc:
            raise _cannot_write(self.out_dir, exc) from None

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            raise _cannot_write(self.out_dir, exc) from None

    @property
    def closed(self) -> bool:
        return self.file.closed


class ResultsWriter:
    """Writes a run's results into a temporary sibling of `out_dir`, renamed into place on commit."""

    def __init__(self, out_dir: Path, *, force: bool = False, inputs=(), streams: bool = True):
        """`streams`: open requests.csv and timeseries.csv for a run (False: `commit_files` only)."""
        try:
            self.out_dir = Path(out_dir).expanduser().resolve()
        except (OSError, RuntimeError) as exc:
            raise KvsimError(f"{out_dir}: cannot use as results folder ({exc})") from None
        self.force, self.inputs = force, list(inputs)
        check_target(self.out_dir, force, self.inputs)
        self.committed = False
        self._created: list[Path] = []  # parent folders made here, removed again on abort
        self.tmp_dir = None
        self.requests_file = self._timeseries_file = None
        with self._aborting():
            self._make_parents(self.out_dir.parent)
            self.tmp_dir = self._fresh_dir("tmp")
            if streams:
                self.requests_file = _GuardedFile(self.tmp_dir / "requests.csv", self.out_dir)  # Metrics writes rows
                self._timeseries_file = _GuardedFile(self.tmp_dir / "timeseries.csv", self.out_dir)
                self.requests_csv = csv.writer(self.requests_file)
                self.requests_csv.writerow(REQUEST_COLUMNS)
                self._timeseries_csv = csv.writer(self._timeseries_file)
                self._timeseries_csv.writerow(TIMESERIES_COLUMNS)
        self._latencies: dict[str, dict[str, np.ndarray]] = {}
        self._series: dict[tuple[str, int], dict[str, np.ndarray]] = {}  # the report's, as timeseries_arrays
        self._series_policies: set[str] = set()

    def _make_parents(self, folder: Path) -> None:
        missing = []
        while not os.path.lexists(folder):
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            self._created.append(d)

    def _fresh_dir(self, kind: str) -> Path:
        """A new hidden sibling of out_dir (never an existing one: kvsim deletes only what it made)."""
        while True:
            path = self.out_dir.parent / f".{self.out_dir.name[:100]}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue

    def add_timeseries(self, policy: str, rows: list[tuple]) -> None:
        """Append one policy's time-series rows (as from `Metrics.timeseries_rows`)."""
        self._timeseries_csv.writerows(rows)
        self._series.update(timeseries_arrays(rows))
        self._series_policies.add(policy)

    def add_latencies(self, policy: str, latencies: dict[str, np.ndarray]) -> None:
        """One policy's finished-request latencies (as `Metrics.latencies()`) for the report's CDFs."""
        self._latencies[policy] = latencies

    def _close(self) -> None:
        for f in (self.requests_file, self._timeseries_file):
            if f is not None and not f.closed:
                f.close()

    def commit(self, scenario_name: str, summaries: dict[str, dict], meta: dict, *, report_html: bool = True) -> Path:
        """Write summary.json (and report.html) and the marker, then swap the folder in for `out_dir`."""
        def write() -> None:
            doc = {"scenario": scenario_name, "meta": meta, "policies": summaries}
            (self.tmp_dir / "summary.json").write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
            if report_html:
                write_report_html(self.tmp_dir / "report.html", scenario_name, summaries,
                                  self.tmp_dir / "requests.csv", self.tmp_dir / "timeseries.csv",
                                  self._latencies if set(self._latencies) == set(summaries) else None, meta=meta,
                                  series=self._series if self._series_policies == set(summaries) else None)
        return self._commit(write)

    def commit_files(self, files: dict[str, str]) -> Path:
        """Write each named text file and the marker, then swap the folder in for `out_dir` (as `commit`)."""
        def write() -> None:
            for name, text in files.items():
                (self.tmp_dir / name).write_text(text, encoding="utf-8")
        return self._commit(write)

    def _commit(self, write) -> Path:
        with self._aborting():
            self._close()
            write()
            files = sorted(p.name for p in self.tmp_dir.iterdir())
            marker = {"format": "kvsim-results", "version": FORMAT, "files": files}
            (self.tmp_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
            check_target(self.out_dir, self.force, self.inputs)  # again: the run took a while
            self._swap_in()
        self.committed = True
        return self.out_dir

    @contextmanager
    def _aborting(self):
        """Anything raised inside removes the temporary folder; an OSError becomes one line."""
        try:
            yield
        except OSError as exc:
            self.abort()
            raise _cannot_write(self.out_dir, exc) from None
        except BaseException:
            self.abort()
            raise

    def _swap_in(self) -> None:
        if not os.path.lexists(self.out_dir):
            os.rename(self.tmp_dir, self.out_dir)
            return
        old = self._fresh_dir("old")
        try:
            os.rename(self.out_dir, old)  # onto the empty `old`: allowed for folders
            os.rename(self.tmp_dir, self.out_dir)
        except BaseException:  # an error or a signal: the state says how far the swap got
            if not os.path.lexists(self.out_dir):
                os.rename(old, self.out_dir)  # put the previous results back
            elif os.path.lexists(self.tmp_dir):
                old.rmdir()  # nothing moved yet
            else:
                shutil.rmtree(old, ignore_errors=True)  # swapped: the new results stand
            raise
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Drop everything written so far; `out_dir` is left as it was. Never raises."""
        for f in (self.requests_file, self._timeseries_file):
            try:
                if f is not None and not f.closed:
                    f.file.close()
            except Exception:  # a full disk fails the final flush; the file is closed all the same
                pass
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        for d in reversed(self._created):
            try:
                d.rmdir()
            except OSError:
                pass
        self._created = []

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()
