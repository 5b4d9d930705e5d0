"""What a results folder may replace, vetted without following links, and what killed runs left beside it.

kvsim never deletes what it did not write. Every results folder holds a marker file
(`.kvsim-results.json`, listing the files kvsim wrote); the target is replaced only when it is new,
empty, or such a folder holding nothing else, the marker and every file it lists being regular files
(never links or folders, which are not what kvsim writes). `force` replaces any other folder, but
never one that holds the working directory, the home folder or one of the run's input files, nor
one whose files cannot all be removed (checked before anything is written). Nothing is followed
through a symbolic link when deciding what to replace: a link at the target is replaced as a link
(only with `force`), never emptied through; the folders above the target may be links.

What may be replaced is decided when the command starts: the writer replaces only that, as it was
then (`Vetted.ident` is its stamp: device, inode, size and modification time), never a folder that
appeared or was changed since, even with `force`.

The writer's hidden siblings (`.NAME.tmp-*`, `.NAME.old-*`) are named after the process and machine
that made them; on start a run recovers what a dead process of this machine left beside its target:
such an `.old-` folder is put back when the target is missing, anything else of it is removed.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kvsim.errors import KvsimError
from kvsim.scenario.publish import HOST, recover_strays, stamp  # noqa: F401 (HOST: the writer's)

MARKER = ".kvsim-results.json"
FORMAT = 1
LEGACY_FILES = frozenset({"summary.json", "requests.csv", "timeseries.csv", "report.html"})
MAX_MARKER_BYTES = 1 << 20


def results_path(out_dir) -> Path:
    """`out_dir` as the writer uses it: absolute, `~` expanded, the folders above it with their links
    resolved, its own name never (a link at the target is the link, not where it points)."""
    try:
        path = Path(os.path.abspath(Path(out_dir).expanduser()))
        parent = path.parent
        return Path(os.path.realpath(parent)) / path.name if path != parent and os.path.isdir(parent) else path
    except (OSError, RuntimeError, ValueError) as exc:
        raise KvsimError(f"{out_dir!s}: cannot use as results folder ({exc})") from None


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _entries(folder: Path) -> dict[str, int]:
    """Each entry of `folder` and its own mode (links not followed)."""
    with os.scandir(folder) as it:
        return {e.name: e.stat(follow_symlinks=False).st_mode for e in it}


def _marker_files(folder: Path, entries: dict[str, int]) -> Optional[set[str]]:
    """The files kvsim wrote into `folder`, from its marker (None: not a kvsim results folder). The
    marker must be a regular file of one link, read without following links, listing plain names, each
    present one a regular file. A folder from before markers holds summary.json and nothing but
    LEGACY_FILES, all regular files."""
    if MARKER not in entries:
        names = set(entries)
        plain = all(stat.S_ISREG(entries[n]) for n in names)
        return names if "summary.json" in names and names <= LEGACY_FILES and plain else None
    if not stat.S_ISREG(entries[MARKER]):
        return None
    try:
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return None
            doc = json.loads(f.read(MAX_MARKER_BYTES + 1))
        files = doc["files"] if doc.get("format") == "kvsim-results" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) and f and "/" not in f and "\x00" not in f
                                              and f not in (".", "..") for f in files):
        return None
    if not all(stat.S_ISREG(entries[f]) for f in files if f in entries):
        return None  # a listed name that is a folder or a link is not a file kvsim wrote
    return set(files) | {MARKER}


def _held_folders(inputs) -> list[tuple[Path, str]]:
    """Folders a results folder must never swallow: where the user stands, their home, the inputs."""
    held = []
    for where, what in ((Path.cwd, "the current directory"), (Path.home, "your home folder")):
        try:
            held.append((where(), what))
        except (OSError, RuntimeError):  # a deleted working directory, no home
            pass
    return held + [(Path(os.path.abspath(p)), f"input {p}") for p in inputs]


def _raise(exc: OSError):
    raise exc


def _removable(folder: Path, tree: bool) -> Optional[Path]:
    """The first folder whose entries this process could not remove (None: all can be): it needs write
    and search permission, and in a sticky folder of another user, entries of its own."""
    me = os.geteuid() if hasattr(os, "geteuid") else -1
    walk = os.walk(folder, onerror=_raise) if tree else [(str(folder), [], [])]
    for where, _, _ in walk:
        if not os.access(where, os.W_OK | os.X_OK):
            return Path(where)
        st = os.lstat(where)
        if me > 0 and st.st_mode & stat.S_ISVTX and st.st_uid != me:
            with os.scandir(where) as it:
                if any(e.stat(follow_symlinks=False).st_uid != me for e in it):
                    return Path(where)
    return None


@dataclass(frozen=True, slots=True)
class Vetted:
    """What `check_target` found at the target and allows replacing."""

    kind: str  # "absent", "link" (force only) or "folder"
    ident: Optional[tuple] = None  # the `stamp` of what was vetted (device, inode, size, modification time)
    ours: Optional[frozenset] = None  # the names a folder may lose; None: all of them (force)


def check_target(out_dir: Path, force: bool = False, inputs=()) -> Vetted:
    """Raise unless `out_dir` (as `results_path` gives it) may be (re)placed by a results folder (see
    the module docstring); what is there and may go."""
    if out_dir.parent == out_dir:
        raise KvsimError(f"{out_dir}: refusing to write results over the root folder")
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return Vetted("absent")
    except OSError as exc:
        raise KvsimError(f"{out_dir}: cannot use as results folder ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        if not force:
            raise KvsimError(f"{out_dir}: results path is a symbolic link: --force replaces the link itself (never "
                             "what it points to), or choose another --out")
        return Vetted("link", stamp(st))
    if not stat.S_ISDIR(st.st_mode):
        raise KvsimError(f"{out_dir}: results path exists and is not a folder")
    try:
        entries = _entries(out_dir)
    except OSError as exc:
        raise KvsimError(f"{out_dir}: cannot read results folder ({exc.strerror})") from None
    for held, what in _held_folders(inputs):
        if _is_within(held.resolve(), out_dir):
            raise KvsimError(f"{out_dir}: refusing to replace a folder that holds {what}: pick another --out")
    if entries and not force:
        ours = _marker_files(out_dir, entries)
        if ours is None:
            raise KvsimError(f"{out_dir}: folder exists and is not a kvsim results folder: pass --force to replace "
                             f"it, or choose another --out")
        strangers = sorted(set(entries) - ours)
        if strangers:
            raise KvsimError(f"{out_dir}: results folder also holds files kvsim did not write ({', '.join(strangers[:3])}"
                             f"{', ...' if len(strangers) > 3 else ''}): move them, pass --force, or choose another --out")
    try:
        stuck = _removable(out_dir, tree=force)
    except OSError as exc:
        raise KvsimError(f"{out_dir}: cannot read results folder ({exc.strerror})") from None
    if stuck is not None:
        raise KvsimError(f"{out_dir}: cannot replace the earlier folder: kvsim may not remove the files in {stuck} "
                         "(Permission denied); it stays as it is: choose another --out")
    return Vetted("folder", stamp(st), None if force else frozenset(entries))


def recover_leftovers(out_dir: Path) -> None:
    """What a killed run left beside `out_dir`: hidden siblings named by a process of this machine that is
    gone. An `.old-` folder is put back while `out_dir` is missing (the run died inside the two-rename
    swap); the rest is removed (a temporary folder, or earlier results already replaced). Best effort."""
    recover_strays(out_dir, folders=True)
