"""The results folder: written into a hidden temporary sibling, put in place in one step on commit.

`ResultsWriter` fills the temporary folder (requests.csv is streamed there while the simulation
runs) and puts it in place on `commit`, so a crash, a signal or a full disk never leaves a
half-written results folder, and an earlier result stays as it was until the new one is complete.
What may be replaced, and how leftovers of killed runs are recovered, is kvsim.results.target's.

Putting in place: what may be replaced was vetted when the command started (kvsim.results.target), and
only that, as it was then, is replaced: a new target is taken with a rename that never replaces
(RENAME_NOREPLACE); an existing one is swapped with the new folder in one step (RENAME_EXCHANGE), so
that at every instant the target holds the old or the new results; then what was swapped out is checked
to be what was vetted (else swapped back) and removed. Without renameat2 (kvsim.scenario.publish) the
swap is a rename aside and a no-replace rename in, and a run killed between them leaves the target
missing and the old results in a hidden `.NAME.old-*` sibling, which the next run puts back
(kvsim.results.target.recover_leftovers); a folder made at the target between them is left there, and
the earlier results kept under a hidden `.NAME.kept-*` name the error line gives.
`ResultsWriter(out_dir, streams=False).commit_files({...})` writes other outputs (plan and sweep
tables) the same way.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.guard import deferred_signals
from kvsim.results.cells import csv_cell
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS
from kvsim.results.figures import timeseries_arrays
from kvsim.results.report import write_report_html
from kvsim.results.target import (FORMAT, HOST, LEGACY_FILES, MARKER, Vetted, check_target,  # noqa: F401
                                  recover_leftovers, results_path)
from kvsim.scenario.publish import hidden_name, rename_exchange, rename_noreplace, stamp


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
    """Writes a run's results into a temporary sibling of `out_dir`, put in place on commit."""

    def __init__(self, out_dir: Path, *, force: bool = False, inputs=(), streams: bool = True,
                 vetted: Optional[Vetted] = None):
        """`streams`: open requests.csv and timeseries.csv for a run (False: `commit_files` only). `vetted`:
        what `check_target` found when the command started, if that was before this writer (plan, sweep)."""
        self.out_dir = results_path(out_dir)
        self.force, self.inputs = force, list(inputs)
        self.committed = False
        self._created: list[Path] = []  # parent folders made here, removed again on abort
        self.tmp_dir = None
        self.requests_file = self._timeseries_file = None
        recover_leftovers(self.out_dir)
        now = check_target(self.out_dir, force, self.inputs)
        if vetted is not None and now != vetted:
            raise self._moved(vetted)
        self.vetted = now  # what the results may replace, as it is now: only that, only so
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
        while not os.path.lexists(folder):  # a dangling link above the target stops here: mkdir fails under it
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            self._created.append(d)

    def _hidden(self, kind: str) -> Path:
        """A hidden sibling name of out_dir, naming this process and machine (see recover_leftovers)."""
        return hidden_name(self.out_dir, kind)

    def _fresh_dir(self, kind: str) -> Path:
        """A new hidden sibling of out_dir (never an existing one: kvsim deletes only what it made)."""
        while True:
            path = self._hidden(kind)
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue

    def requests_part(self, index: int) -> _GuardedFile:
        """A file for one policy's requests.csv rows written by a worker process: part `index`, in
        the temporary folder until `add_requests_part(index)` appends it to requests.csv."""
        return _GuardedFile(self._part(index), self.out_dir)

    def add_requests_part(self, index: int) -> None:
        """Append part `index` (rows a worker wrote, `requests_part`) to requests.csv, and remove it."""
        path = self._part(index)
        with self._aborting(), open(path, encoding="utf-8", newline="") as part:
            while True:
                text = part.read(1 << 20)
                if not text:
                    break
                self.requests_file.write(text)
        path.unlink()

    def _part(self, index: int) -> Path:
        return self.tmp_dir / f".requests-{index}.part"

    def add_timeseries(self, policy: str, rows: list[tuple]) -> None:
        """Append one policy's time-series rows (as from `Metrics.timeseries_rows`)."""
        name = csv_cell(policy)
        self._timeseries_csv.writerows(rows if name == policy else ((name, *row[1:]) for row in rows))
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
        """Write summary.json (and report.html) and the marker, then put the folder in place at `out_dir`."""
        def write() -> None:
            doc = {"scenario": scenario_name, "meta": meta, "policies": summaries}
            text = json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"
            (self.tmp_dir / "summary.json").write_text(text, encoding="utf-8")
            if report_html:
                write_report_html(self.tmp_dir / "report.html", scenario_name, summaries,
                                  self.tmp_dir / "requests.csv", self.tmp_dir / "timeseries.csv",
                                  self._latencies if set(self._latencies) == set(summaries) else None, meta=meta,
                                  series=self._series if self._series_policies == set(summaries) else None)
        return self._commit(write)

    def commit_files(self, files: dict[str, str]) -> Path:
        """Write each named text file and the marker, then put the folder in place at `out_dir` (as `commit`)."""
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
            old = self._swap_in()
        self.committed = True
        if old is not None:
            self._remove_old(*old)
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

    def _swap_in(self) -> Optional[tuple[Path, Vetted]]:
        """Put tmp_dir in place at out_dir; (where the replaced target now is, what was vetted), or None.
        Only what was vetted when the command started is replaced, as it was then: anything that appeared
        or changed since stays, and nothing is replaced (the one line says why)."""
        vetted = self._vet_again()
        if vetted.kind == "absent":
            try:
                with deferred_signals():  # the rename and knowing it happened go together
                    rename_noreplace(self.tmp_dir, self.out_dir)
                    self.tmp_dir = None
            except FileExistsError:  # something appeared at out_dir since the check: say what, nothing replaced
                self._vet_again()
                raise self._moved(self.vetted) from None
            return None
        with deferred_signals():
            if not rename_exchange(self.tmp_dir, self.out_dir):
                return self._two_step_swap(vetted)
            old, self.tmp_dir = self.tmp_dir, None  # the new results stand; old holds what was at out_dir
        if self._is_vetted(old, vetted):
            return old, vetted
        with deferred_signals():
            rename_exchange(old, self.out_dir)  # replaced since the check: put it back, ours back to tmp
            self.tmp_dir = old
        self._vet_again()
        raise self._moved(vetted)  # not reached: vetting again found the change

    def _vet_again(self) -> Vetted:
        """`check_target` again (its reasons name what is wrong), then: is it still what was vetted?"""
        now = check_target(self.out_dir, self.force, self.inputs)
        if now != self.vetted:
            raise self._moved(self.vetted)
        return now

    def _moved(self, vetted: Vetted) -> KvsimError:
        if vetted.kind == "absent":
            return KvsimError(f"{self.out_dir}: a folder appeared while kvsim ran (nothing was there when it started); "
                              "nothing replaced")
        return KvsimError(f"{self.out_dir}: changed while kvsim ran (it is not what kvsim checked when it started); "
                          "nothing replaced")

    @staticmethod
    def _is_vetted(path: Path, vetted: Vetted) -> bool:
        """Whether `path` is what `check_target` vetted: the same folder unchanged, holding no name it did not vet."""
        try:
            if stamp(os.lstat(path)) != vetted.ident:
                return False
            return vetted.ours is None or set(os.listdir(path)) <= vetted.ours
        except OSError:
            return False

    def _two_step_swap(self, vetted: Vetted) -> Optional[tuple[Path, Vetted]]:
        """The fallback without RENAME_EXCHANGE: out_dir renamed aside, checked, then tmp_dir put in with the
        no-replace rename; between the two out_dir is missing (a killed run is recovered by the next one:
        recover_leftovers), and a folder made there meanwhile is left as it is."""
        old = self._hidden("old")
        os.rename(self.out_dir, old)  # whatever is at out_dir now, in one step
        if not self._is_vetted(old, vetted):
            kept = self._keep(old, "what was at the results path")
            if kept != self.out_dir:
                raise KvsimError(f"{self.out_dir}: changed twice while kvsim ran; nothing replaced, what was there "
                                 f"is in {kept}")
            self._vet_again()
            raise self._moved(vetted)
        try:
            rename_noreplace(self.tmp_dir, self.out_dir)
        except FileExistsError:
            kept = self._keep(old, "the earlier results")
            raise KvsimError(f"{self.out_dir}: a folder appeared while kvsim ran, between the two renames of its swap; "
                             f"nothing replaced, the earlier results are in {kept}") from None
        except BaseException:
            self._keep(old, "the earlier results")
            raise
        self.tmp_dir = None
        return old, vetted

    def _keep(self, old: Path, what: str) -> Path:
        """Put `old` back at out_dir; if something is there now, under a hidden name no run removes."""
        try:
            rename_noreplace(old, self.out_dir)
            return self.out_dir
        except FileExistsError:
            kept = self._hidden("kept")
            rename_noreplace(old, kept)
            return kept
        except OSError as exc:
            raise KvsimError(f"{self.out_dir}: {what} could not be put back from {old} ({exc.strerror})") from None

    def _remove_old(self, old: Path, vetted: Vetted) -> None:
        """Remove what the new results replaced: a link, a forced folder whole, else the vetted names."""
        try:
            if vetted.kind == "link":
                os.unlink(old)
            elif vetted.ours is None:
                shutil.rmtree(old)
            else:
                for name in vetted.ours:
                    try:
                        os.unlink(old / name)
                    except FileNotFoundError:
                        pass
                os.rmdir(old)
        except OSError as exc:
            raise KvsimError(f"results written to {self.out_dir}, but the earlier results it replaced could not be "
                             f"removed from {old} ({exc.strerror or exc})") from None

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
            self.tmp_dir = None
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
