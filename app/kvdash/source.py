"""Where the dashboard's scenario starts: a shipped `scenarios/*.toml` or an uploaded TOML, optionally
with an uploaded trace or Hugging Face `config.json`.

Uploads are size-capped, checked as the command line checks files (the strict scenario schema, the
config.json reader) and written only under one temporary folder, which is removed when the server
exits. What an upload changes is said as `--set` overrides, like every other setting.

A dashboard may be shared, so an uploaded scenario is confined to its own upload folder: each path it
names (`model.hf_config`, `workload.trace.path`, `backend.calibration`) must resolve, links followed,
inside this session's upload folder, or the page shows one line that names the key and no server file
(nothing outside is read, so no error can tell whether a file exists or what it holds). Shipped
scenarios name the project's own files and are not confined.
"""

from __future__ import annotations

import copy
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import kvsim
from kvsim.errors import KvsimError
from kvsim.perf.calibration import ENGINES
from kvsim.scenario.catalog import load_hf_config
from kvsim.scenario.config import Scenario, name_from_stem, scenario_from_dict, scenario_from_toml
from kvsim.scenario.files import check_values, parse_toml, read_text
from kvsim.scenario.overrides import apply_overrides

SCENARIO_DIR = Path(kvsim.__file__).resolve().parent.parent / "scenarios"
DEFAULT_SCENARIO = "chat"
MAX_TOML_BYTES = 256 << 10
MAX_CONFIG_BYTES = 256 << 10
MAX_TRACE_BYTES = 100 << 20
TRACE_FORMATS = ("azure", "mooncake", "csv")
# Scenario keys that hold a path, relative to the scenario file's folder.
PATH_KEYS = (("model", "hf_config"), ("workload", "trace", "path"), ("backend", "calibration"))


class Waiting(Exception):
    """Nothing chosen yet, and nothing wrong: the page asks for the upload (a prompt, not an error)."""


@dataclass(frozen=True, slots=True)
class Base:
    """The starting scenario, before the settings widgets: its data (paths made absolute), validated."""

    data: dict
    scenario: Scenario
    source: str  # names the file in error messages
    base_dir: Path
    overrides: tuple[str, ...]  # what the uploads changed, as `--set` overrides
    digest: str  # of the scenario text and every upload: keys the widgets and the run cache
    upload_dir: Path


@st.cache_resource
def _temp_root() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="kvsim-dashboard-")


def temp_dir() -> Path:
    """This server's temporary folder: everything the dashboard writes goes under it."""
    return Path(_temp_root().name)


def upload_dir() -> Path:
    """This session's folder for uploaded files (an uploaded scenario's relative paths start here)."""
    if "kvsim.upload_dir" not in st.session_state:
        st.session_state["kvsim.upload_dir"] = tempfile.mkdtemp(prefix="uploads-", dir=temp_dir())
    return Path(st.session_state["kvsim.upload_dir"])


def shipped_scenarios() -> list[str]:
    """scenarios/*.toml, then the autoscaled days of scenarios/autoscale/ (as "autoscale/NAME")."""
    if not SCENARIO_DIR.is_dir():
        return []
    return (sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
            + sorted(f"autoscale/{p.stem}" for p in (SCENARIO_DIR / "autoscale").glob("*.toml")))


def _read_upload(upload, what: str, limit: int) -> bytes:
    data = upload.getvalue()
    if len(data) > limit:
        raise KvsimError(f"{upload.name}: {what} is {len(data):,} bytes, over the dashboard's "
                         f"{limit:,}-byte limit for uploads")
    return data


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name).lstrip(".") or "upload"


