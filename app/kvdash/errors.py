"""One-line errors on the page: a `KvsimError` is shown as its message (naming the file, key or
line), anything else as one line naming only the exception's type (its message may hold server paths);
the message and traceback go to the server's log only. Control and bidirectional-override characters
are escaped, and this session's upload folder is left out of paths."""

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

    from kvsim.guard import one_line as printable

    line = (text.strip().splitlines() or [""])[0]
    folder = st.session_state.get("kvsim.upload_dir")
    return printable(line.replace(folder + "/", "") if folder else line)


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
        result.message = f"internal error ({type(exc).__name__}): the details are in the server's log"
    if result.message and container is not None:
        container.error(result.message)
