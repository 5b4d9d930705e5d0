"""The `triton` backend: each simulated step runs for real on an NVIDIA GPU and is timed.

The model has the scenario model's shapes and random weights; its KV cache is sized by profiling the
device (`ModelRunner.profile_num_blocks`), and the simulator sizes its allocator with `num_blocks`,
so the block ids in every `Sequence.block_table` are real slots of the GPU cache. `execute(batch)`
returns the wall time of host preparation plus device work. torch is imported only once the
scenario is known to be runnable, so a machine without it gets a one-line `KvsimError`.
"""

from __future__ import annotations

import csv
import gc
import math
import os
import sys
import time
import weakref

from kvsim.errors import KvsimError

GiB = float(1 << 30)
_live: list = []  # a weak reference to the engine holding the GPU; one engine at a time


def _check_scenario(scenario, model) -> None:
    hw, engine = scenario.hardware, scenario.engine
    need = "backend 'triton' needs"
    if engine.preemption_mode == "swap":
        raise KvsimError(f"{scenario.source}: engine.preemption_mode: {need} 'recompute' (swap is not supported)")
    if hw.tensor_parallel_size != 1 or hw.num_replicas != 1:
        raise KvsimError(f"{scenario.source}: hardware: {need} one GPU (tensor_parallel_size = 1, num_replicas = 1)")
    if model.dtype == "fp8":
        raise KvsimError(f"{scenario.source}: model.dtype: {need} bfloat16, float16 or float32 weights, not fp8")
    if scenario.backend.step_time_scale != 1.0:
        raise KvsimError(f"{scenario.source}: backend.step_time_scale: the triton backend times real steps; "
                         "a scale applies to the analytic backend only")
    for policy in scenario.policies:
        if policy.kv_cache_dtype.startswith("fp8") and policy.kv_cache_scales != "per_token":
            raise KvsimError(f"{scenario.source}: policy {policy.name}: kv_cache_scales: the triton backend stores "
                             f"fp8 KV with a scale per token and head; set kv_cache_scales = \"per_token\"")


def _import_torch():
    """torch, once it is known to import and to see a CUDA device."""
    try:
        import torch
        import triton  # noqa: F401  (the kernels need it; fail here, in one line)
    except ImportError as exc:
        raise KvsimError(f"backend 'triton' needs torch and triton with CUDA: {exc} (pip install kvsim[gpu])") from None
    if not torch.cuda.is_available():
        raise KvsimError("backend 'triton' needs an NVIDIA GPU: torch.cuda.is_available() is False (no CUDA device)")
    return torch


