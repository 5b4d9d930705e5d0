"""Analytic step time: a roofline model of one engine step, and closed forms for runs of decode steps.

One step costs a fixed host overhead, then the larger of its compute time (GEMMs, attention and KV
dequantization) and its HBM time (weights, KV read and written), then the tensor-parallel all-reduces
and any swap copies over PCIe. A few named `Calibration` coefficients map datasheet peaks to achieved
rates. Pure Python: no torch.
"""

from __future__ import annotations

import math
from functools import partial
from dataclasses import dataclass, fields
from pathlib import Path

from kvsim.catalog import GpuSpec, ModelSpec
from kvsim.errors import KvsimError, read_json_object
from kvsim.memory import QUANTIZED_KV, bytes_per_block, kv_bytes_per_token, kv_elements_per_token

_EFFICIENCIES = ("compute_efficiency", "attention_efficiency", "memory_efficiency")


@dataclass(slots=True, frozen=True)
class Calibration:
    """Coefficients from datasheet peaks to achieved time; defaults fit H100-class GPUs running vLLM."""

    compute_efficiency: float = 0.6  # achieved / peak dense FLOP/s for GEMMs
    attention_efficiency: float = 0.4  # achieved / peak for attention FLOPs
    memory_efficiency: float = 0.85  # achieved / datasheet HBM bandwidth
    step_overhead_s: float = 0.004  # scheduler + launch + sampling per step
    per_seq_overhead_s: float = 1e-5  # host work per scheduled sequence
    allreduce_latency_s: float = 1e-5  # per all-reduce call (2 per layer when tp > 1)
    dequant_flops_per_element: float = 2.0  # per KV element read from a quantized cache (int4: twice)


