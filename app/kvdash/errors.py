"""One-line errors on the page: a `KvsimError` is shown as its message (naming the file, key or
line), anything else as one line naming the exception; the traceback goes to the server's log only."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

from kvsim.errors import KvsimError

log = logging.getLogger("kvsim.dashboard")


@dataclass(slots=True)
class Caught:
    message: str | None = None


def one_line(text: str) -> str:
    """The first line, without this server's temporary upload folder in paths."""
    import streamlit as st

    line = (text.strip().splitlines() or [""])[0]
    folder = st.session_state.get("kvsim.upload_dir")
    return line.replace(folder + "/", "") if folder else line


@contextmanager
def caught(container=None):
    """Run the body; an error ends it and becomes `Caught.message` (shown in `container` if given)."""
    result = Caught()
    try:
        yield result
    except KvsimError as exc:
        result.message = one_line(str(exc))
    except Exception as exc:  # a bug: one line on the page, the traceback in the log
        log.exception("dashboard error")
        result.message = one_line(f"internal error ({type(exc).__name__}): {exc}")
    if result.message and container is not None:
        container.error(result.message)
