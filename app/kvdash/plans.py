"""Searches for the Capacity page: `kvsim.plan` and `kvsim.deploy` on the sidebar's scenario, exactly as
`kvsim plan` (and `kvsim plan --target-rate`) runs them, so the page's numbers and its plan.json are
the command line's.

Each search is cached by the scenario's TOML text, its uploads' digest and the search settings (not
the worker count: the answers are the same bytes whatever runs them), so going back to a searched
setting is instant. A search draws a progress bar fed by the library's `progress(done, total)`
callback; the bar is made inside the cached function, so a cache hit replays it (already emptied)
instead of pointing at an element of an earlier script run.

Which plans this server holds is kept beside the cache (`planned`), so a page can show a plan it
already has (the Answer page's, or an earlier search's) without asking for a button press. Plans and
aggregated deployment searches are also kept on disk (kvsim.planning.answer_cache: keyed by the
scenario's content, its input files, the settings and kvsim's code), so a fresh server answers a
scenario answered before, or precomputed with `python -m kvsim.planning.answer_cache`, at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import kvsim
from kvsim.planning import answer_cache
from kvsim.scenario.config import scenario_from_toml


@dataclass(frozen=True, slots=True)
class Settings:
    """The search settings `kvsim plan` takes as --seeds, --resolution and --requests."""

    seeds: int = 3
    resolution: float = 0.02
    num_requests: int | None = None  # None: the scenario's, at most 3000

    def cli(self) -> str:
        """The settings as `kvsim plan` flags (none for its defaults)."""
        out = (f" --seeds {self.seeds}" if self.seeds != 3 else "") + \
            (f" --resolution {self.resolution:g}" if self.resolution != 0.02 else "")
        return (out + (f" --requests {self.num_requests}" if self.num_requests else "")).strip()


DEFAULT = Settings()  # the command line's: 3 seeds, ±2%, min(scenario's requests, 3000)
TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Targets:
    """The deployment search's candidates, as `kvsim plan --target-rate R --gpu G --tp T ...` takes them."""

    target_rate: float
    policy: str | None  # None: every policy (each layout keeps its best)
    gpus: tuple[str, ...]
    tensor_parallel: tuple[int, ...]
    max_replicas: int = 64
    top: int = 3
    headroom: bool = True  # search each listed deployment's own safe rate

    def cli(self, all_gpus: tuple[str, ...]) -> str:
        out = f"--target-rate {self.target_rate:g}" + (f" --policy {self.policy}" if self.policy else "")
        if set(self.gpus) != set(all_gpus):
            out += "".join(f" --gpu {g}" for g in self.gpus)
        if tuple(self.tensor_parallel) != (1, 2, 4, 8):
            out += "".join(f" --tp {t}" for t in self.tensor_parallel)
        if self.max_replicas != 64:
            out += f" --max-replicas {self.max_replicas}"
        return out + (f" --top {self.top}" if self.top != 3 else "") + ("" if self.headroom else " --no-headroom")


class Bar:
    """A `progress(done, total)` callback drawn as a Streamlit progress bar (at most ~100 redraws)."""

    def __init__(self, label: str):
        self.label, self.shown = label, -1.0
        self.bar = st.progress(0.0, text=f"{label}: starting")

    def __call__(self, done: int, total: int) -> None:
        frac = min(1.0, done / total) if total else 0.0
        if frac - self.shown >= 0.01:
            self.shown = frac
            self.bar.progress(frac, text=f"{self.label}: {done} of about {total} points simulated")

    def close(self) -> None:
        self.bar.empty()


def _scenario(toml_text: str, source: str, base_dir: str):
    return scenario_from_toml(toml_text, source, Path(base_dir))


PLANS_KEPT = 16


class Kept:
    """Keys, the least recently used forgotten past `size` (as the cache forgets its entries); thread-safe:
    every session's script thread shares it."""

    def __init__(self, size: int):
        self.size, self.keys, self.lock = size, OrderedDict(), threading.Lock()

    def add(self, key) -> None:
        with self.lock:
            self.keys[key] = True
            self.keys.move_to_end(key)
            while len(self.keys) > self.size:
                self.keys.popitem(last=False)

    def __contains__(self, key) -> bool:
        with self.lock:
            return key in self.keys


