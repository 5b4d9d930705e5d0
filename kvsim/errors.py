"""The one error type a user sees (user files are read by kvsim.scenario.files).

A `KvsimError` is a one-line message naming the file, key or line at fault; the CLI turns it into
`kvsim: error: <message>` and exit code 2, with no traceback.
"""

from __future__ import annotations


class KvsimError(Exception):
    """Bad input or an impossible configuration, reported to the user in one line."""


def check_int(value, name: str, low: int, high: int) -> None:
    """One line unless `value` is an integer (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise KvsimError(f"{name} must be an integer in [{low:,}, {high:,}], got {value!r}")


def check_callable(value, name: str) -> None:
    """One line unless `value` is None or callable (a progress callback)."""
    if value is not None and not callable(value):
        raise KvsimError(f"{name} must be a function (or None), got {value!r}")
