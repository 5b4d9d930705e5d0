"""Step-time backends: `analytic` (roofline, no GPU) and `triton` (a real engine on an NVIDIA GPU).

Backends are found through the `kvsim.backends` entry-point group (pyproject.toml), so a third
party can add one. Each is a class built as `Backend(scenario, policy, model, gpu, capacity,
settings)` (`settings`: the policy's kvsim.engine.settings.EngineSettings) that satisfies
kvsim.engine.interfaces.Backend: `name`, `num_blocks`, `fuses_decode_runs`,
`prices_longest_decode`, `holds_device`, `execute(batch) -> seconds`, `decode_run`, `decode_run_time`,
`free(seq)`, `describe()` and `close()`. The built-in names resolve without reading the installed
entry points (which costs a scan of the environment's metadata).
"""

from __future__ import annotations

from importlib import import_module

from kvsim.errors import KvsimError

_BUILTIN = {
    "analytic": "kvsim.backends.analytic:AnalyticBackend",
    "triton": "kvsim.backends.triton_engine.backend:TritonBackend",
}


def available_backends() -> dict[str, str]:
    from importlib.metadata import entry_points

    found = dict(_BUILTIN)
    for ep in entry_points(group="kvsim.backends"):
        found.setdefault(ep.name, ep.value)
    return found


def load_backend(name: str, source: str = "<scenario>"):
    """The backend class registered under `name`."""
    targets = _BUILTIN if name in _BUILTIN else available_backends()
    if name not in targets:
        raise KvsimError(f"{source}: backend.name: unknown backend '{name}' (available: {', '.join(sorted(targets))})")
    module, _, attr = targets[name].partition(":")
    try:
        return getattr(import_module(module), attr)
    except ImportError as exc:
        raise KvsimError(f"backend '{name}' cannot be loaded: {exc} (install kvsim[gpu] for the triton backend)") from None
