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


class AnalyticBackend:
    name = "analytic"
    fuses_decode_runs = True
    holds_device = False  # no device: a scenario's policies may run side by side

    def __init__(self, scenario, policy, model, gpu, capacity, settings):
        calibration, self.calibration_source = resolve_calibration(scenario, gpu.name)
        pricer = measured_step_model(scenario, policy, model, gpu, calibration, settings, capacity)
        if pricer is None:
            graphs = () if scenario.backend.enforce_eager else VLLM_GRAPH_SIZES
            pricer = StepModel(model, gpu, scenario.hardware.tensor_parallel_size, policy.kv_cache_dtype,
                               calibration, settings.block_size, graphs, settings.max_model_len,
                               per_token_scales=policy.kv_cache_scales == "per_token")
            # whether a step's price reads the longest decode (Batch.decode_max_context), which the scheduler keeps
            self.prices_longest_decode = calibration.decode_key_s > 0
        else:
            self.prices_longest_decode = pricer.prices_longest_decode
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
