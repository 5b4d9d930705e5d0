"""Where planning and sweep simulations run: in this process, on a local process pool, or on Ray.

Every executor offers `submit(fn, *args) -> handle`, `wait(handles) -> handles done` (at least one,
as soon as one is) and `result(handle)`. A simulation is a pure function of its arguments, and
callers key results by their own task, never by completion order, so the answers are the same
bytes whatever the executor or the number of workers.

- `InlineExecutor`: runs each task when submitted (one worker; no start-up cost, easy to debug).
- `PoolExecutor`: `concurrent.futures.ProcessPoolExecutor` over `workers` processes (default: all cores).
- `RayExecutor`: an existing Ray cluster (`ray.init(address=...)`: "auto" or "ray://host:port"),
  or the Ray instance this process already started. Needs the optional `kvsim[cluster]` extra.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Optional

from kvsim.errors import KvsimError, check_int
from kvsim.scenario.limits import MAX_WORKERS


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


class PoolExecutor(InlineExecutor):
    def __init__(self, workers: int):
        self.workers = workers
        self.pool = ProcessPoolExecutor(max_workers=workers)

    def submit(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)

    def wait(self, handles):
        done, _ = futures_wait(list(handles), return_when=FIRST_COMPLETED)
        return list(done)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class RayExecutor:
    def __init__(self, address: Optional[str] = None):
        try:
            import ray
        except ImportError:
            raise KvsimError("--ray needs Ray: pip install 'kvsim[cluster]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
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


def make_executor(workers: Optional[int] = None, ray: Optional[str] = None):
    """Ray when `ray` names a cluster ("auto", an address, or "local" for the Ray this process
    already runs); else a process pool of `workers` (default: every core), or inline for one."""
    if ray is not None:
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
