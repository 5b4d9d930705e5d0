"""Step-time backends: `analytic` (roofline, no GPU) and `triton` (a real engine on an NVIDIA GPU).

Backends are found through the `kvsim.backends` entry-point group (pyproject.toml), so a third
party can add one. Each is a class built as `Backend(scenario, policy, model, gpu, capacity)` with
`num_blocks`, `fuses_decode_runs`, `execute(batch) -> seconds`, `free(seq)` and `describe()`.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points

from kvsim.errors import KvsimError

_BUILTIN = {
    "analytic": "kvsim.backends.analytic:AnalyticBackend",
    "triton": "kvsim.backends.triton_engine.backend:TritonBackend",
}


def available_backends() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kvsim.backends"):
        found.setdefault(ep.name, ep.value)
    return found


def load_backend(name: str, source: str = "<scenario>"):
    """The backend class registered under `name`."""
    targets = available_backends()
    if name not in targets:
        raise KvsimError(f"{source}: backend.name: unknown backend '{name}' (available: {', '.join(sorted(targets))})")
    module, _, attr = targets[name].partition(":")
    try:
        return getattr(import_module(module), attr)
    except ImportError as exc:
        raise KvsimError(f"backend '{name}' cannot be loaded: {exc} (install kvsim[gpu] for the triton backend)") from None