def save_upload(upload, what: str, limit: int, name: str | None = None,
                folder: str | None = None) -> tuple[Path, bytes]:
    """Write an uploaded file into this session's upload folder (under a safe name); its path and bytes."""
    data = _read_upload(upload, what, limit)
    path = upload_dir() / _safe_name(name or upload.name)
    if folder:
        path = upload_dir() / _safe_name(folder) / path.name
        path.parent.mkdir(exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
    return path, data


def toml_value(value) -> str:
    """A value as `--set` reads it (TOML; tables inline)."""
    import tomli_w

    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return tomli_w.dumps({"v": value})[4:].strip()


def _absolute_paths(data: dict, base_dir: Path, confined_to: Path | None = None, source: str = "") -> dict:
    """The path keys made absolute (from `base_dir`); with `confined_to`, each must resolve inside it."""
    for *tables, key in PATH_KEYS:
        table = data
        for t in tables:
            table = table.get(t) if isinstance(table, dict) else None
        if not isinstance(table, dict) or not isinstance(table.get(key), str):
            continue
        if key == "calibration" and table[key] in ENGINES:  # a shipped calibration by name, not a path
            continue
        try:
            path = Path(table[key]) if confined_to is not None else Path(table[key]).expanduser()
            path = (path if path.is_absolute() else base_dir / path).resolve()
        except (OSError, RuntimeError, ValueError):
            path = None
        if confined_to is not None and (path is None or confined_to.resolve() not in path.parents):
            raise KvsimError(f"{source}: {'.'.join((*tables, key))}: an uploaded scenario may name only files "
                             "uploaded with it (upload the trace or config.json below)")
        if path is not None:
            table[key] = str(path)
    return data


def _guess_format(name: str, head: bytes) -> str:
    if name.endswith(".jsonl"):
        return "mooncake"
    return "csv" if head.lstrip().lower().startswith(b"arrival_s") else "azure"


def _scenario_file(container) -> tuple[str, str, Path, str]:
    """(text, name in errors, folder its paths start from, default scenario name) of the chosen file."""
    shipped = shipped_scenarios()
    modes = (["shipped scenario"] if shipped else []) + ["uploaded TOML"]
    if container.radio("Start from", modes, horizontal=True, key="kvsim.source") == "shipped scenario":
        name = container.selectbox("Scenario", shipped, key="kvsim.shipped",
                                   index=shipped.index(DEFAULT_SCENARIO) if DEFAULT_SCENARIO in shipped else 0,
                                   help=f"A scenario file from {SCENARIO_DIR}")
        path = SCENARIO_DIR / f"{name}.toml"
        return read_text(path, "scenario file"), f"scenarios/{name}.toml", SCENARIO_DIR, name_from_stem(name)
    upload = container.file_uploader("Scenario TOML", type=["toml"], key="kvsim.upload_toml", max_upload_size=1,
                                     help="A scenario file as `python -m kvsim` reads it (at most "
                                          f"{MAX_TOML_BYTES >> 10} KiB); relative paths in it name files "
                                          "uploaded beside it.")
    if upload is None:
        raise Waiting("Upload a scenario TOML file (Advanced, in the sidebar), or start from a shipped scenario.")
    path, _ = save_upload(upload, "scenario file", MAX_TOML_BYTES)
    text = read_text(path, "scenario file", limit=MAX_TOML_BYTES)  # the CLI's reader: UTF-8, no NUL bytes
    return text, upload.name, upload_dir(), name_from_stem(Path(upload.name).stem)


def _extra_uploads(container):
    """(trace upload, its format, config.json upload), each None when not given."""
    box = container.expander("Upload a trace or a model config", expanded=bool(
        st.session_state.get("kvsim.upload_trace") or st.session_state.get("kvsim.upload_hf")))
    trace = box.file_uploader("Trace (optional)", type=["csv", "jsonl"], key="kvsim.upload_trace",
                              max_upload_size=MAX_TRACE_BYTES >> 20,
                              help="Azure LLM 2023 CSV, Mooncake JSONL, or a CSV with the header "
                                   "arrival_s,prompt_tokens,output_tokens: replaces the workload's arrivals and "
                                   "lengths")
    fmt = None
    if trace is not None:
        guess = _guess_format(trace.name, trace.getvalue()[:64])
        fmt = box.selectbox("Trace format", TRACE_FORMATS, key="kvsim.trace_format", index=TRACE_FORMATS.index(guess))
    hf = box.file_uploader("Hugging Face config.json (optional)", type=["json"], key="kvsim.upload_hf",
                           max_upload_size=1, help="A model's config.json: replaces the model preset")
    return trace, fmt, hf


def _upload_overrides(data: dict, trace, fmt, hf, digest) -> list[str]:
    """Save the uploads and say what they change as `--set` overrides (their contents join `digest`)."""
    overrides = []
    if trace is not None:
        path, raw = save_upload(trace, "trace", MAX_TRACE_BYTES)
        digest.update(b"trace\0" + fmt.encode() + hashlib.sha256(raw).digest())
        overrides += [f"workload.trace={toml_value({'format': fmt, 'path': str(path)})}",
                      'workload.arrival.process="trace"', 'workload.prompt_len={ dist = "trace" }',
                      'workload.output_len={ dist = "trace" }']
    if hf is not None:
        folder = Path(hf.name).stem if hf.name != "config.json" else "uploaded-model"  # names the model
        path, raw = save_upload(hf, "model config", MAX_CONFIG_BYTES, name="config.json", folder=folder)
        load_hf_config(path)  # one-line error naming the key
        digest.update(b"hf\0" + hashlib.sha256(raw).digest())
        dtype = data.get("model", {}).get("dtype", "bfloat16")
        overrides.append(f"model={toml_value({'hf_config': str(path), 'dtype': dtype})}")
    return overrides


def choose_base(container) -> Base:
    """The source widgets (shipped or uploaded scenario, trace, config.json) and the validated start."""
    text, source, base_dir, default_name = _scenario_file(container)
    trace, fmt, hf = _extra_uploads(container)
    data = parse_toml(text, source)
    confined = upload_dir() if base_dir != SCENARIO_DIR else None
    _absolute_paths(copy.deepcopy(data), base_dir, confined, source)  # before anything reads a file it names
    scenario_from_toml(text, source, base_dir, default_name=default_name)  # one-line error if it is not valid
    data = _absolute_paths(data, base_dir, confined, source)
    data.setdefault("name", default_name)
    digest = hashlib.sha256(f"{source}\0{text}".encode())
    overrides = _upload_overrides(data, trace, fmt, hf, digest)
    data = apply_overrides(data, overrides)
    check_values(data, source)
    scenario = scenario_from_dict(data, source, base_dir)
    if base_dir == upload_dir():
        _check_uploaded_inputs(scenario, source)
    return Base(data, scenario, source, base_dir, tuple(overrides), digest.hexdigest()[:16], upload_dir())


def _check_uploaded_inputs(scenario, source: str) -> None:
    """An uploaded scenario's input files live only if uploaded beside it: say which to upload, not a
    server path."""
    wanted = (("workload.trace.path", scenario.workload.trace.path if scenario.workload.trace else None,
               "upload the trace too (Upload a trace or a model config, in the sidebar)"),
              ("model.hf_config", scenario.model.hf_config,
               "upload the model's config.json too (Upload a trace or a model config, in the sidebar)"),
              ("backend.calibration", scenario.backend.calibration,
               "the dashboard takes no calibration upload: remove the key, or run it with python -m kvsim"))
    for key, rel, fix in wanted:
        if rel and not scenario.resolve(rel).is_file():
            raise KvsimError(f"{source}: {key} names {Path(rel).name}: {fix}")