@st.cache_resource
def _planned() -> Kept:
    return Kept(PLANS_KEPT)


def planned(toml_text: str, source: str, base_dir: str, inputs_digest: str, settings: Settings) -> bool:
    """Whether `plan` of these arguments is at hand (a cache hit: no search)."""
    return (toml_text, source, base_dir, inputs_digest, settings) in _planned()


def plan(toml_text: str, source: str, base_dir: str, inputs_digest: str, settings: Settings,
         _workers: int | None = None):
    """`kvsim.plan` of the scenario (`inputs_digest` keys the uploaded files it reads), cached."""
    result = _plan(toml_text, source, base_dir, inputs_digest, settings, _workers)
    _planned().add((toml_text, source, base_dir, inputs_digest, settings))
    return result


@st.cache_data(max_entries=PLANS_KEPT, show_spinner=False)
def _plan(toml_text: str, source: str, base_dir: str, inputs_digest: str, settings: Settings,
          _workers: int | None = None):
    scenario = _scenario(toml_text, source, base_dir)
    bar = Bar("Finding each policy's maximum sustainable rate")
    try:
        return answer_cache.plan(scenario, seeds=settings.seeds, resolution=settings.resolution,
                                 num_requests=settings.num_requests, workers=_workers, progress=bar)
    finally:
        bar.close()  # also when the search fails (one error line) or a widget change stops it


@st.cache_data(max_entries=16, show_spinner=False)
def deploy(toml_text: str, source: str, base_dir: str, inputs_digest: str, settings: Settings, targets: Targets,
           _workers: int | None = None):
    """`kvsim.deploy` of the scenario: the cheapest layouts meeting its SLO at the target rate."""
    scenario = _scenario(toml_text, source, base_dir)
    bar = Bar(f"Searching deployments for {targets.target_rate:g} req/s")
    try:
        return answer_cache.deploy(scenario, targets.target_rate, gpus=list(targets.gpus),
                                   tensor_parallel=targets.tensor_parallel, policy=targets.policy, seeds=settings.seeds,
                                   resolution=settings.resolution, num_requests=settings.num_requests, top=targets.top,
                                   max_replicas=targets.max_replicas, workers=_workers, progress=bar,
                                   headroom=targets.headroom)
    finally:
        bar.close()


@dataclass(frozen=True, slots=True)
class PDTargets:
    """The prefill:decode search's candidates, as `kvsim plan --target-rate R --disaggregated` takes them."""

    target_rate: float
    gpus: tuple[str, ...]  # each pool's candidates (and the aggregated search's)
    tensor_parallel: tuple[int, ...]
    max_replicas: int = 16

    def cli(self) -> str:
        return (f"--target-rate {self.target_rate:g} --disaggregated" + "".join(f" --gpu {g}" for g in self.gpus)
                + "".join(f" --tp {t}" for t in self.tensor_parallel) + f" --max-replicas {self.max_replicas}")


@st.cache_data(max_entries=16, show_spinner=False)
def pd_deploy(toml_text: str, source: str, base_dir: str, inputs_digest: str, settings: Settings, targets: PDTargets,
              _workers: int | None = None):
    """`kvsim.deploy(..., disaggregated=True)`: each pool layout's cheapest prefill:decode counts beside the
    cheapest aggregated deployment."""
    scenario = _scenario(toml_text, source, base_dir)
    bar = Bar(f"Searching prefill:decode counts for {targets.target_rate:g} req/s")
    try:
        return kvsim.deploy(scenario, targets.target_rate, gpus=list(targets.gpus),
                            tensor_parallel=targets.tensor_parallel, seeds=settings.seeds,
                            resolution=settings.resolution, num_requests=settings.num_requests,
                            max_replicas=targets.max_replicas, workers=_workers, progress=bar, disaggregated=True)
    finally:
        bar.close()
