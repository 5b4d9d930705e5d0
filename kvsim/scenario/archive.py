"""Zip archives a user hands kvsim (a results folder zipped for `kvsim validate` or the dashboard), read
without unpacking them.

An archive is checked whole before any member is read: at most `MAX_ENTRIES` entries, each a plain
relative path (no absolute path, drive or `..` component, no NUL, at most `MAX_PATH_CHARS` characters
and 255 bytes a component), no symlink, device or other special entry, no encrypted entry, no name
twice and no name that is both a file and a folder, and at most `MAX_UNPACKED_BYTES` unpacked as the
archive declares them. Then only the one member asked for is read, capped as it is decompressed (an
archive may understate its sizes). Every problem is a one-line `KvsimError` naming the archive and
the entry.
"""

from __future__ import annotations

import stat
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from kvsim.errors import KvsimError
from kvsim.scenario.limits import MAX_PATH_CHARS

MAX_ENTRIES = 10_000
MAX_UNPACKED_BYTES = 4 << 30
MAX_MEMBER_BYTES = 64 << 20  # the member read (a summary.json is a few KiB to a few MiB)
ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True, slots=True)
class ZipLimits:
    """Caps on an archive, and whose they are in messages ("kvsim's", "the dashboard's")."""

    max_entries: int = MAX_ENTRIES
    max_unpacked: int = MAX_UNPACKED_BYTES
    whose: str = "kvsim's"


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in PurePosixPath(name.replace("\\", "/")).parts if p not in ("", "."))


def _check_entry(info: zipfile.ZipInfo, archive: str) -> tuple[str, ...]:
    """The entry's path components, or a one-line error for an entry no folder may hold."""
    name = info.filename
    where = f"{archive}: {name[:200]!r}{'...' if len(name) > 200 else ''}"
    if len(name) > MAX_PATH_CHARS or any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in name.split("/")):
        raise KvsimError(f"{where}: a path longer than {MAX_PATH_CHARS:,} characters (or a name over 255 bytes)")
    parts = _parts(name)
    if not parts or "\x00" in name or name.startswith(("/", "\\")) or ":" in parts[0]:
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
    return parts


def _check_tree(infos: list[zipfile.ZipInfo], archive: str) -> dict[tuple[str, ...], zipfile.ZipInfo]:
    """Every entry checked; the files by path. A name twice, or a file that is also a folder, is refused."""
    files: dict[tuple[str, ...], zipfile.ZipInfo] = {}
    folders: set[tuple[str, ...]] = set()
    for info in infos:
        parts = _check_entry(info, archive)
        folders.update(parts[:i] for i in range(1, len(parts)))
        if info.is_dir():
            folders.add(parts)
        elif parts in files:
            raise KvsimError(f"{archive}: {'/'.join(parts)!r} is in the archive twice")
        else:
            files[parts] = info
    clash = next((p for p in files if p in folders), None)
    if clash is not None:
        raise KvsimError(f"{archive}: {'/'.join(clash)!r} is both a file and a folder in the archive")
    return files


def open_zip(source, archive: str, limits: ZipLimits = ZipLimits()) -> tuple[zipfile.ZipFile, dict]:
    """`source` (bytes or a binary file) opened as a zip and checked whole (module docstring): the
    ZipFile and its files by path components."""
    import io

    try:
        zf = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source)
    except (zipfile.BadZipFile, ValueError, EOFError):
        raise KvsimError(f"{archive}: not a zip archive") from None
    except OSError as exc:
        raise KvsimError(f"{archive}: cannot read archive ({exc.strerror or exc})") from None
    try:
        infos = zf.infolist()
        if len(infos) > limits.max_entries:
            raise KvsimError(f"{archive}: {len(infos):,} entries, over {limits.whose} limit of {limits.max_entries:,}")
        files = _check_tree(infos, archive)
        if sum(i.file_size for i in infos) > limits.max_unpacked:
            raise KvsimError(f"{archive}: unpacks to more than {limits.whose} {limits.max_unpacked:,} bytes")
    except BaseException:
        zf.close()
        raise
    return zf, files


def find_member(files: dict, name: str, archive: str) -> tuple[str, ...]:
    """The one file called `name` in the archive (at its top or in a folder), or a one-line error."""
    found = sorted(p for p in files if p[-1] == name)
    if not found:
        raise KvsimError(f"{archive}: no {name} in the archive (zip a kvsim results folder)")
    if len(found) > 1:
        listed = ", ".join("/".join(p) for p in found[:3])
        raise KvsimError(f"{archive}: more than one {name} ({listed}): zip one results folder")
    return found[0]


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive: str, limit: int = MAX_MEMBER_BYTES) -> bytes:
    """One member's bytes, capped as they are decompressed."""
    out = bytearray()
    try:
        with zf.open(info) as src:
            while chunk := src.read(1 << 20):
                out += chunk
                if len(out) > limit:
                    raise KvsimError(f"{archive}: {info.filename!r} unpacks to more than {limit >> 20} MiB")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError) as exc:
        raise KvsimError(f"{archive}: {info.filename!r}: cannot unpack ({exc})") from None
    return bytes(out)


def read_zipped(source, name: str, archive: str, limits: ZipLimits = ZipLimits()) -> tuple[bytes, str]:
    """(bytes, path in the archive) of the one file called `name` in a checked archive."""
    zf, files = open_zip(source, archive, limits)
    with zf:
        parts = find_member(files, name, archive)
        return read_member(zf, files[parts], archive), "/".join(parts)
