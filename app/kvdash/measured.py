"""Measured runs for the Validation page: an uploaded .zip of a GPU run's results folder, or a JSON (a
results folder's summary.json, or a `vllm bench serve --save-result` file), saved where
`kvsim.validate` reads it; and the validation itself, cached by the scenario and the measured bytes.

A zip is checked whole in memory by the library's reader (kvsim.scenario.archive: entry count, no
absolute or `..` path, no link or special entry, no name twice or both a file and a folder, unpacked
size) under the dashboard's own caps, and written (as the archive, never unpacked) under this
session's upload folder only once it passed; `kvsim validate` reads the same archive the same way.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

import kvsim
from kvdash.source import save_upload
from kvsim.errors import KvsimError
from kvsim.scenario.archive import ZipLimits, find_member, open_zip, read_member
from kvsim.scenario.config import scenario_from_toml

MAX_ZIP_BYTES = 20 << 20
MAX_JSON_BYTES = 20 << 20
MAX_UNPACKED_BYTES = 200 << 20
MAX_ENTRIES = 1000
RESULT_FILE = "summary.json"  # what kvsim validate reads from a results folder


def check_zip(data: bytes, archive: str) -> None:
    """One line unless `data` is an archive the dashboard accepts, holding one readable summary.json."""
    limits = ZipLimits(MAX_ENTRIES, MAX_UNPACKED_BYTES, "the dashboard's")
    zf, files = open_zip(data, archive, limits)
    with zf:
        read_member(zf, files[find_member(files, RESULT_FILE, archive)], archive)


def saved_upload(upload) -> tuple[Path, str]:
    """(path for kvsim.validate, digest of the bytes) of an uploaded .zip or .json, written under this
    session's upload folder (a zip only after it passed `check_zip`)."""
    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    if not upload.name.lower().endswith(".zip"):
        path, _ = save_upload(upload, "measured run", MAX_JSON_BYTES, folder=f"measured-{digest}")
        return path, digest
    if len(data) > MAX_ZIP_BYTES:
        raise KvsimError(f"{upload.name}: archive is {len(data):,} bytes, over the dashboard's "
                         f"{MAX_ZIP_BYTES:,}-byte limit for uploads")
    check_zip(data, upload.name)
    path, _ = save_upload(upload, "measured run", MAX_ZIP_BYTES, name="results.zip", folder=f"measured-{digest}")
    return path, digest


@contextmanager
def named(path: Path, name: str):
    """Errors about the saved copy at `path` name the upload instead."""
    try:
        yield
    except KvsimError as exc:
        raise KvsimError(str(exc).replace(str(path), name)) from None


def digest_of(path: Path) -> str:
    """Digest of a measured run on disk (a results folder: its summary.json)."""
    path = path / RESULT_FILE if path.is_dir() else path  # a zip or a JSON: its bytes
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@st.cache_data(max_entries=32, show_spinner="Simulating the scenario analytically…")
def validate(toml_text: str, source: str, base_dir: str, inputs_digest: str, measured: str, measured_digest: str,
             policies: tuple[str, ...] | None) -> list[dict]:
    """`kvsim.validate` of the scenario against the measured run (keyed by the bytes of both)."""
    scenario = scenario_from_toml(toml_text, source, Path(base_dir))
    return kvsim.validate(scenario, measured, policies=list(policies) if policies else None)