class StepLog:
    """Measured step times by phase beside the analytic model's price of the same steps (the shipped
    triton-engine calibration, or the scenario's): `kvsim validate` shows step-level error from them.
    With KVSIM_STEP_LOG=path.csv set, every step is also appended there, in `kvsim profile`'s columns
    (source kvsim-serving) plus the predicted time."""

    def __init__(self, scenario, policy, model, gpu, graph_sizes, max_model_len: int):
        from kvsim.perf.calibration import resolve_calibration
        from kvsim.perf.roofline import StepModel

        try:
            name = scenario.backend.calibration
            sc = scenario if name else scenario.model_copy(
                update={"backend": scenario.backend.model_copy(update={"calibration": "triton"})})
            calibration, self.calibration_source = resolve_calibration(sc, gpu.name)
            self.model = StepModel(model, gpu, scenario.hardware.tensor_parallel_size, policy.kv_cache_dtype,
                                   calibration, scenario.engine.block_size, tuple(graph_sizes), max_model_len)
        except KvsimError:
            self.model, self.calibration_source = None, None
        self.phases: dict[str, list] = {}
        self.graph_sizes = sorted(graph_sizes)
        self._csv, self._fixed = None, None
        path = os.environ.get("KVSIM_STEP_LOG")
        if path:
            new = not os.path.exists(path)
            self._file = open(path, "a", newline="")
            self._csv = csv.writer(self._file)
            if new:
                self._csv.writerow(STEP_LOG_COLUMNS)
            self._fixed = ("kvsim-serving", "serving", gpu.name, "", model.name, policy.kv_cache_dtype, 1)
            self._max_model_len = max_model_len

    def add(self, batch, seconds: float) -> None:
        phase = "prefill" if not batch.num_decode_seqs else "mixed" if batch.num_prefill_seqs else "decode"
        predicted = self.model.step_time(batch) if self.model is not None else 0.0
        self.phases.setdefault(phase, []).append((seconds, predicted))
        if self._csv is not None:
            nd, np_ = batch.num_decode_seqs, batch.num_prefill_seqs
            graph = next((b for b in self.graph_sizes if b >= nd), 0) if phase == "decode" else 0
            longest = batch.decode_max_context
            self._csv.writerow((*self._fixed, int(graph > 0), phase, nd, longest, np_, 0, 0, np_,
                                batch.num_prefill_tokens, batch.prefill_attn_pairs, batch.prefill_context_tokens,
                                nd, batch.decode_context_tokens, f"{seconds:.7g}", f"{predicted:.7g}", graph,
                                longest, self._max_model_len, batch.decode_shared_tokens))

    def close(self) -> None:
        if self._csv is not None:
            self._file.close()
            self._csv = None

    def summary(self) -> dict:
        """Per phase: steps, measured and predicted seconds in all, median predicted / measured."""
        out = {"calibration": self.calibration_source}
        for phase, rows in sorted(self.phases.items()):
            ratios = sorted(p / m for m, p in rows if m > 0)
            known = self.model is not None
            out[phase] = {"steps": len(rows), "measured_s": sum(m for m, _ in rows),
                          "predicted_s": sum(p for _, p in rows) if known else None,
                          "median_ratio": ratios[len(ratios) // 2] if ratios and known else None}
        return out


# kvsim profile's columns (decode_context: the longest; prefill_chunk/cached: not recorded) + the prediction
STEP_LOG_COLUMNS = ("source", "grid", "gpu", "device", "model", "kv_cache_dtype", "tp", "cuda_graph", "phase",
                    "decode_seqs", "decode_context", "prefill_seqs", "prefill_chunk", "prefill_cached",
                    "num_prefill_seqs", "num_prefill_tokens", "prefill_attn_pairs", "prefill_context_tokens",
                    "num_decode_seqs", "decode_context_tokens", "step_s", "predicted_s", "graph_batch",
                    "decode_max_context", "max_model_len", "decode_shared_tokens")


def _release_previous() -> None:
    old = _live[0]() if _live else None
    if old is not None:
        old.close()
    _live.clear()


class TritonBackend:
    name = "triton"
    fuses_decode_runs = False  # every step runs on the device
    holds_device = True  # most of the GPU's memory: one policy at a time
    prices_longest_decode = True

    def __init__(self, scenario, policy, model, gpu, capacity, settings):
        _check_scenario(scenario, model)
        try:
            torch = _import_torch()
        except KvsimError as exc:
            raise KvsimError(f"{scenario.source}: backend.name: {exc}") from None
        from kvsim.backends.triton_engine.runner import ModelRunner, RunnerConfig

        _release_previous()
        self._torch = torch
        self.device = torch.device(scenario.backend.device)
        cfg = RunnerConfig(block_size=settings.block_size, max_num_seqs=settings.max_num_seqs,
                           max_num_batched_tokens=settings.step_budget,
                           max_model_len=settings.max_model_len, kv_cache_dtype=policy.kv_cache_dtype,
                           gpu_memory_utilization=scenario.hardware.gpu_memory_utilization,
                           enforce_eager=scenario.backend.enforce_eager,
                           device=str(self.device), seed=scenario.backend.seed)
        try:
            with torch.cuda.device(self.device):
                self.runner = ModelRunner(model, cfg)
        except KvsimError as exc:
            raise KvsimError(f"{scenario.source}: policy {policy.name}: {exc}") from None
        self.num_blocks = self.runner.num_blocks
        self._capacity, self._policy = capacity, policy.name
        self.step_log = StepLog(scenario, policy, model, gpu, self.runner.graph_sizes, cfg.max_model_len)
        _live.append(weakref.ref(self))
        print(self._profile_line(), file=sys.stderr)

    def execute(self, batch) -> float:
        t0 = time.perf_counter()
        self.runner.execute_model(batch.seqs, batch.num_new_tokens)
        self._torch.cuda.synchronize(self.device)
        took = time.perf_counter() - t0
        self.step_log.add(batch, took)
        return took

    def decode_run(self, shape, max_steps: int, budget_s: float = math.inf):
        raise NotImplementedError("the triton backend runs every step (fuses_decode_runs is False)")

    def decode_run_time(self, shape, k: int) -> float:
        raise NotImplementedError("the triton backend runs every step (fuses_decode_runs is False)")

    def free(self, seq) -> None:
        self.runner.free(seq)

    def close(self) -> None:
        """Drop the model, caches and graphs so a next engine can have the GPU's memory."""
        if getattr(self, "step_log", None) is not None:
            self.step_log.close()
        if getattr(self, "runner", None) is not None:
            self.runner = None
            gc.collect()
            self._torch.cuda.empty_cache()

    def describe(self) -> dict:
        prof, cap = self.runner.profile, self._capacity
        return {
            "device": self._torch.cuda.get_device_name(self.device),
            "num_blocks": self.num_blocks,
            "kv_cache_dtype": self.runner.kv_dtype,
            "cuda_graph_batch_sizes": self.runner.graph_sizes,
            "profile_gib": {"total": prof.total / GiB, "budget": prof.budget / GiB, "weights": prof.weights / GiB,
                            "activation_peak": prof.activation_peak / GiB, "non_torch": prof.non_torch / GiB,
                            "other_torch": prof.other_torch / GiB, "kv": prof.kv / GiB},
            "bytes_per_block": prof.bytes_per_block,
            "analytic_num_blocks": cap.num_blocks if cap is not None else None,
            "step_times": self.step_log.summary(),
        }

    def _profile_line(self) -> str:
        p, c = self.runner.profile, self._capacity
        line = (f"kvsim: triton [{self._policy}] {self._torch.cuda.get_device_name(self.device)}: "
                f"{p.total / GiB:.1f} GiB x {p.gpu_memory_utilization:.2f} - weights {p.weights / GiB:.2f} - "
                f"activations {p.activation_peak / GiB:.2f} - non-torch {p.non_torch / GiB:.2f} - other "
                f"{p.other_torch / GiB:.2f} = KV {p.kv / GiB:.2f} GiB -> {p.num_blocks} blocks of "
                f"{p.bytes_per_block / 2**20:.2f} MiB")
        if c is not None:
            line += (f" | analytic: {c.total / GiB:.1f} GiB x util - weights {c.weights / GiB:.2f} - activations "
                     f"{c.activations / GiB:.2f} - reserve {c.reserve / GiB:.2f} = KV {c.kv / GiB:.2f} GiB -> "
                     f"{c.num_blocks} blocks of {c.bytes_per_block / 2**20:.2f} MiB")
        return line
