"""The analytic backend: exact block accounting (in the scheduler) priced by measured vLLM kernels
(kvsim/perf/measured.py) where tables ship for the GPU, else by the roofline step model.

No GPU, no torch. Runs of identical decode steps are priced in closed form, so the simulator can
advance them as one event.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from kvsim.batch import Batch
from kvsim.perf.calibration import resolve_calibration
from kvsim.perf.measured import measured_step_model
from kvsim.perf.memory import max_model_len
from kvsim.perf.roofline import VLLM_GRAPH_SIZES, StepModel


class AnalyticBackend:
    name = "analytic"
    fuses_decode_runs = True

    def __init__(self, scenario, policy, model, gpu, capacity):
        calibration, self.calibration_source = resolve_calibration(scenario, gpu.name)
        self.step_model = measured_step_model(scenario, policy, model, gpu, calibration)
        if self.step_model is None:
            graphs = () if scenario.backend.enforce_eager else VLLM_GRAPH_SIZES
            self.step_model = StepModel(model, gpu, scenario.hardware.tensor_parallel_size, policy.kv_cache_dtype,
                                        calibration, scenario.engine.block_size, graphs,
                                        max_model_len(scenario, model),
                                        per_token_scales=policy.kv_cache_scales == "per_token")
            # whether a step's price reads the longest decode (Batch.decode_max_context), which the scheduler keeps
            self.prices_longest_decode = calibration.decode_key_s > 0
        else:
            self.prices_longest_decode = self.step_model.prices_longest_decode
        self.num_blocks = capacity.num_blocks
        self.calibration = calibration

    def execute(self, batch: Batch) -> float:
        return self.step_model.step_time(batch)

    def decode_run(self, batch: Batch, max_steps: int, budget_s: float = math.inf) -> tuple[int, float, float]:
        """(k, seconds for the k steps, seconds for the first) of the cohort-only `batch` repeated:
        k = max_steps, or fewer if a step would start at or after budget_s (the next arrival)."""
        return self.step_model.decode_run_within(batch.num_decode_seqs, batch.decode_read_tokens,
                                                 max_steps, budget_s, batch.decode_max_context)

    def decode_run_time(self, batch: Batch, k: int) -> float:
        """Seconds for the first k steps of the cohort-only `batch` repeated (0 for k = 0)."""
        return self.step_model.decode_run_time(batch.num_decode_seqs, batch.decode_read_tokens, k,
                                               batch.decode_max_context)

    def decode_steps_within(self, batch: Batch, budget_s: float) -> int:
        """The smallest k >= 1 whose first k steps take budget_s or more."""
        return self.step_model.decode_steps_within(batch.num_decode_seqs, batch.decode_read_tokens, budget_s,
                                                   batch.decode_max_context)

    def free(self, seq) -> None:
        pass

    def describe(self) -> dict:
        out = {"backend": self.name, "calibration": asdict(self.calibration),
               "calibration_source": self.calibration_source}
        describe = getattr(self.step_model, "describe", None)  # the roofline's runs keep their summary as it was
        if describe is not None:
            out["pricing"] = describe()
        return out