def load_calibration(path) -> Calibration:
    """A Calibration from a JSON object holding any of its fields; the rest keep their defaults."""
    path = Path(path)
    data = read_json_object(path, "calibration (backend.calibration)")
    known = [f.name for f in fields(Calibration)]
    for key, value in data.items():
        if key not in known:
            raise KvsimError(f"{path}: {key}: unknown calibration key (known: {', '.join(known)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KvsimError(f"{path}: {key}: must be a number, got {value!r}")
        if key in _EFFICIENCIES and not 0 < value <= 1:
            raise KvsimError(f"{path}: {key}: must be in (0, 1], got {value!r}")
        if value < 0:
            raise KvsimError(f"{path}: {key}: must not be negative, got {value!r}")
    return Calibration(**{k: float(v) for k, v in data.items()})


def _line_sum(a: float, b: float, lo: int, hi: int) -> float:
    """sum of a + b*i for i in [lo, hi)."""
    n = hi - lo
    return a * n + b * ((lo + hi - 1) * n / 2) if n > 0 else 0.0


def _sum_max_lines(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """sum over i in [0, k) of max(a1 + b1*i, a2 + b2*i): split where the lines cross."""
    if k == 1:
        return a1 if a1 >= a2 else a2
    d0, d1 = a1 - a2, b1 - b2
    if d1 == 0:
        return _line_sum(a1, b1, 0, k) if d0 >= 0 else _line_sum(a2, b2, 0, k)
    below, above = ((a2, b2), (a1, b1)) if d1 > 0 else ((a1, b1), (a2, b2))
    cross = -d0 / d1
    if cross <= 0.0 or cross >= k:  # one line on top for the whole run (the usual case)
        return _line_sum(*(above if cross <= 0.0 else below), 0, k)
    s = math.ceil(cross)  # first index at or past the crossing
    return _line_sum(*below, 0, s) + _line_sum(*above, s, k)


def _run_time(fixed: float, c0: float, cs: float, m0: float, ms: float, k: int) -> float:
    """k decode steps whose step i costs fixed + max(c0 + cs*i, m0 + ms*i)."""
    return fixed * k + _sum_max_lines(c0, cs, m0, ms, k)


class StepModel:
    """Step time of one replica (tp GPUs) serving `model` with a given KV-cache dtype."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, kv_cache_dtype: str,
                 calibration: Calibration, block_size: int = 16):
        self.model, self.gpu, self.tp = model, gpu, tp
        self.kv_cache_dtype, self.calibration, self.block_size = kv_cache_dtype, calibration, block_size
        c = calibration
        peak = (gpu.fp8_tflops if model.dtype == "fp8" else gpu.bf16_tflops) * 1e12
        bandwidth = gpu.hbm_bandwidth_gbps * 1e9 * c.memory_efficiency
        self.kv_bytes_per_token = kv_bytes_per_token(model, kv_cache_dtype, tp)
        self.bytes_per_block = bytes_per_block(model, kv_cache_dtype, block_size, tp)
        # Seconds per unit of work, per GPU.
        self.gemm_s_per_flop = 1.0 / (tp * peak * c.compute_efficiency)
        lm_head = model.gemm_flops(0, 1)  # only sampled rows go through lm_head
        self.layers_s_per_token = model.gemm_flops(1, 0) * self.gemm_s_per_flop
        self.lm_head_s_per_seq = lm_head * self.gemm_s_per_flop
        self.attn_s_per_pair = model.attention_flops(1) / (tp * peak * c.attention_efficiency)
        dequant = 0.0
        if kv_cache_dtype in QUANTIZED_KV:
            per_elem = c.dequant_flops_per_element * (2 if kv_cache_dtype == "int4" else 1)
            dequant = kv_elements_per_token(model, tp) * per_elem / (gpu.fp32_tflops * 1e12)
        self.dequant_s_per_kv_token = dequant
        self.weights_s = model.weight_bytes / tp / bandwidth
        self.kv_s_per_token = self.kv_bytes_per_token / bandwidth
        # Two all-reduces per layer (after attention and after the MLP), ring: 2(tp-1)/tp of the data.
        calls = 2 * model.num_hidden_layers if tp > 1 else 0
        ring = 2 * (tp - 1) / tp * model.hidden_size * model.activation_bytes / (gpu.nvlink_gbps * 1e9)
        self.allreduce_fixed_s = calls * c.allreduce_latency_s
        self.allreduce_s_per_token = calls * ring
        self._decode_base: dict[int, tuple[float, float, float]] = {}
        self._last_lines: tuple = (-1, -1, None)

    def overhead(self, num_seqs: int) -> float:
        return self.calibration.step_overhead_s + self.calibration.per_seq_overhead_s * num_seqs

    def allreduce_time(self, num_tokens: int) -> float:
        return self.allreduce_fixed_s + self.allreduce_s_per_token * num_tokens

    def swap_time(self, num_blocks: int) -> float:
        return num_blocks * self.bytes_per_block / (self.gpu.pcie_gbps * 1e9)

    def compute_time(self, num_tokens: int, num_seqs: int, attn_pairs: int, kv_read_tokens: int) -> float:
        return (num_tokens * self.layers_s_per_token + num_seqs * self.lm_head_s_per_seq
                + attn_pairs * self.attn_s_per_pair + kv_read_tokens * self.dequant_s_per_kv_token)

    def memory_time(self, num_tokens: int, kv_read_tokens: int) -> float:
        return self.weights_s + (kv_read_tokens + num_tokens) * self.kv_s_per_token

    def step_time(self, batch) -> float:
        """Seconds for one step of `batch` (a kvsim.batch.Batch; only its aggregate counts are read)."""
        swapped = batch.swap_in_blocks + batch.swap_out_blocks
        swap = self.swap_time(swapped) if swapped else 0.0
        tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        if tokens == 0:
            return swap
        seqs = batch.num_prefill_seqs + batch.num_decode_seqs
        kv_read = batch.prefill_context_tokens + batch.decode_context_tokens
        pairs = batch.prefill_attn_pairs + batch.decode_context_tokens
        compute = self.compute_time(tokens, seqs, pairs, kv_read)
        memory = self.weights_s + (kv_read + tokens) * self.kv_s_per_token
        return (self.overhead(seqs) + (compute if compute > memory else memory)
                + self.allreduce_fixed_s + self.allreduce_s_per_token * tokens + swap)

    def _decode_lines(self, n: int, x0: int) -> tuple[float, float, float, float, float]:
        """(fixed, c0, c_slope, m0, m_slope) of a decode step i: fixed + max(c0 + cs*i, m0 + ms*i)."""
        if n == self._last_lines[0] and x0 == self._last_lines[1]:  # a run is sized, then priced
            return self._last_lines[2]
        base = self._decode_base.get(n)
        if base is None:
            base = (self.overhead(n) + self.allreduce_time(n), self.compute_time(n, n, 0, 0), self.memory_time(n, 0))
            self._decode_base[n] = base
        fixed, c_base, m_base = base
        c_slope = self.attn_s_per_pair + self.dequant_s_per_kv_token
        m_slope = self.kv_s_per_token
        lines = (fixed, c_base + c_slope * x0, c_slope * n, m_base + m_slope * x0, m_slope * n)
        self._last_lines = (n, x0, lines)
        return lines

    def decode_run_time(self, num_seqs: int, context_tokens: int, k: int) -> float:
        """Seconds for k pure-decode steps of num_seqs sequences; step i has
        decode_context_tokens = context_tokens + i*num_seqs. Closed form in k."""
        if k <= 0 or num_seqs <= 0:
            return 0.0
        return _run_time(*self._decode_lines(num_seqs, context_tokens), k)

    def decode_run(self, num_seqs: int, context_tokens: int, k: int) -> tuple[float, float]:
        """(seconds for the k steps, seconds for the first) of a run as in decode_run_time."""
        lines = fixed, c0, _, m0, _ = self._decode_lines(num_seqs, context_tokens)
        first = fixed + (c0 if c0 >= m0 else m0)
        return (first if k == 1 else _run_time(*lines, k)), first

    def decode_steps_within(self, num_seqs: int, context_tokens: int, budget_s: float) -> int:
        """The smallest k >= 1 with decode_run_time(num_seqs, context_tokens, k) >= budget_s.

        Solves the quadratic of the regime (compute- or memory-bound) the run starts in, checks
        the answer against the closed form, and falls back to bisection when the run changes regime.
        """
        if num_seqs <= 0 or not math.isfinite(budget_s):
            raise ValueError(f"need num_seqs > 0 and a finite budget, got {num_seqs}, {budget_s}")
        lines = fixed, c0, cs, m0, ms = self._decode_lines(num_seqs, context_tokens)
        run = partial(_run_time, *lines)  # = decode_run_time
        if fixed + max(c0, m0) >= budget_s:
            return 1
        a, b = (fixed + c0, cs) if c0 >= m0 else (fixed + m0, ms)  # sum_{i<k} (a + b i) >= budget
        if b > 0:
            k = math.ceil((-(a - b / 2) + math.sqrt((a - b / 2) ** 2 + 2 * b * budget_s)) / b)
        else:
            k = math.ceil(budget_s / a)
        k = max(k, 1)
        if run(k) >= budget_s and (k == 1 or run(k - 1) < budget_s):
            return k
        if k > 1 and run(k - 1) >= budget_s and (k == 2 or run(k - 2) < budget_s):
            return k - 1
        if run(k + 1) >= budget_s and run(k) < budget_s:
            return k + 1
        lo, hi = 1, 2  # regime change inside the run: bisection over the closed form
        while run(hi) < budget_s:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if run(mid) >= budget_s:
                hi = mid
            else:
                lo = mid
        return hi
