"""Worker processes: the executors that run tasks here or on a local process pool, and `run_forked`,
which runs a few tasks on forked workers and gives their results in task order.

Every executor offers `submit(fn, *args) -> handle`, `wait(handles) -> handles done` (at least one,
as soon as one is) and `result(handle)`; kvsim.planning.executors adds Ray and picks one.

- `InlineExecutor`: runs each task when submitted (one worker; no start-up cost, easy to debug).
- `PoolExecutor`: `concurrent.futures.ProcessPoolExecutor` over `workers` processes (`fork=True`: forked
  from this process, so a task and what it reads reach the workers without being pickled).
- `run_forked(fn, num_tasks, workers, on_progress)`: `fn(i, report)` for every task i on forked
  workers (how `kvsim run` simulates a scenario's policies side by side); the results come back
  pickled, in task order, and the error raised is the first failing task's, as if they had run one
  after the other. `report(n)` adds n to the task's counter in shared memory, which this process
  polls a few times a second and hands on as `on_progress(i, n)`.

Pool workers start with the signal dispositions kvsim inherited (default or ignored, never kvsim's
own handlers: kvsim.guard.worker_signals), ask Linux to kill them when their parent dies
(`prctl(PR_SET_PDEATHSIG, SIGKILL)` through ctypes; elsewhere they notice at their next task, the pool
breaking), and are killed and reaped by `close` when work is abandoned (an error, Ctrl-C). A pool that
cannot start (too many open files, no /dev/shm, no processes left) is one line.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as futures_wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Optional

from kvsim.errors import KvsimError
from kvsim.guard import worker_signals

PR_SET_PDEATHSIG = 1
WORKER_DIED = "a worker process died (killed, or out of memory): try fewer --workers, or --workers 1"
POLL_S = 0.2  # how often run_forked hands on its workers' progress


class InlineExecutor:
    workers = 1

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # re-raised by result()
            fut.set_exception(exc)
        return fut

    def wait(self, handles):
        return list(handles)

    def result(self, handle):
        return handle.result()

    def close(self) -> None:
        pass


def start_worker(parent: int) -> None:
    """A pool worker's first act: signals as kvsim inherited them, and death with its parent."""
    worker_signals()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _pool_failed(workers: int, exc: BaseException) -> KvsimError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return KvsimError(f"cannot start {workers} worker processes ({reason}): --workers 1 runs in this process")


def can_fork() -> bool:
    """Whether worker processes can be forked from this one (Linux and macOS, not Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


class PoolExecutor(InlineExecutor):
    def __init__(self, workers: int, fork: bool = False):
        self.workers = workers
        self._pending: set[Future] = set()
        context = multiprocessing.get_context("fork") if fork else None
        try:
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=start_worker,
                                            initargs=(os.getpid(),))
        except (OSError, ValueError) as exc:  # no semaphores (/dev/shm), no descriptors left
            raise _pool_failed(workers, exc) from None

    def submit(self, fn, *args) -> Future:
        try:
            fut = self.pool.submit(fn, *args)  # starts the workers at the first task
        except OSError as exc:
            self.close()
            raise _pool_failed(self.workers, exc) from None
        except BrokenProcessPool:
            self.close()
            raise KvsimError(WORKER_DIED) from None
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    def wait(self, handles):
        done, _ = futures_wait(list(handles), return_when=FIRST_COMPLETED)
        return list(done)

    def result(self, handle):
        try:
            return handle.result()
        except BrokenProcessPool:
            raise KvsimError(WORKER_DIED) from None

    def close(self) -> None:
        """Shut the pool down; workers still busy (the work was abandoned) are killed first. Every worker
        is reaped before this returns."""
        if any(not f.done() for f in list(self._pending)):
            for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                try:
                    proc.kill()
                except (OSError, ValueError, AttributeError):
                    pass
        self.pool.shutdown(wait=True, cancel_futures=True)


# ---- a few tasks on forked workers ---------------------------------------------------------------

_forked_task: Optional[Callable] = None  # the task of the pool run_forked starts: its forked workers find it here


def _run_forked_task(i: int):
    return _forked_task(i)


def run_forked(fn: Callable, num_tasks: int, workers: int,
               on_progress: Optional[Callable[[int, int], None]] = None) -> list:
    """fn(i, report) for i in range(num_tasks) on `workers` forked processes (see the module
    docstring); `report` is None without `on_progress`. The results, in task order."""
    global _forked_task
    from multiprocessing.sharedctypes import RawArray

    counters = RawArray("q", num_tasks) if on_progress is not None else None

    def task(i: int):
        def report(n: int) -> None:
            counters[i] += n
        return fn(i, report if counters is not None else None)

    _forked_task = task
    pool = PoolExecutor(workers, fork=True)
    try:
        pending = {pool.submit(_run_forked_task, i): i for i in range(num_tasks)}  # the pool forks here
        return _collect(pool, pending, num_tasks, counters, on_progress)
    finally:
        pool.close()
        _forked_task = None


def _collect(pool: PoolExecutor, pending: dict, num_tasks: int, counters, on_progress) -> list:
    """The tasks' results in order, progress handed on as it comes; raises the first failing task's error
    once every task before it has finished (what running them one after the other would raise)."""
    results, errors, seen = [None] * num_tasks, {}, [0] * num_tasks
    while pending:
        done, _ = futures_wait(list(pending), timeout=POLL_S, return_when=FIRST_COMPLETED)
        for i in range(num_tasks if counters is not None else 0):  # a finished task's last counts too
            if counters[i] > seen[i]:
                on_progress(i, counters[i] - seen[i])
                seen[i] = counters[i]
        for fut in done:
            i = pending.pop(fut)
            try:
                results[i] = pool.result(fut)
            except Exception as exc:  # noqa: BLE001 - raised below, in task order
                errors[i] = exc
        if errors and min(errors) < min(pending.values(), default=num_tasks):
            raise errors[min(errors)]
    return results
