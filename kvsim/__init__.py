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


def run(scenario, *, out_dir=None, policies=None, progress=None, force=False):
    """Simulate the scenario's policies (or the named ones); a `ScenarioResult` whose `summaries`
    hold each policy's summary.json figures. Writes a results folder only when `out_dir` is given
    (replacing only an earlier results folder, unless `force`)."""
    from kvsim.pipeline import run_scenario

    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    return run_scenario(scenario, out_dir, policies, progress, write=out_dir is not None, force=force)


def memory(scenario, *, kv_dtypes=None, seq_lens=None):
    """The figures of `kvsim memory` as plain records (a dict of lists of dicts: bytes, counts, FLOPs):
    `capacity` (per-GPU breakdown per kv dtype in use, or each of `kv_dtypes`), `bytes_per_token` (every
    kv dtype), `sequences` (bytes per sequence and sequences that fit, per policy and length in
    `seq_lens`, default the table's) and `prefix` (FLOPs a shared-prefix hit saves, or None). A model
    that does not fit raises the one-line error `kvsim memory` and `kvsim.run` give."""
    from kvsim.perf.memory import check_fits
    from kvsim.results.memory_report import memory_records
    from kvsim.scenario.catalog import gpu_spec, model_spec

    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    model, gpu = model_spec(scenario), gpu_spec(scenario)
    check_fits(scenario, model, gpu, scenario.policies)  # the same rules as `run` and `kvsim memory`
    return memory_records(scenario, model, gpu, kv_dtypes, seq_lens)


def validate(scenario, measured, *, policies=None) -> list[dict]:
    """The scenario's analytic prediction against a measured run: one plain record per policy and figure
    ({"policy", "figure", "unit", "measured", "predicted", "error"}). `measured` is the results folder of
    a `triton` backend run of the scenario or a `vllm bench serve --save-result` JSON."""
    from kvsim.calibrate.validate import validate as run_validation

    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    return run_validation(scenario, measured, policies)
