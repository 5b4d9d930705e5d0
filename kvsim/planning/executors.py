"""Where planning and sweep simulations run: in this process, on a local process pool, or on Ray.

Every executor offers `submit(fn, *args) -> handle`, `wait(handles) -> handles done` (at least one,
as soon as one is) and `result(handle)`. A simulation is a pure function of its arguments, and
callers key results by their own task, never by completion order, so the answers are the same
bytes whatever the executor or the number of workers.

- `InlineExecutor`: runs each task when submitted (one worker; no start-up cost, easy to debug).
- `PoolExecutor`: `concurrent.futures.ProcessPoolExecutor` over `workers` processes (default: all cores).
- `RayExecutor`: an existing Ray cluster (`ray.init(address=...)`: "auto" or "ray://host:port"),
  or the Ray instance this process already started. Needs the optional `kvsim[cluster]` extra. The
  address is tried first with a plain TCP connection (RAY_CONNECT_TIMEOUT_S), since Ray itself waits
  minutes for a cluster that is not there.

Pool workers start with the signal dispositions kvsim inherited (default or ignored, never kvsim's
own handlers: kvsim.guard.worker_signals), ask Linux to kill them when their parent dies
(`prctl(PR_SET_PDEATHSIG, SIGKILL)` through ctypes; elsewhere they notice at their next task, the pool
breaking), and are killed and reaped by `close` when work is abandoned (an error, Ctrl-C). A pool that
cannot start (too many open files, no /dev/shm, no processes left) is one line.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as futures_wait
from concurrent.futures.process import BrokenProcessPool
from typing import Optional

from kvsim.errors import KvsimError, check_int
from kvsim.guard import worker_signals
from kvsim.scenario.limits import MAX_WORKERS

PR_SET_PDEATHSIG = 1
RAY_CONNECT_TIMEOUT_S = 10.0
WORKER_DIED = "a worker process died (killed, or out of memory): try fewer --workers, or --workers 1"


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


def _start_worker(parent: int) -> None:
    """A pool worker's first act: signals as kvsim inherited them, and death with its parent."""
    worker_signals()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _pool_failed(workers: int, exc: BaseException) -> KvsimError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return KvsimError(f"cannot start {workers} worker processes ({reason}): --workers 1 runs in this process")


class PoolExecutor(InlineExecutor):
    def __init__(self, workers: int):
        self.workers = workers
        self._pending: set[Future] = set()
        try:
            self.pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(os.getpid(),))
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


class RayExecutor:
    def __init__(self, address: Optional[str] = None):
        try:
            import ray
        except ImportError:
            raise KvsimError("--ray needs Ray: pip install 'kvsim[cluster]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            _probe(address)
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise KvsimError(f"--ray {address}: cannot connect to a Ray cluster ({exc})") from None
            self.started = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = {}

    def submit(self, fn, *args):
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self.ray.remote(fn)
        return remote.remote(*args)

    def wait(self, handles):
        done, _ = self.ray.wait(list(handles), num_returns=1)
        return done

    def result(self, handle):
        return self.ray.get(handle)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def _host_port(address: Optional[str]) -> Optional[tuple[str, int]]:
    """(host, port) of a Ray address: "host:port", "ray://host:port", or "auto" as Ray would resolve it."""
    if address in (None, "auto"):
        try:
            from ray._private.services import canonicalize_bootstrap_address
            address = canonicalize_bootstrap_address(address)
        except Exception:  # Ray's private helper moved: leave the connection to Ray itself
            return None
        if address is None:
            return None
    text = address.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise KvsimError(f"--ray {address}: expected 'auto', HOST:PORT or ray://HOST:PORT")
    return host.strip("[]"), int(port)


def _probe(address: Optional[str]) -> None:
    """One line, within RAY_CONNECT_TIMEOUT_S, unless something listens at the Ray address."""
    where = _host_port(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or "timed out"
        raise KvsimError(f"--ray {address}: cannot connect to a Ray cluster at {where[0]}:{where[1]} ({reason})") \
            from None


def make_executor(workers: Optional[int] = None, ray: Optional[str] = None):
    """Ray when `ray` names a cluster ("auto", an address, or "local" for the Ray this process
    already runs); else a process pool of `workers` (default: every core), or inline for one."""
    if ray is not None:
        if not isinstance(ray, str):
            raise KvsimError(f"--ray: expected an address string ('auto', HOST:PORT, 'local'), got {ray!r}")
        return RayExecutor(None if ray == "local" else ray)
    workers = workers or os.cpu_count() or 1
    check_int(workers, "--workers", 1, MAX_WORKERS)
    return InlineExecutor() if workers == 1 else PoolExecutor(workers)


def run_all(executor, fn, tasks: list[tuple], on_done=None) -> list:
    """fn(*task) for every task, results in task order; `on_done(i, result)` as each completes."""
    pending = {executor.submit(fn, *task): i for i, task in enumerate(tasks)}
    out: list = [None] * len(tasks)
    while pending:
        for handle in executor.wait(pending):
            i = pending.pop(handle)
            out[i] = executor.result(handle)
            if on_done is not None:
                on_done(i, out[i])
    return out
