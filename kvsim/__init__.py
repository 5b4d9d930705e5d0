"""kvsim: replay LLM request arrivals against KV-cache policies and report latency, throughput and memory.

Read a request's path in this order: scenario.config (scenario TOML) -> scenario.workload/traces
(requests) -> engine.simulator (SimPy arrival + engine processes) -> engine.scheduler (vLLM V1
semantics) -> engine.block_manager / engine.contiguous (allocators) -> backends.analytic (with
perf.roofline) or backends.triton_engine (step time) -> results.metrics -> results.writer/report.

The library API below is what the command line and the dashboard call; each function imports its
machinery when first called, so `import kvsim` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_scenario(path, overrides=()):
    """A validated `Scenario` from a TOML file, with `--set`-style `dotted.key=value` overrides."""
    from kvsim.scenario.config import load_scenario as load

    return load(path, overrides)


def run(scenario, *, out_dir=None, policies=None, progress=None):
    """Simulate the scenario's policies (or the named ones); a `ScenarioResult` whose `summaries`
    hold each policy's summary.json figures. Writes a results folder only when `out_dir` is given."""
    from kvsim.run import run_scenario

    _keep_run()
    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    return run_scenario(scenario, out_dir, policies, progress, write=out_dir is not None)


_run = run


def _keep_run() -> None:
    """Loading the kvsim.run module binds it to this package's `run`: put the function back."""
    globals()["run"] = _run


def validate(scenario, measured, *, policies=None) -> list[dict]:
    """The scenario's analytic prediction against a measured run: one plain record per policy and figure
    ({"policy", "figure", "unit", "measured", "predicted", "error"}). `measured` is the results folder of
    a `triton` backend run of the scenario or a `vllm bench serve --save-result` JSON."""
    from kvsim.calibrate.validate import validate as run_validation

    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    try:
        return run_validation(scenario, measured, policies)
    finally:
        _keep_run()
