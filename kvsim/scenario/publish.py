"""Putting outputs in place: never over anything kvsim did not write, not even in a race.

The rule: what a command may replace is decided when it starts (`vet_output`, and for results folders
kvsim.results.target.check_target), and at the end only that, as it was then, is replaced. A file or
folder that appears at the output meanwhile, or one changed or replaced since (a new file may get the
freed inode number at once: `stamp` adds the size and modification time), is left as it is.

- `rename_noreplace`: Linux's renameat2(RENAME_NOREPLACE) (through ctypes), which fails rather than
  replace what is at the target. Where renameat2 is missing (not Linux, glibc < 2.28, a file system
  without the flag): a hard link of the finished file (`os.link` fails if the target exists), and for a
  folder a `mkdir` of the target (which fails the same way) that the folder is then renamed over, an
  empty folder this process just made. Never a check followed by a rename.
- `rename_exchange`: renameat2(RENAME_EXCHANGE) swaps two names in one step, so the target always holds
  the old or the new; what was swapped out is then checked to be what was vetted, else swapped back.
  Without it, the vetted file is first moved aside under a hidden name (`os.rename`, which moves
  whatever is there), checked, and only then the new one put in place with `rename_noreplace`.
- `atomic_output` writes a single file (a calibration, an error table, a profile) into a hidden sibling
  `.NAME.tmp-PID-HOST-RANDOM` (a name already taken is never touched: another is drawn) and publishes it
  so; a failure or a signal leaves the earlier file (or none) and no temporary. A killed process's
  temporary is removed by the next command that writes NAME (`recover_strays`: named by a process of
  this machine that is gone, a regular file of this user).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from kvsim.errors import KvsimError

HOST = format(zlib.crc32(socket.gethostname().encode("utf-8", "replace")), "08x")  # names hidden siblings
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}
_DRAWS = 100  # hidden names tried before giving up (each taken one is someone's: left alone)
UNVETTED = object()  # `vetted` not given: the output is vetted when the write starts


def _renameat2():
    """libc's renameat2 (glibc >= 2.28), or None off Linux / on an older libc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def _rename2(src, dst, flags: int) -> bool:
    """renameat2(src, dst, flags): True when done, False when this system cannot (no renameat2, or a file
    system without the flag); any other failure raises its OSError."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def rename_noreplace(src, dst) -> None:
    """Rename `src` to `dst`, failing with FileExistsError if `dst` exists (whatever it is: a link, a file,
    a folder, empty or not). Without renameat2: a file is hard-linked then unlinked; for a folder `dst`
    is made with mkdir (failing if anything is there) and `src` renamed over that empty folder of ours."""
    if _rename2(src, dst, _RENAME_NOREPLACE):
        return
    if not stat.S_ISDIR(os.lstat(src).st_mode):
        os.link(src, dst)
        os.unlink(src)
        return
    os.mkdir(dst)
    try:
        os.rename(src, dst)
    except OSError as exc:
        try:
            os.rmdir(dst)  # still the empty folder just made, unless someone wrote into it
        except OSError:
            pass
        if exc.errno == errno.ENOTEMPTY:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from None
        raise


def rename_exchange(a, b) -> bool:
    """Swap the names `a` and `b` in one step (both must exist); False where the system cannot, and the
    caller falls back to its own steps."""
    return _rename2(a, b, _RENAME_EXCHANGE)


def stamp(st: os.stat_result) -> tuple:
    """What tells a file or folder from one made in its place: device, inode, size, modification time (a
    rename keeps all four; the inode number alone is given to the next file at once on ext4)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def hidden_name(path: Path, kind: str) -> Path:
    """A hidden sibling name of `path` naming this process and machine (see `recover_strays`)."""
    return path.parent / f".{path.name[:100]}.{kind}-{os.getpid()}-{HOST}-{secrets.token_hex(4)}"


