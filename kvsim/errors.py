"""The one error type a user sees, and the readers of user files that raise it.

A `KvsimError` is a one-line message naming the file, key or line at fault; the CLI turns it into
`kvsim: error: <message>` and exit code 2, with no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path


class KvsimError(Exception):
    """Bad input or an impossible configuration, reported to the user in one line."""


def read_text(path: Path, what: str) -> str:
    """The text of a user's file (`what` names it in the error: "scenario", "model config", ...)."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise KvsimError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise KvsimError(f"{path}: {what} is a folder, not a file") from None
    except UnicodeDecodeError as exc:
        raise KvsimError(f"{path}: {what} is not a text file ({exc.reason})") from None
    except OSError as exc:
        raise KvsimError(f"{path}: cannot read {what} ({exc.strerror})") from None


def read_json_object(path: Path, what: str) -> dict:
    """A user's JSON file that must hold one object."""
    try:
        data = json.loads(read_text(path, what))
    except json.JSONDecodeError as exc:
        raise KvsimError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise KvsimError(f"{path}: expected a JSON object ({what})")
    return data
