"""Measured runs for the Validation page: an uploaded .zip of a GPU run's results folder, or a JSON (a
results folder's summary.json, or a `vllm bench serve --save-result` file), made into a path that
`kvsim.validate` reads; and the validation itself, cached by the scenario and the measured bytes.

A zip is checked whole before anything is written: at most `MAX_ENTRIES` entries, no absolute path
or `..` component, no symlink, device or other special entry, no encrypted entry, and at most
`MAX_UNPACKED_BYTES` unpacked (counted as the bytes are written, not as the archive claims). It is
extracted under this session's upload folder only (kvdash.source), one fresh folder per archive.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import tempfile
import zipfile
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path, PurePosixPath

import streamlit as st

import kvsim
from kvdash.source import save_upload, upload_dir
from kvsim.errors import KvsimError
from kvsim.scenario.config import scenario_from_toml

MAX_ZIP_BYTES = 20 << 20
MAX_JSON_BYTES = 20 << 20
MAX_UNPACKED_BYTES = 200 << 20
MAX_ENTRIES = 1000
RESULT_FILE = "summary.json"  # what kvsim validate reads from a results folder


def _check_entry(info: zipfile.ZipInfo, archive: str) -> None:
    name = info.filename
    where = f"{archive}: {name!r}"
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not name or "\x00" in name or name.startswith(("/", "\\")) or (parts and ":" in parts[0]):
        raise KvsimError(f"{where}: an absolute path in the archive")
    if ".." in parts:
        raise KvsimError(f"{where}: a path leaving the archive's folder ('..')")
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if stat.S_ISLNK(mode):
        raise KvsimError(f"{where}: a symbolic link in the archive")
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        raise KvsimError(f"{where}: not a regular file or folder")
    if info.flag_bits & 0x1:
        raise KvsimError(f"{where}: an encrypted entry")


def extract_zip(data: bytes, archive: str, dest: Path) -> None:
    """Unpack `data` (an archive named `archive` in messages) into the empty folder `dest`, or raise a
    one-line KvsimError before writing anything it refuses (see the module docstring)."""
    try:
        zf = zipfile.ZipFile(BytesIO(data))
    except (zipfile.BadZipFile, ValueError):
        raise KvsimError(f"{archive}: not a zip archive") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ENTRIES:
            raise KvsimError(f"{archive}: {len(infos):,} entries, over the dashboard's limit of {MAX_ENTRIES:,}")
        for info in infos:
            _check_entry(info, archive)
        if sum(i.file_size for i in infos) > MAX_UNPACKED_BYTES:
            raise KvsimError(f"{archive}: unpacks to more than the dashboard's {MAX_UNPACKED_BYTES:,} bytes")
        budget = MAX_UNPACKED_BYTES
        root = dest.resolve()
        for info in infos:
            target = (root / info.filename.replace("\\", "/")).resolve()
            if root not in target.parents:
                raise KvsimError(f"{archive}: {info.filename!r}: a path leaving the archive's folder")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with zf.open(info) as src, open(target, "xb") as out:
                    while chunk := src.read(1 << 20):
                        budget -= len(chunk)
                        if budget < 0:  # the archive understated its sizes
                            raise KvsimError(f"{archive}: unpacks to more than the dashboard's "
                                             f"{MAX_UNPACKED_BYTES:,} bytes")
                        out.write(chunk)
            except FileExistsError:
                raise KvsimError(f"{archive}: {info.filename!r} is in the archive twice") from None
            except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError) as exc:
                raise KvsimError(f"{archive}: {info.filename!r}: cannot unpack ({exc})") from None


def results_folder(dest: Path, archive: str) -> Path:
    """The folder of the archive's summary.json: at its top, or in the one folder it holds."""
    found = sorted(p.parent for p in dest.rglob(RESULT_FILE) if p.is_file() and not p.is_symlink())
    if not found:
        raise KvsimError(f"{archive}: no {RESULT_FILE} in the archive (zip a kvsim results folder)")
    if len(found) > 1:
        listed = ", ".join(str(p.relative_to(dest) / RESULT_FILE) for p in found[:3])
        raise KvsimError(f"{archive}: more than one {RESULT_FILE} ({listed}): zip one results folder")
    return found[0]


def saved_upload(upload) -> tuple[Path, str]:
    """(path for kvsim.validate, digest of the bytes) of an uploaded .zip or .json, unpacked or written
    under this session's upload folder."""
    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    if not upload.name.lower().endswith(".zip"):
        path, _ = save_upload(upload, "measured run", MAX_JSON_BYTES, folder=f"measured-{digest}")
        return path, digest
    if len(data) > MAX_ZIP_BYTES:
        raise KvsimError(f"{upload.name}: archive is {len(data):,} bytes, over the dashboard's "
                         f"{MAX_ZIP_BYTES:,}-byte limit for uploads")
    folder = upload_dir() / f"measured-{digest}"
    if not folder.is_dir():
        staging = Path(tempfile.mkdtemp(prefix="unpacking-", dir=upload_dir()))
        try:
            extract_zip(data, upload.name, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # our own folder: nothing half-unpacked is kept
            raise
        staging.rename(folder)
    return results_folder(folder, upload.name), digest


@contextmanager
def named(path: Path, name: str):
    """Errors about the saved copy at `path` name the upload instead."""
    try:
        yield
    except KvsimError as exc:
        raise KvsimError(str(exc).replace(str(path), name)) from None


def digest_of(path: Path) -> str:
    """Digest of a measured run on disk (a results folder: its summary.json)."""
    path = path / RESULT_FILE if path.is_dir() else path
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@st.cache_data(max_entries=32, show_spinner="Simulating the scenario analytically…")
def validate(toml_text: str, source: str, base_dir: str, inputs_digest: str, measured: str, measured_digest: str,
             policies: tuple[str, ...] | None) -> list[dict]:
    """`kvsim.validate` of the scenario against the measured run (keyed by the bytes of both)."""
    scenario = scenario_from_toml(toml_text, source, Path(base_dir))
    return kvsim.validate(scenario, measured, policies=list(policies) if policies else None)
