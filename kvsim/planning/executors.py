"""Where planning and sweep simulations run: in this process, on a local process pool, or on Ray.

Every executor offers `submit(fn, *args) -> handle`, `wait(handles) -> handles done` (at least one,
as soon as one is) and `result(handle)`. A simulation is a pure function of its arguments, and
callers key results by their own task, never by completion order, so the answers are the same
bytes whatever the executor or the number of workers.

- `InlineExecutor`, `PoolExecutor` (kvsim.workers): in this process, or on a local process pool of
  `workers` processes (default: all cores), started and stopped as kvsim.workers says.
- `RayExecutor`: an existing Ray cluster (`ray.init(address=...)`: "auto" or "ray://host:port"),
  or the Ray instance this process already started. Needs the optional `kvsim[cluster]` extra. The
  address is tried first with a plain TCP connection (RAY_CONNECT_TIMEOUT_S), since Ray itself waits
  minutes for a cluster that is not there.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

from kvsim.errors import KvsimError, check_int
from kvsim.scenario.limits import MAX_WORKERS
from kvsim.workers import InlineExecutor, PoolExecutor

RAY_CONNECT_TIMEOUT_S = 10.0


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
