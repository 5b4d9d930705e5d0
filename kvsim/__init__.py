"""kvsim: replay LLM request arrivals against KV-cache policies and report latency, throughput and memory.

Read a request's path in this order: scenario.config (scenario TOML) -> scenario.workload/traces
(requests) -> engine.simulator (arrivals, one engine loop per replica; engine.router) -> engine.replica
(a step: engine.scheduler, vLLM V1 semantics; engine.block_manager / engine.contiguous, allocators) ->
kvsim.backends.analytic (perf.pricing, perf.roofline) or kvsim.backends.triton_engine (step time) ->
results.metrics (the engine's observer) -> results.writer/report. engine.interfaces names the
Protocols where these parts meet (docs/architecture.md).

The library API below is what the command line and the dashboard call; each function imports its
machinery when first called, so `import kvsim` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_scenario(path, overrides=()):
    """A validated `Scenario` from a TOML file, with `--set`-style `dotted.key=value` overrides."""
    from kvsim.scenario.config import load_scenario as load

    return load(path, overrides)


def run(scenario, *, out_dir=None, policies=None, progress=None, force=False, workers=1):
    """Simulate the scenario's policies (or the named ones); a `ScenarioResult` whose `summaries`
    hold each policy's summary.json figures and whose `.to_frame()` is a row per policy (the
    verdict and headline figures). Writes a results folder only when `out_dir` is given
    (replacing only an earlier results folder, unless `force`). `workers` > 1 simulates that many
    policies at once on worker processes forked from this one (None: one per policy, up to the
    cores); the same results either way."""
    from kvsim.pipeline import run_scenario

    _check_progress(progress)
    return run_scenario(_scenario(scenario), out_dir, policies, progress, write=out_dir is not None, force=force,
                        workers=workers)


def _check_progress(progress) -> None:
    from kvsim.errors import check_callable

    check_callable(progress, "progress")


def _scenario(scenario, overrides=()):
    return scenario if hasattr(scenario, "policies") else load_scenario(scenario, overrides)


def plan(scenario, *, policies=None, seeds=3, resolution=0.02, num_requests=None, workers=None, ray=None,
         progress=None, tune=False, exhaustive=False):
    """Each policy's safe arrival rate under the scenario's SLO (`kvsim plan`).

    `scenario`: a `Scenario` or a TOML path. A rate is sustainable when the SLO is met at its
    percentile and the engine keeps up (kvsim.results.verdict); per policy and seed the rate is
    bracketed and bisected to ±`resolution`, with `num_requests` requests a point (default: the
    scenario's, at most 3000), on `workers` local processes (default: every core) or a Ray cluster
    (`ray="auto"` or an address; "local": the Ray this process started). The *safe rate* is the
    highest rate at which every seed and a run four times longer were simulated and found
    sustainable. `progress(done, total)` is called after every simulated point. `tune`: also search
    each policy's max_num_seqs and max_num_batched_tokens (`.tuning`). `exhaustive`: every point
    simulated whole and every search in full (`kvsim plan --exhaustive`: the same answers, slower; by
    default a run stops once it is certain to be unsustainable and later seeds start from the first's knee).

    Returns a `kvsim.planning.capacity.PlanResult`: `.policies` holds a `PolicyCapacity` per policy
    (`policy`, `safe_rate`, `mean_rate` (the seeds' knees' mean), `ci_low`, `ci_high` (95%),
    `seed_max_rates`, `censored`, `scenario_rate`, `headroom` (safe_rate against the scenario's
    rate), `sustainable_at_scenario_rate`, `binding`, `binding_detail`, `at_safe_rate`: the point
    figures at safe_rate averaged over seeds, and `worst_*` over the seeds and the long run);
    `kvsim.planning.capacity.ties(result.policies)` groups those whose intervals overlap; `.points`
    every simulated point (policy, seed, rate, phase and the figures of kvsim.results.verdict.FIGURES);
    `.to_frame()` and `.points_frame()` give pandas DataFrames, `.to_dict()` the plan.json document.
    """
    from kvsim.planning.capacity import plan as run_plan

    _check_progress(progress)
    return run_plan(_scenario(scenario), policies=policies, seeds=seeds, resolution=resolution,
                    num_requests=num_requests, workers=workers, ray=ray, progress=progress, tune=tune,
                    exhaustive=exhaustive)


def deploy(scenario, target_rate, *, gpus=None, tensor_parallel=(1, 2, 4, 8), policy=None, seeds=3,
           resolution=0.02, num_requests=None, top=3, max_replicas=64, workers=None, ray=None, progress=None,
           headroom=True, disaggregated=False, exhaustive=False):
    """The cheapest deployments (GPU, tensor parallelism, replicas, KV policy) that meet the SLO at
    `target_rate` req/s (`kvsim plan --target-rate`): every seed and a run four times longer
    sustain it. `policy`: a name or a list of candidates (default: every policy `vllm serve` can run,
    kvsim.scenario.layout.serve_problem; each GPU and TP degree keeps the one whose replica sustains the
    most).

    Candidates: `gpus` (default: every preset) × `tensor_parallel` degrees; prices from the
    scenario's [cost] section, else kvsim.scenario.catalog.GPU_PRICES. Returns a
    `kvsim.planning.deploy.DeployResult`: `.deployments` (cheapest first, at most `top` and every
    one meets the target; no layout left out is cheaper than one listed), each a `Deployment`
    (`gpu`, `tensor_parallel_size`, `num_replicas`, `num_gpus`, `policy`, `replica_rate`,
    `safe_rate`/`mean_rate`/`ci_low`/`ci_high`/`headroom` (searched unless `headroom=False`),
    `usd_per_hour`, `usd_per_m_input`, `usd_per_m_output`, `price_source`, `binding`,
    `binding_detail`, `at_target`: figures at the target rate, `vllm_flags`: one replica's `vllm serve`
    flags; `.answer()`: the line to act on); `.skipped` layouts with the reason and its `kind`; `.points`; `.to_frame()`, `.points_frame()`, `.to_dict()`.
    Every policy is served aggregated here, on [hardware]'s layout searched.

    `disaggregated=True` (`kvsim plan --target-rate` on a scenario with [disaggregation]) searches
    prefill and decode instance counts per pool layout instead: `gpus` and `tensor_parallel` (default:
    the scenario's pools' own) for each pool, `policy` a name or a list (default: every policy served
    disaggregated; the aggregated side takes every policy, served aggregated), `max_replicas` per pool; `top` and `headroom` do not apply. Returns a
    `kvsim.planning.disagg.PDPlan`: `.deployments` (each pool layout's cheapest passing counts,
    cheapest first: `PDDeployment` with `num_prefill`, `num_decode`, both pools' GPU and TP, cost,
    `prefill_binding`/`decode_binding` at the target and whether one instance fewer of each fails),
    `.aggregated` (the `DeployResult` of the same GPUs and TP degrees), `.verdict()` (aggregated or
    disaggregated, which ratio, by how much), `.table()` (the comparison as records: policy, pools,
    $, TTFT/TPOT/ITL at the SLO's percentile), `.to_frame()`, `.to_dict()`. `$/hour` everywhere counts
    every GPU (kvsim.scenario.layout.hourly_cost: TP × DP × replicas, or both pools). `exhaustive`: as
    `plan`'s.
    """
    from kvsim.planning.deploy import deploy as run_deploy
    from kvsim.planning.disagg import aggregated, pd_deploy

    _check_progress(progress)
    if disaggregated:
        return pd_deploy(_scenario(scenario), target_rate, gpus=gpus,
                         tensor_parallel=None if tensor_parallel == (1, 2, 4, 8) else tensor_parallel, policy=policy,
                         seeds=seeds, resolution=resolution, num_requests=num_requests, max_replicas=max_replicas,
                         workers=workers, ray=ray, progress=progress, exhaustive=exhaustive)
    return run_deploy(aggregated(_scenario(scenario)), target_rate, gpus=gpus, tensor_parallel=tensor_parallel,
                      policy=policy, seeds=seeds, resolution=resolution, num_requests=num_requests, top=top,
                      max_replicas=max_replicas, workers=workers, ray=ray, progress=progress, headroom=headroom,
                      exhaustive=exhaustive)


def sweep(scenario, points, *, workers=None, ray=None, progress=None):
    """Simulate a grid (`points`: a dict {dotted.key: [values]}, every combination) or a list of
    points (each a list of 'dotted.key=value' overrides), as `kvsim sweep`.

    Returns a `kvsim.planning.sweep.SweepResult`: `.rows`, a row per point × policy (`point`, each
    swept key's value, `policy` and the figures of kvsim.results.verdict.FIGURES), `.to_frame()` a
    pandas DataFrame with `.columns` in order. The same rows whatever `workers` or `ray`.
    """
    from kvsim.planning.sweep import sweep as run_sweep

    _check_progress(progress)
    return run_sweep(_scenario(scenario), points, workers=workers, ray=ray, progress=progress)


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
    check_fits(scenario, model, gpu, scenario.policies, simulate=False)  # the same rules as `kvsim memory`
    return memory_records(scenario, model, gpu, kv_dtypes, seq_lens)


def validate(scenario, measured, *, policies=None) -> list[dict]:
    """The scenario's analytic prediction against a measured run: one plain record per policy and figure
    ({"policy", "figure", "unit", "measured", "predicted", "error"}). `measured` is the results folder of
    a `triton` backend run of the scenario or a `vllm bench serve --save-result` JSON."""
    from kvsim.calibrate.validate import validate as run_validation

    if not hasattr(scenario, "policies"):
        scenario = load_scenario(scenario)
    return run_validation(scenario, measured, policies)
