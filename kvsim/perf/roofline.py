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

from kvsim.errors import KvsimError, read_json_object
from kvsim.perf.memory import QUANTIZED_KV, bytes_per_block, kv_bytes_per_token, kv_elements_per_token
from kvsim.scenario.catalog import GpuSpec, ModelSpec

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


NEVER = 1 << 62  # a step index no run reaches


def _line_sum(a: float, b: float, lo: int, hi: int) -> float:
    """sum of a + b*i for i in [lo, hi)."""
    n = hi - lo
    return a * n + b * ((lo + hi - 1) * n / 2) if n > 0 else 0.0


def _top_lines(a1: float, b1: float, a2: float, b2: float) -> tuple[float, float, float, float, int]:
    """max(a1 + b1*i, a2 + b2*i) over i >= 0 as (a, b, a_late, b_late, s): line (a, b) is on top
    for i < s, line (a_late, b_late) from s on (s = NEVER: one line throughout)."""
    d0, d1 = a1 - a2, b1 - b2
    if d1 == 0:
        return (a1, b1, a1, b1, NEVER) if d0 >= 0 else (a2, b2, a2, b2, NEVER)
    below, above = ((a2, b2), (a1, b1)) if d1 > 0 else ((a1, b1), (a2, b2))
    cross = -d0 / d1
    if cross <= 0.0:
        return (*above, *above, NEVER)
    if cross >= NEVER:
        return (*below, *below, NEVER)
    return (*below, *above, math.ceil(cross))  # `below` is on top until the lines cross


def _run_time(fixed: float, a: float, b: float, a_late: float, b_late: float, s: int, k: int) -> float:
    """k steps whose step i costs fixed + (a + b*i if i < s else a_late + b_late*i)."""
    if k <= s:  # one regime for the whole run (the usual case)
        return fixed * k + (a * k + b * ((k - 1) * k / 2))
    return fixed * k + (_line_sum(a, b, 0, s) + _line_sum(a_late, b_late, s, k))


def _sum_max_lines(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """sum over i in [0, k) of max(a1 + b1*i, a2 + b2*i)."""
    return _run_time(0.0, *_top_lines(a1, b1, a2, b2), k)


class StepModel:
    """Step time of one replica (tp GPUs) serving `model` with a given KV-cache dtype."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, kv_cache_dtype: str,
                 calibration: Calibration, block_size: int = 16, per_token_scales: bool = False):
        self.model, self.gpu, self.tp = model, gpu, tp
        self.kv_cache_dtype, self.calibration, self.block_size = kv_cache_dtype, calibration, block_size
        c = calibration
        peak = (gpu.fp8_tflops if model.dtype == "fp8" else gpu.bf16_tflops) * 1e12
        bandwidth = gpu.hbm_bandwidth_gbps * 1e9 * c.memory_efficiency
        self.kv_bytes_per_token = kv_bytes_per_token(model, kv_cache_dtype, tp, per_token_scales)
        self.bytes_per_block = bytes_per_block(model, kv_cache_dtype, block_size, tp, per_token_scales)
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
        memory = self.memory_time(tokens, kv_read)
        return self.overhead(seqs) + (compute if compute > memory else memory) + self.allreduce_time(tokens) + swap

    def _decode_lines(self, n: int, x0: int) -> tuple:
        """(fixed, a, b, a_late, b_late, s): decode step i of n sequences holding x0 + i*n context
        tokens costs fixed + max(compute, memory), which is a + b*i before step s, a_late + b_late*i after."""
        if n == self._last_lines[0] and x0 == self._last_lines[1]:  # a run is sized, then priced
            return self._last_lines[2]
        base = self._decode_base.get(n)
        if base is None:
            base = (self.overhead(n) + self.allreduce_time(n), self.compute_time(n, n, 0, 0), self.memory_time(n, 0))
            self._decode_base[n] = base
        fixed, c_base, m_base = base
        c_slope = self.attn_s_per_pair + self.dequant_s_per_kv_token
        m_slope = self.kv_s_per_token
        lines = (fixed, *_top_lines(c_base + c_slope * x0, c_slope * n, m_base + m_slope * x0, m_slope * n))
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
        _, total, first = self.decode_run_within(num_seqs, context_tokens, k, math.inf)
        return total, first

    def decode_run_within(self, num_seqs: int, context_tokens: int, max_steps: int,
                          budget_s: float) -> tuple[int, float, float]:
        """(k, seconds, seconds of the first step) of the run's first k <= max_steps steps that start
        within budget_s: k = max_steps if those all end before budget_s, else the smallest k whose
        steps reach it (decode_steps_within)."""
        lines = self._decode_lines(num_seqs, context_tokens)
        first = lines[0] + lines[1]
        if max_steps == 1:
            return 1, first, first
        total = _run_time(*lines, max_steps)
        if total < budget_s:
            return max_steps, total, first
        return (*_steps_within(lines, budget_s), first)

    def decode_steps_within(self, num_seqs: int, context_tokens: int, budget_s: float) -> int:
        """The smallest k >= 1 with decode_run_time(num_seqs, context_tokens, k) >= budget_s."""
        if num_seqs <= 0 or not math.isfinite(budget_s):
            raise ValueError(f"need num_seqs > 0 and a finite budget, got {num_seqs}, {budget_s}")
        return _steps_within(self._decode_lines(num_seqs, context_tokens), budget_s)[0]


def _steps_within(lines: tuple, budget_s: float) -> tuple[int, float]:
    """The smallest k >= 1 whose run of `lines` (as StepModel._decode_lines) takes >= budget_s, and
    that run's seconds. Solves the quadratic of the regime the run starts in, checks the answer
    against the closed form, and falls back to bisection when the run changes regime."""
    fixed, a, b = lines[0], lines[1], lines[2]
    a += fixed  # sum_{i<k} (a + b i) >= budget, in the first regime
    if a >= budget_s:
        return 1, a
    run = partial(_run_time, *lines)
    if b > 0:
        k = math.ceil((-(a - b / 2) + math.sqrt((a - b / 2) ** 2 + 2 * b * budget_s)) / b)
    else:
        k = math.ceil(budget_s / a)
    k = max(k, 1)
    total = run(k)
    if total >= budget_s:
        if k == 1 or run(k - 1) < budget_s:
            return k, total
        if k == 2 or run(k - 2) < budget_s:
            return k - 1, run(k - 1)
    elif k > 1 and run(k - 1) >= budget_s and (k == 2 or run(k - 2) < budget_s):  # rounding
        return k - 1, run(k - 1)
    elif run(k + 1) >= budget_s:
        return k + 1, run(k + 1)
    lo, hi = 1, 2  # regime change inside the run: bisection over the closed form
    while run(hi) < budget_s:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(mid) >= budget_s:
            hi = mid
        else:
            lo = mid
    return hi, run(hi)
