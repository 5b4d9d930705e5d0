"""The top-level guard of the command line: whatever ends a command ends it in one line and an exit code.

`run(command)` runs a command (a function returning an exit code). Standard library only, so that
`python -m kvsim` has it in place before the rest of kvsim is imported.

- Signals: SIGINT, SIGTERM and SIGHUP unwind the command as KeyboardInterrupt or `Terminated` (so the
  results writer removes its temporary folder) and end in `kvsim: interrupted` (130) or
  `kvsim: terminated (SIGTERM)` (128 + the signal). A signal the process inherited as ignored (`nohup`,
  a background job of a script) stays ignored. Worker processes start from what kvsim inherited
  (`worker_signals`), never from its handlers.
- Standard streams: a closed stdin, stdout or stderr (`>&-`) is reopened on /dev/null before anything
  else, so no file kvsim opens can take its descriptor; `stdout_closed()` tells commands, and one that
  would print refuses to start. Text the stream's encoding cannot show (an ASCII locale) is written
  escaped (`\\xd7`), and control and bidirectional-override characters are escaped in terminal output
  (`escape_terminal`) and error lines (`one_line`).
- Standard output gone: a closed pipe (`kvsim plan | head`) ends quietly with 141 (128 + SIGPIPE), as
  a shell's own tools do; a full disk or an I/O error on stdout is one line, exit 2.
- Resources: MemoryError (and a library that cannot be mapped into memory), too many open files, no
  space left and any other OS error reaching the top are one line naming the cause, exit 2.
- Anything else is a bug: one line `internal error`, exit 1 (KVSIM_DEBUG=1 adds the traceback).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
EXIT_PIPE = 128 + getattr(signal, "SIGPIPE", 13)
_inherited: dict[int, object] = {}  # each signal's disposition before kvsim first set its own
_stdout_closed = False
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class Terminated(BaseException):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so the results writer removes its temporary folder."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    for sig in SIGNALS:  # a second signal must not interrupt the clean-up of the first
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def install_signals() -> dict:
    """kvsim's handlers for SIGNALS, except where the signal is ignored; the handlers they replaced."""
    previous = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        _inherited.setdefault(sig, current)
        if current is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _on_signal)
    return previous


@contextmanager
def deferred_signals():
    """SIGNALS held back (blocked, then handled on leaving) while a few steps must happen together, such
    as a rename and recording that it happened. Only the main thread handles signals; elsewhere a no-op."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_signals() -> None:
    """In a worker process: each of SIGNALS as kvsim inherited it, ignored or default (a worker killed by
    Ctrl-C or SIGTERM dies quietly; its parent says what happened)."""
    for sig in SIGNALS:
        ignored = _inherited.get(sig, signal.getsignal(sig)) is signal.SIG_IGN
        signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)


def _reopen_closed_streams() -> None:
    """Put /dev/null on any of descriptors 0-2 that is closed, and give Python a stream for it."""
    global _stdout_closed
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False, encoding="utf-8"))
        _stdout_closed = _stdout_closed or fd == 1


def stdout_closed() -> bool:
    """Whether this process started with its standard output closed."""
    return _stdout_closed


def _escaping_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper, or a closed one
            pass


def escape_terminal(text: str) -> str:
    """`text` with control characters (but newline and tab) and bidirectional overrides escaped."""
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], text) if _UNSAFE.search(text) else text


def one_line(text: str, limit: int = 2000) -> str:
    """A message as one printable line (names from files may hold newlines or escapes); a long one loses
    its middle, never its end (where the reason is)."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    if len(text) <= limit:
        return text
    head = limit // 2
    return text[:head] + " ... " + text[len(text) - (limit - head - 5):]


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr is gone too: the exit code says it
        pass


def _fail(message: str, code: int = 2) -> int:
    _say(f"kvsim: error: {one_line(message)}")
    return code


def _silence_stdout() -> None:
    """Point descriptor 1 at /dev/null, so Python's last flush at exit has nowhere to fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


class _Stdout:
    """sys.stdout while a command runs: an OSError writing or flushing it is marked as stdout's, so the guard
    can tell a full disk under `> FILE` from one under the results folder."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            exc.kvsim_stdout = True
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            exc.kvsim_stdout = True
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except ValueError:  # closed
        pass


def _os_message(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        try:
            import resource
            limit = f" (the limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,})"
        except (ImportError, OSError, ValueError):
            limit = ""
        return f"{where}too many open files{limit}: raise it (ulimit -n) or use fewer --workers"
    return f"{where}{exc.strerror or exc}"


def _out_of_memory() -> int:
    return _fail("out of memory: the run needs more than this process may use (ulimit -v, a container's limit); "
                 "fewer requests (workload.num_requests, --requests) or a shorter trace need less")


def _outcome(command) -> int:
    from kvsim.errors import KvsimError

    try:
        code = command()
        _flush_stdout()
        return code
    except MemoryError:
        pass  # reported below, once the exception (and the frames it holds on to) is gone
    except KvsimError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        _say("kvsim: interrupted")
        return 130
    except Terminated as exc:
        _say(f"kvsim: terminated ({signal.Signals(exc.signum).name})")
        return 128 + exc.signum
    except BrokenPipeError:  # `kvsim schema | head`: the reader left; say nothing more
        _silence_stdout()
        return EXIT_PIPE
    except OSError as exc:
        if getattr(exc, "kvsim_stdout", False):
            _silence_stdout()
            return _fail(f"cannot write to standard output: {exc.strerror or exc}")
        return _fail(_os_message(exc))
    except Exception as exc:
        if isinstance(exc, ImportError) and re.search(r"cannot allocate memory|failed to map segment", str(exc), re.I):
            return _out_of_memory()
        if os.environ.get("KVSIM_DEBUG"):
            import traceback
            traceback.print_exc()
        return _fail(f"internal error ({type(exc).__name__}: {exc}): a bug in kvsim; please report it with the "
                     "command (KVSIM_DEBUG=1 prints the traceback)", code=1)
    return _out_of_memory()


def run(command) -> int:
    """`command()` under the guard (module docstring); its exit code."""
    _reopen_closed_streams()
    _escaping_streams()
    in_main = threading.current_thread() is threading.main_thread()
    previous = install_signals() if in_main else {}
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        return _outcome(command)
    finally:
        sys.stdout = stdout
        for sig, handler in previous.items():
            signal.signal(sig, handler)
