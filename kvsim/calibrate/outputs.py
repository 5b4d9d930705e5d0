"""The single files kvsim calibrate writes: refused before any work where they could not be written at the end."""

from __future__ import annotations

import os
from pathlib import Path

from kvsim.errors import KvsimError


def refuse_overwrite(path: Path, what: str, ours=None) -> None:
    """Refuse now, before any work, a single-file output that write_text_atomic would refuse at the end."""
    if os.path.lexists(path) and (ours is None or not ours(path)):
        raise KvsimError(f"{path}: already exists; kvsim does not overwrite {what} (remove it or pick another name)")
    if not path.parent.is_dir():
        raise KvsimError(f"{path}: folder {path.parent} does not exist")


def written_by_calibrate(path: Path) -> bool:
    """A regular file (not a link) that kvsim calibrate wrote."""
    import json
    import stat

    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            return json.loads(f.read(1 << 20)).get("written_by") == "kvsim calibrate"
    except (OSError, ValueError, AttributeError):
        return False
