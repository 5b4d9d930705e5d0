"""`python -m kvsim` entry point: the guard (kvsim.guard, standard library only) is in place before the
rest of kvsim is imported, so a signal or a closed stream during start-up also ends in one line."""

from kvsim.guard import run


def _command() -> int:
    from kvsim.cli import dispatch

    return dispatch()


raise SystemExit(run(_command))
