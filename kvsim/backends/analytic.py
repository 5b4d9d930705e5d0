"""The analytic backend: exact block accounting (in the scheduler) priced by measured vLLM kernels
(kvsim.perf.measured) where tables ship for the GPU, else by the roofline step model.

No GPU, no torch. The pricer (a `kvsim.perf.pricing.RunPricer`: `MeasuredStepModel` or
`kvsim.perf.roofline.StepModel`) prices single steps, and runs of identical decode steps in closed
form, so the simulator can advance a run as one event.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from kvsim.batch import Batch, DecodeShape
from kvsim.perf.calibration import resolve_calibration
from kvsim.perf.measured import measured_step_model
from kvsim.perf.pricing import DecodeRunPrice, RunPricer, ScaledPricer
from kvsim.perf.roofline import VLLM_GRAPH_SIZES, StepModel
from kvsim.perf.speculative import SpeculativePricer, drafter_calibration, spec_graph_sizes


def step_pricer(scenario, policy, model, gpu, calibration, settings, capacity, decode_query_len: int = 1,
                host: bool = True):
    """The pricer of `model`'s steps: measured kernels where they apply, else the roofline.
    `decode_query_len`: 1 + num_speculative_tokens (CUDA graphs' sizes are its multiples); `host=False`:
    GPU work alone, no per-step fixed or host costs (a speculative drafter's passes)."""
    pricer = measured_step_model(scenario, policy, model, gpu, calibration, settings, capacity, decode_query_len,
                                 host)
    if pricer is not None:
        return pricer
    graphs = () if scenario.backend.enforce_eager else spec_graph_sizes(VLLM_GRAPH_SIZES, decode_query_len)
    windows, hw = [w for w in settings.kv_windows if w], scenario.hardware
    pricer = StepModel(model, gpu, hw.tensor_parallel_size, policy.kv_cache_dtype,
                       calibration if host else drafter_calibration(calibration), settings.block_size, graphs,
                       settings.max_model_len, per_token_scales=policy.kv_cache_scales == "per_token",
                       window=min(windows) if windows else 0, dp=hw.data_parallel_size,
                       expert_parallel=hw.enable_expert_parallel, expert_skew=scenario.model.expert_skew)
    pricer.prices_longest_decode = calibration.decode_key_s > 0
    return pricer


class AnalyticBackend:
    name = "analytic"
    fuses_decode_runs = True
    holds_device = False  # no device: a scenario's policies may run side by side

    def __init__(self, scenario, policy, model, gpu, capacity, settings):
        calibration, self.calibration_source = resolve_calibration(scenario, gpu.name)
        spec = settings.speculation
        pricer = step_pricer(scenario, policy, model, gpu, calibration, settings, capacity,
                             1 + spec.k if spec is not None else 1)
        # whether a step's price reads the longest decode (Batch.decode_max_context), which the scheduler keeps
        self.prices_longest_decode = pricer.prices_longest_decode
        if spec is not None:  # the verify pass and the drafter's passes (kvsim.perf.speculative)
            draft = None if spec.draft is None else step_pricer(scenario, policy, spec.draft, gpu, calibration,
                                                                settings, capacity, host=False)
            pricer = SpeculativePricer(pricer, draft, spec)
            self.prices_longest_decode = False
        scale = scenario.backend.step_time_scale
        self.pricer: RunPricer = pricer if scale == 1.0 else ScaledPricer(pricer, scale)
        self.num_blocks = capacity.num_blocks
        self.calibration = calibration
        # The Backend methods are the pricer's own (bound here: no call layer per step).
        self.execute = self.pricer.step_time
        self.decode_run = self.pricer.decode_run_within
        self.decode_run_time = self.pricer.decode_run_time

    def execute(self, batch: Batch) -> float:
        return self.pricer.step_time(batch)

    def decode_run(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        """The cohort-only step of `shape` repeated: max_steps steps, or fewer if a step would start
        at or after budget_s (the next arrival)."""
        return self.pricer.decode_run_within(shape, max_steps, budget_s)

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        """Seconds for the first k steps of the run (0 for k = 0)."""
        return self.pricer.decode_run_time(shape, k)

    def free(self, seq) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        out = {"backend": self.name, "calibration": asdict(self.calibration),
               "calibration_source": self.calibration_source}
        describe = getattr(self.pricer, "describe", None)  # the roofline's runs keep their summary as it was
        pricing = describe() if describe is not None else None
        if pricing is not None:
            out["pricing"] = pricing
        return out