def stray_pattern(path: Path) -> re.Pattern:
    """The names `hidden_name` gives: kind, process, machine."""
    return re.compile(rf"\.{re.escape(path.name[:100])}\.(tmp|old)-(\d+)-([0-9a-f]{{8}})-[0-9a-f]{{8}}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def recover_strays(path: Path, folders: bool = False) -> None:
    """The hidden siblings a killed command left beside `path` (a single file; with `folders`, a results
    folder): a temporary is removed, an earlier one moved aside is put back while `path` is missing
    (removed once it was replaced). Only regular files (folders) of this user, named by a gone process
    of this machine. Best effort."""
    pattern = stray_pattern(path)
    try:
        names = sorted(os.listdir(path.parent))
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or m[3] != HOST or alive(int(m[2])):
            continue
        stray = path.parent / name
        try:
            st = os.lstat(stray)
            if not (stat.S_ISDIR if folders else stat.S_ISREG)(st.st_mode) or \
                    (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
                continue
            if m[1] == "old" and not os.path.lexists(path):
                rename_noreplace(stray, path)
            elif folders:
                shutil.rmtree(stray)
            else:
                os.unlink(stray)
        except OSError:
            pass


def vet_output(path, what: str, may_replace=None, refusal: str = "a file it did not write") -> Optional[tuple]:
    """What a command writing the single file `path` may replace, decided when it starts: None when nothing
    is there; the `stamp` of a regular file that `may_replace(path)` says kvsim wrote; else one line."""
    path = Path(path)
    recover_strays(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise KvsimError(f"{path}: folder {path.parent} does not exist") from None
        return None
    except OSError as exc:
        raise KvsimError(f"{path}: cannot write {what} there ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise KvsimError(f"{path}: is a folder: name the file to write {what} to")
    if may_replace is None or not stat.S_ISREG(st.st_mode) or not may_replace(path) or \
            stamp(os.lstat(path)) != stamp(st):
        raise KvsimError(f"{path}: already exists; kvsim does not overwrite {refusal} (remove it or pick another name)")
    return stamp(st)


def _fresh_file(path: Path, kind: str = "tmp"):
    """A new hidden sibling of `path`, opened for writing: (its path, its descriptor)."""
    for _ in range(_DRAWS):
        tmp = hidden_name(path, kind)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:  # someone's: left as it is
            continue
    raise FileExistsError(errno.EEXIST, f"{_DRAWS} hidden names beside it were all taken", str(path))


def _changed(path: Path) -> KvsimError:
    return KvsimError(f"{path}: changed while kvsim ran (the file there is not the one it checked when it "
                      "started); not overwritten, nothing written")


def _publish(tmp: Path, path: Path, vetted) -> None:
    """`tmp` put at `path`: over nothing if `vetted` is None, else only over the file of that stamp."""
    if vetted is not None:
        try:
            return _replace(tmp, path, vetted)
        except FileNotFoundError:  # the vetted file was removed meanwhile: nothing to replace, unless...
            if os.path.lexists(path) or not os.path.lexists(tmp):  # ...something is there again
                raise
    try:
        rename_noreplace(tmp, path)
    except FileExistsError:
        raise KvsimError(f"{path}: already exists; kvsim does not overwrite a file it did not write (it appeared "
                         "while kvsim ran; nothing written)") from None


def _replace(tmp: Path, path: Path, vetted: tuple) -> None:
    """`tmp` in place of the file at `path` of stamp `vetted`, or nothing replaced (see the module doc)."""
    if rename_exchange(tmp, path):
        if stamp(os.lstat(tmp)) == vetted:
            return os.unlink(tmp)
        rename_exchange(tmp, path)  # swapped out something else: put it back
        raise _changed(path)
    aside, fd = _fresh_file(path, "old")  # without RENAME_EXCHANGE: a name of ours to move the earlier file to
    os.close(fd)
    try:
        os.rename(path, aside)  # whatever is at path now, in one step, over our empty placeholder
    except BaseException:
        os.unlink(aside)
        raise
    if stamp(os.lstat(aside)) != vetted:
        _put_back(aside, path)
        raise _changed(path)
    try:
        rename_noreplace(tmp, path)
    except FileExistsError:
        raise KvsimError(f"{path}: a file appeared there while kvsim replaced its earlier one; not overwritten, "
                         f"nothing written (the earlier file is now {_kept(aside, path)})") from None
    os.unlink(aside)


def _put_back(aside: Path, path: Path) -> None:
    try:
        rename_noreplace(aside, path)
    except FileExistsError:
        raise KvsimError(f"{path}: changed twice while kvsim ran; not overwritten (what was there is now "
                         f"{_kept(aside, path)})") from None


def _kept(aside: Path, path: Path) -> Path:
    """`aside` renamed to a hidden `.NAME.kept-*` name that `recover_strays` never removes (it is named in
    the error line); `aside` itself if that fails."""
    kept = hidden_name(path, "kept")
    try:
        rename_noreplace(aside, kept)
        return kept
    except OSError:
        return aside


@contextmanager
def atomic_output(path, what: str, may_replace=None, vetted=UNVETTED, mode: str = "wb", **open_args):
    """A file object on a hidden temporary beside `path`, published on leaving (see the module doc). An
    existing `path` is replaced only when vetted: `vetted` from `vet_output` when the command started,
    else judged now by `may_replace(path)`. Errors are one line naming `path`; nothing half-written stays."""
    path = Path(path)
    if vetted is UNVETTED:
        vetted = vet_output(path, what, may_replace)
    tmp = None
    try:
        tmp, fd = _fresh_file(path)
        with open(fd, mode, **open_args) as f:
            yield f
        _publish(tmp, path, vetted)
        tmp = None
    except OSError as exc:
        raise KvsimError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_bytes_atomic(path, data: bytes, what: str, may_replace=None, vetted=UNVETTED) -> None:
    """`data` into `path` all or nothing (`atomic_output`)."""
    with atomic_output(path, what, may_replace, vetted) as f:
        f.write(data)


def write_text_atomic(path, text: str, what: str, may_replace=None, vetted=UNVETTED) -> None:
    """`text` (UTF-8) into `path` all or nothing (`atomic_output`)."""
    write_bytes_atomic(path, text.encode("utf-8"), what, may_replace, vetted)
