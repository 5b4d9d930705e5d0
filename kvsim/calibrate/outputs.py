"""The single files kvsim calibrate writes: what each may replace, decided before any work."""

from __future__ import annotations

import os
from pathlib import Path


def vet_output(path: Path, output: str, refusal: str, ours=None):
    """What the single-file output may replace, decided now, before any work (kvsim.scenario.publish.vet_output):
    the file written at the end replaces that, as it is now, or nothing."""
    from kvsim.scenario.publish import vet_output as vet

    return vet(path, output, ours, refusal)


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
