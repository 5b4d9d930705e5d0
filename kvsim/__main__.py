"""The `kvsim` command (`python -m kvsim`, and the console script `kvsim.__main__:main`).

kvsim.guard is set up first and the rest of kvsim imported inside it, so a signal or a closed stream
during start-up also ends in one line."""

import os

from kvsim.guard import run


def main() -> int:
    def command() -> int:
        # Before numpy loads (every command imports it lazily): kvsim calls no multi-threaded BLAS, and
        # starting (and at exit joining) OpenBLAS's pool of threads costs ~50 ms a process. A user's
        # own setting is kept.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        from kvsim.cli import dispatch

        return dispatch()
    return run(command)


if __name__ == "__main__":
    raise SystemExit(main())
