"""The results folder: written into a hidden temporary sibling, renamed into place on commit.

`ResultsWriter` fills the temporary folder (requests.csv is streamed there while the simulation
runs) and renames it into place on `commit`, so a crash or Ctrl-C never leaves a half-written
results folder. `ResultsWriter(out_dir, streams=False).commit_files({...})` writes other outputs
(plan and sweep tables) the same way.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimError
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS
from kvsim.results.report import write_report_html


class ResultsWriter:
    """Writes a run's results into a temporary sibling of `out_dir`, renamed into place on commit."""

    def __init__(self, out_dir: Path, streams: bool = True):
        """`streams`: open requests.csv and timeseries.csv for a run (False: `commit_files` only)."""
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise KvsimError(f"{self.out_dir}: results path exists and is not a folder")
        parent, name = self.out_dir.parent, self.out_dir.name
        self.tmp_dir = parent / f".{name}.tmp-{os.getpid()}"
        try:
            parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)  # left by an earlier process with our pid
            self.tmp_dir.mkdir()
            if streams:
                self.requests_file = open(self.tmp_dir / "requests.csv", "w", newline="", encoding="utf-8")  # Metrics writes rows
                self._timeseries_file = open(self.tmp_dir / "timeseries.csv", "w", newline="", encoding="utf-8")
        except OSError as exc:
            self.abort()
            raise KvsimError(f"{self.out_dir}: cannot create results folder ({exc.strerror})") from None
        if streams:
            self.requests_csv = csv.writer(self.requests_file)
            self.requests_csv.writerow(REQUEST_COLUMNS)
            self._timeseries_csv = csv.writer(self._timeseries_file)
            self._timeseries_csv.writerow(TIMESERIES_COLUMNS)
        self._latencies: dict[str, dict[str, np.ndarray]] = {}
        self.committed = False

    def add_timeseries(self, policy: str, rows: list[tuple]) -> None:
        """Append one policy's time-series rows (as from `Metrics.timeseries_rows`)."""
        self._timeseries_csv.writerows(rows)

    def add_latencies(self, policy: str, latencies: dict[str, np.ndarray]) -> None:
        """One policy's finished-request latencies (as `Metrics.latencies()`) for the report's CDFs."""
        self._latencies[policy] = latencies

    def _close(self) -> None:
        for f in (getattr(self, "requests_file", None), getattr(self, "_timeseries_file", None)):
            if f is not None and not f.closed:
                f.close()

    def commit(self, scenario_name: str, summaries: dict[str, dict], meta: dict, *, report_html: bool = True) -> Path:
        """Write summary.json (and report.html), then swap the folder in for `out_dir`."""
        try:
            self._close()
            doc = {"scenario": scenario_name, "meta": meta, "policies": summaries}
            (self.tmp_dir / "summary.json").write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
            if report_html:
                write_report_html(self.tmp_dir / "report.html", scenario_name, summaries,
                                  self.tmp_dir / "requests.csv", self.tmp_dir / "timeseries.csv",
                                  self._latencies if set(self._latencies) == set(summaries) else None, meta=meta)
            self._swap_in()
        except BaseException:
            self.abort()
            raise
        self.committed = True
        return self.out_dir

    def commit_files(self, files: dict[str, str]) -> Path:
        """Write each named text file, then swap the folder in for `out_dir` (as `commit`)."""
        try:
            self._close()
            for name, text in files.items():
                (self.tmp_dir / name).write_text(text, encoding="utf-8")
            self._swap_in()
        except BaseException:
            self.abort()
            raise
        self.committed = True
        return self.out_dir

    def _swap_in(self) -> None:
        old = None
        if self.out_dir.exists():
            old = self.out_dir.parent / f".{self.out_dir.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            self.out_dir.rename(old)
        try:
            self.tmp_dir.rename(self.out_dir)
        except OSError:
            if old is not None:  # put the previous results back
                old.rename(self.out_dir)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Drop everything written so far; `out_dir` is left as it was."""
        self._close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()
