"""Runs for the pages: `kvsim.run` into a temporary results folder, read back into memory (the
summaries, the files to download and the report's figures), and the folder removed.

A preview runs the first `PREVIEW_REQUESTS` requests and is cached by the scenario's TOML text and
its uploads, so a widget change redraws in well under the ~2 s budget and going back is instant; the
full run reports progress through the same `progress(label, total) -> tick(n)` callback as the CLI.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import kvsim
from kvdash.source import temp_dir
from kvsim.results.figures import report_figures
from kvsim.results.offload_report import offload_figures
from kvsim.scenario.config import scenario_from_toml
from kvsim.scenario.workload import expected_count

PREVIEW_REQUESTS = 500
DOWNLOADS = (("summary.json", "application/json"), ("requests.csv", "text/csv"), ("report.html", "text/html"))


@dataclass(frozen=True, slots=True)
class RunResult:
    toml: str  # the scenario that ran
    summaries: dict  # per policy, as in summary.json
    files: dict  # results-folder file name -> bytes
    figures: list  # the report's figures, plotly.js {"data", "layout"} dicts
    wall_s: float
    meta: dict  # summary.json's "meta": model, GPU, layout, arrivals, SLO, policy order


def run_to_memory(toml_text: str, source: str, base_dir: Path, progress=None) -> RunResult:
    """Validate and run the scenario into a temporary folder; everything it wrote, in memory."""
    scenario = scenario_from_toml(toml_text, source, base_dir)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="run-", dir=temp_dir()) as tmp:
        out = Path(tmp) / "results"
        result = kvsim.run(scenario, out_dir=out, progress=progress)
        figures = report_figures(result.summaries, out / "requests.csv", out / "timeseries.csv", result.meta)
        figures += [{"data": f.data, "layout": f.layout} for f in offload_figures(result.summaries, result.meta)]
        files = {name: (out / name).read_bytes() for name, _ in DOWNLOADS if (out / name).is_file()}
    return RunResult(toml_text, result.summaries, files, figures, time.perf_counter() - t0, result.meta)


@st.cache_data(max_entries=16, show_spinner="Simulating the preview…")  # a report.html is ~5 MB (plotly.js)
def preview(toml_text: str, source: str, base_dir: str, inputs_digest: str) -> RunResult:
    """The cached run of a preview scenario (`inputs_digest` keys the uploaded files it reads)."""
    return run_to_memory(toml_text, source, Path(base_dir))


@st.cache_data(max_entries=64, show_spinner=False)
def request_count(toml_text: str, source: str, base_dir: str, inputs_digest: str) -> int | None:
    """How many requests the scenario runs (None: unknown until run); cached, as a trace is read for it."""
    return expected_count(scenario_from_toml(toml_text, source, Path(base_dir)))


class StreamlitProgress:
    """kvsim's `progress(label, total) -> tick(n)` callback drawn as one bar over all policies."""

    def __init__(self, bar, num_policies: int):
        self.bar, self.num_policies, self.started = bar, num_policies, 0

    def __call__(self, label: str, total):
        index, done, shown = self.started, 0, [0.0]
        self.started += 1

        def tick(n: int) -> None:
            nonlocal done
            done += n
            frac = (index + (min(1.0, done / total) if total else 0.5)) / self.num_policies
            if frac - shown[0] >= 0.01:  # redraw at most a hundred times
                shown[0] = frac
                self.bar.progress(min(frac, 1.0), text=f"simulating {label}: {done:,} of {total or '?'} requests")
        self.bar.progress(index / self.num_policies, text=f"simulating {label}")
        return tick


def full_run(toml_text: str, source: str, base_dir: Path, inputs_digest: str, num_policies: int,
             container) -> RunResult:
    """Run the whole scenario with a progress bar in `container`; kept for the session."""
    bar = container.progress(0.0, text="starting")
    try:
        result = run_to_memory(toml_text, source, base_dir, StreamlitProgress(bar, num_policies))
    finally:
        bar.empty()  # a run that fails (a model that does not fit) leaves its error, not a bar
    st.session_state["kvsim.full_run"] = ((toml_text, inputs_digest), result)
    return result


def last_full_run(toml_text: str, inputs_digest: str) -> RunResult | None:
    """The session's full run, if it ran exactly this scenario on these uploads."""
    key, result = st.session_state.get("kvsim.full_run") or (None, None)
    return result if key == (toml_text, inputs_digest) else None
