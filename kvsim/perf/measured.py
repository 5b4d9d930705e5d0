"""Step time from measured vLLM kernels: a step priced as the sum, layer by layer, of the kernels vLLM runs.

    GEMMs        qkv, o, gate_up, down at the step's token rows (a CUDA graph's padded size), per
                 tensor-parallel rank; lm_head at one row per scheduled sequence (vLLM computes logits
                 outside the graph, for the sampled rows only)
    attention    decode attention at (decode sequences, mean keys each reads); prefill attention at
                 (prompt chunks, their mean length) from the no-cache table, scaled to the chunks'
                 query-key pairs when they attend to a cached prefix (AIConfigurator's own correction;
                 the tables time no cached prefix, so this part is an estimate)
    all-reduce   two per layer and one after the embedding (tp > 1) of rows x hidden bfloat16 elements:
                 vLLM's all-reduce as timed inside a CUDA graph when the step replays one (a full graph for
                 a decode batch, piecewise graphs for a mixed one), eager otherwise
    elementwise  norms, RoPE, KV store, SiLU: not in the tables; AIConfigurator's memory-op estimate,
                 bytes / (0.8 x HBM) + 3 us a kernel (`ServerTerms`)
    sampler      the logits' bytes per sampled row over HBM (the roofline's estimate)
    beyond       a fixed cost per step (full-CUDA-graph decode steps and the others apart), per layer of a
                 step outside a full graph (piecewise graphs run attention eagerly between their pieces)
                 (`ServerTerms`, fitted to serving runs)
    host         the engine's CPU work, a fixed cost per step and per sequence, overlapped with the GPU's
                 under async scheduling

Kernel times come from `kvsim.perf.kernels.ModelKernels` (the shipped AIConfigurator tables, or a file
`kvsim calibrate` converted), server terms from `ServerTerms` (each with its public source). Decode
attention is piecewise linear in the keys read, so a run of decode steps sums in closed form, segment
by segment. Every part is memoised per shape; shapes priced past the tables (scaled by the roofline)
are counted per kernel family (`extrapolated`). Pure Python and numpy: no torch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import replace

import numpy as np

from kvsim.batch import DecodeShape
from kvsim.perf.basis import measured_tables
from kvsim.perf.kernel_moe import model_kernels
from kvsim.perf.kernels import load_tables
from kvsim.perf.pricing import DecodeRunPrice, first_reaching
from kvsim.perf.roofline import activation_bytes_per_token
from kvsim.perf.server import ServerTerms, server_terms, vllm_capture_sizes

_new = tuple.__new__  # builds a named tuple without its Python-level __new__ (once per fused decode run)
# rows the tables keep for deployed formats and windows: describe() names them where the model reads them
DEPLOYED_ROWS = ("window/", "gemm/fp8_block", "gemm/nvfp4", "moe/nvfp4", "moe/int4")


class _Line:
    """One layer's decode attention for a fixed batch: piecewise linear in the keys read (see
    ModelKernels.decode_knots), and proportional to them past the last knot (segment `last`)."""

    __slots__ = ("knots", "a", "b", "extrapolated", "last", "used")

    def __init__(self, knots, values, flags):
        self.knots = [float(x) for x in knots]
        v = [float(y) for y in values]
        f = [bool(x) for x in flags]
        self.a, self.b = [], []  # segment j (knots[j] <= s < knots[j+1]): a[j] + b[j] * s
        for j in range(len(v) - 1):
            slope = (v[j + 1] - v[j]) / (self.knots[j + 1] - self.knots[j])
            self.b.append(slope)
            self.a.append(v[j] - slope * self.knots[j])
        self.a.append(0.0)  # past the last knot: through the origin (the roofline's memory line)
        self.b.append(v[-1] / self.knots[-1])
        self.last = len(v) - 1
        self.extrapolated = [f[j] or f[j + 1] for j in range(self.last)] + [True]
        self.used: set = set()  # segments a priced step fell on

    def segment(self, s: float) -> int:
        j = bisect_right(self.knots, s) - 1
        return 0 if j < 0 else j

    def __call__(self, s: float) -> float:
        j = self.segment(s)
        return self.a[j] + self.b[j] * s

    def reach(self, y: float) -> float:
        """The least s with self(s) >= y (the line never falls): -inf when every s does, inf when none."""
        for j in range(self.last + 1):
            lo = self.knots[j] if j else -math.inf
            hi = self.knots[j + 1] if j < self.last else math.inf
            if self.b[j] > 0:
                at = (y - self.a[j]) / self.b[j]
                if at < hi:
                    return max(at, lo)
            elif self.a[j] >= y:
                return lo
        return math.inf

    def steps_in(self, j: int, s0: float) -> float:
        """How many steps of a run starting at s0 (one key more a step) stay in segment j: inf for the last."""
        return math.inf if j >= self.last else math.ceil(self.knots[j + 1] - s0)

    def run_sum(self, s0: float, k: int) -> float:
        """sum over i < k of self(s0 + i), segment by segment."""
        total, i = 0.0, 0
        while i < k:
            j = self.segment(s0 + i)
            end = min(k, max(i + 1, self.steps_in(j, s0)))
            n = end - i
            total += self.a[j] * n + self.b[j] * (n * s0 + (i + end - 1) * n / 2)
            self.used.add(j)
            i = end
        return total


class MeasuredStepModel:
    """Step time of one replica (tp GPUs) from measured kernels: a `kvsim.perf.pricing.RunPricer` whose
    run searches are closed forms (as kvsim.perf.roofline.StepModel's).
    A pure-decode batch of at most `graph_sizes[-1]` sequences replays a full CUDA graph padded to the
    next capture size; a mixed batch of at most that many tokens replays piecewise graphs (padded too);
    larger steps run eagerly (no capture sizes: always eager, as --enforce-eager)."""

    prices_longest_decode = False  # vLLM's FlashAttention splits long sequences: no serial term

    def __init__(self, model, gpu, tp: int, kv_cache_dtype: str, tables_path, terms: ServerTerms,
                 calibration, graph_sizes: tuple = (), swap_bytes_per_block: float = 0.0, max_rows: int = 8192,
                 dp: int = 1, expert_parallel: bool = False, expert_skew: float = 0.0, async_scheduling: bool = True):
        self.tables = load_tables(str(tables_path))
        self.kernels = model_kernels(self.tables, model, gpu, tp, kv_cache_dtype, calibration, dp, expert_parallel,
                                     expert_skew)
        self.terms, self.tp, self.gpu = terms, tp, gpu
        self.layers = model.num_hidden_layers
        self.hidden = model.hidden_size
        self.graph_sizes = tuple(sorted(graph_sizes))
        self.graph_max = self.graph_sizes[-1] if self.graph_sizes else 0
        self._pad = {}
        bandwidth = gpu.hbm_bandwidth_gbps * 1e9
        kernels_per_layer = terms.elementwise_kernels_per_layer + (1 if model.qk_norm else 0)
        self.elementwise_fixed_s = self.layers * kernels_per_layer * terms.elementwise_kernel_s
        self.elementwise_s_per_token = activation_bytes_per_token(model, kv_cache_dtype, tp) / (
            bandwidth * terms.elementwise_bandwidth)
        self.sampler_s_per_seq = terms.sampler_bytes_per_vocab * model.vocab_size / (
            bandwidth * calibration.memory_efficiency)
        self.swap_s_per_block = swap_bytes_per_block / (gpu.pcie_gbps * 1e9)
        self.logits_part = -(-model.vocab_size // tp)  # each rank's share of a sampled row's logits
        # The engine's host work a step; async scheduling overlaps it with the GPU's (a step takes the longer)
        self.overlap = async_scheduling
        self.host_step_s = terms.host_step_s + (terms.host_tp_step_s if tp > 1 else 0.0)
        self.host_per_seq_s = terms.host_per_seq_s
        # a step outside a full CUDA graph: its fixed cost and the eager attention between graph pieces, per layer
        self.piecewise_s = terms.step_overhead_s + self.layers * terms.piecewise_layer_s
        self._rows: dict = {True: {}, False: {}}  # graph or eager -> rows -> seconds (the rows priced so far)
        self._rows_pre = self._rows_table(max_rows)
        self._seqs: dict = {}
        self._fixed: dict = {}  # num_seqs -> a pure-decode step's seconds besides attention
        self._lines: dict = {}
        self._fixed_steps: dict = {}  # (rows, sampled) -> decode_steps_time's part besides attention
        self._lines_np: dict = {}  # num_seqs -> its decode line as arrays (knots, a, b, the line)
        self._run_key: tuple = (0, 0, None)  # (num_seqs, read_tokens, _run's answer) of the last run
        # distinct shapes priced and those extrapolated, per kernel family (decode attention: on the lines)
        self.priced: dict = {"gemm": set(), "lm_head": set(), "allreduce": set(), "prefill_attention": set()}
        self.extrapolated: dict = {k: set() for k in self.priced}

    # ---- the parts of a step, memoised per shape ------------------------------------------------
    def _note(self, family: str, key, flag: bool) -> None:
        self.priced[family].add(key)
        if flag:
            self.extrapolated[family].add(key)

    def padded(self, tokens: int) -> int:
        """The capture size a step of `tokens` rows replays, or 0 when it runs eagerly."""
        if tokens > self.graph_max:
            return 0
        size = self._pad.get(tokens)
        if size is None:
            size = self._pad[tokens] = next(s for s in self.graph_sizes if s >= tokens)
        return size

    def _rows_table(self, top: int) -> dict:
        """rows_time's parts for every row count up to `top`, graph and eager, computed at once:
        {graph: (seconds, GEMM extrapolated, all-reduce extrapolated) lists indexed by rows}."""
        m = np.arange(1, top + 1, dtype=float)
        gemm, gflag = self.kernels.step_gemms_many(m)
        out = {}
        for graph in (True, False):
            t = gemm + self.elementwise_fixed_s + m * self.elementwise_s_per_token + self.kernels.a2a_s(m)
            aflag = np.zeros(top, dtype=bool)
            if self.tp > 1:
                ar, aflag = self.kernels.allreduce_many(m * self.hidden, graph)
                t = t + self.kernels.allreduce_calls * ar
            out[graph] = ([0.0, *t.tolist()], [False, *gflag.tolist()], [False, *aflag.tolist()])
        return out

    def rows_time(self, rows: int, graph: bool) -> float:
        """Everything that scales with the step's token rows: every layer's GEMMs, elementwise kernels
        and two all-reduces, and the embedding's all-reduce."""
        t = self._rows[graph].get(rows)
        if t is None:
            if rows < len(self._rows_pre[graph][0]):
                t, gflag, aflag = (part[rows] for part in self._rows_pre[graph])
            else:  # past the rows computed at the start
                k = self.kernels
                gemm, gflag = k.step_gemms(rows)
                ar, aflag = k.allreduce_s(rows * self.hidden, graph) if self.tp > 1 else (0.0, False)
                t = (gemm + k.allreduce_calls * ar + k.a2a_s(rows) + self.elementwise_fixed_s
                     + rows * self.elementwise_s_per_token)
            self._note("gemm", rows, gflag)
            if self.tp > 1:
                self._note("allreduce", (rows, graph), aflag)
            self._rows[graph][rows] = t
        return t

    def seqs_time(self, seqs: int) -> float:
        """The GPU work that scales with the sampled rows, outside any CUDA graph: lm_head, the sampler and,
        under tensor parallelism, the all-gather of the vocab-parallel logits (vLLM's LogitsProcessor),
        priced as an eager all-reduce of a rank's share (an estimate: the tables time no all-gather)."""
        t = self._seqs.get(seqs)
        if t is None:
            head, flag = self.kernels.lm_head_gemm(seqs)
            self._note("lm_head", seqs, flag)
            t = head + seqs * self.sampler_s_per_seq
            if self.tp > 1:
                gather, gflag = self.kernels.allreduce_s(seqs * self.logits_part, False)
                self._note("allreduce", (seqs, "logits"), gflag)
                t += gather
            self._seqs[seqs] = t
        return t

    def host_time(self, seqs: int) -> float:
        """The engine's CPU work for a step of `seqs` sequences (ServerTerms.host_step_s, host_per_seq_s,
        and host_tp_step_s when tensor-parallel)."""
        return self.host_step_s + self.host_per_seq_s * seqs

    def decode_line(self, num_seqs: int) -> _Line:
        line = self._lines.get(num_seqs)
        if line is None:
            line = self._lines[num_seqs] = _Line(*self.kernels.decode_knots(num_seqs))
        return line

    def decode_attention_time(self, num_seqs: int, read_tokens: float) -> float:
        """Every layer's decode attention for num_seqs sequences reading read_tokens keys in all."""
        if not num_seqs:
            return 0.0
        line = self._lines.get(num_seqs) or self.decode_line(num_seqs)
        s = read_tokens / num_seqs
        j = line.segment(s)
        line.used.add(j)
        return self.layers * (line.a[j] + line.b[j] * s)

    def prefill_attention_time(self, num_prefill: int, new_tokens: int, cached_tokens: int, pairs: int,
                               batch=None) -> float:
        """Every layer's prefill attention: the no-cache table at the chunks' mean full length, times the
        share of that length's query-key pairs the chunks compute; windowed layers by their own rows on the
        pairs their window leaves (kvsim.batch.Batch.window_reads of `batch`; without it, the full pairs)."""
        if not num_prefill:
            return 0.0
        full = (new_tokens + cached_tokens) / num_prefill
        t, flag = self.kernels.context_s(num_prefill, full)
        key = (num_prefill, int(full).bit_length())  # shapes counted per power of two of the length
        whole = num_prefill * full * (full + 1) / 2
        share = pairs / whole if pairs < whole else 1.0
        windows = self.kernels.windows
        if not windows:
            total = self.layers * t * share
        else:
            window_pairs = [batch.window_reads(plan.window)[1] if batch is not None else pairs for plan, _ in windows]
            windowed, wflag = self.kernels.windowed_prefill_s(num_prefill, full, t, window_pairs)
            total, flag = self.kernels.full_layers * t * share + windowed, flag or wflag
        self.priced["prefill_attention"].add(key)
        if flag:
            self.extrapolated["prefill_attention"].add(key)
        return total

    # ---- a step -------------------------------------------------------------------------------
    def step_time(self, batch) -> float:
        """Seconds for one step of `batch` (a kvsim.batch.Batch; only its aggregate counts are read)."""
        swapped = batch.swap_in_blocks + batch.swap_out_blocks
        swap = swapped * self.swap_s_per_block
        nd, np_, spec = batch.num_decode_seqs, batch.num_prefill_seqs, batch.num_spec_tokens
        tokens = batch.num_prefill_tokens + nd + spec  # a verify step's drafts are token rows, and sampled
        if not tokens:
            return swap
        padded = self.padded(tokens)
        t = self._rows[padded > 0].get(padded or tokens)
        if t is None:
            t = self.rows_time(padded or tokens, padded > 0)
        seq = self._seqs.get(np_ + nd + spec)
        t += self.seqs_time(np_ + nd + spec) if seq is None else seq
        if nd:
            t += self.decode_attention_time(nd, batch.decode_read_tokens)
        if np_:
            t += self.prefill_attention_time(np_, batch.num_prefill_tokens, batch.prefill_context_tokens,
                                             batch.prefill_attn_pairs, batch)
        overhead = self.terms.graph_step_overhead_s if padded and not np_ else self.piecewise_s
        gpu = t + overhead + swap
        host = self.host_step_s + self.host_per_seq_s * (np_ + nd)
        if self.overlap:
            return gpu if gpu > host else host
        return gpu + host

    def decode_steps_time(self, num_seqs: int, rows, read_tokens, sampled: int | None = None,
                          host: bool = True) -> np.ndarray:
        """Seconds of pure-decode steps of `num_seqs` sequences, step i computing rows[i] token rows (an
        int: every step the same) and reading read_tokens[i] keys, `sampled` rows through lm_head and the
        sampler (None: every row, as a verify step of speculative decoding samples each draft); what
        step_time gives such a batch, for many steps at once. `host=False`: the GPU's work alone (a
        drafter's passes, inside the engine's step)."""
        if isinstance(rows, (int, np.integer)) or rows.min() == rows.max():
            fixed = self._steps_fixed(int(rows if isinstance(rows, (int, np.integer)) else rows[0]), sampled)
        else:
            values, where = np.unique(rows, return_inverse=True)
            fixed = np.array([self._steps_fixed(r, sampled) for r in values.tolist()])[where]
        knots, a, b, line = self._line_arrays(num_seqs)
        s = np.asarray(read_tokens, dtype=np.float64) / num_seqs
        j = np.maximum(np.searchsorted(knots, s, side="right") - 1, 0)
        if len(j):
            line.used.update(range(int(j.min()), int(j.max()) + 1))
        gpu = fixed + self.layers * (a[j] + b[j] * s)
        if not host:
            return gpu
        host_s = self.host_time(num_seqs)
        return np.maximum(gpu, host_s) if self.overlap else gpu + host_s

    def decode_steps_affine(self, num_seqs: int, rows: int, lo: float, hi: float, sampled: int | None = None,
                            host: bool = True) -> tuple[float, float] | None:
        """(alpha, beta) with decode_steps_time(num_seqs, rows, x, sampled, host) = alpha + beta * x for
        every x in [lo, hi] keys (the steps of a run), or None when the price bends in between (a knot
        of the attention line, or the host's time overtaking the GPU's)."""
        knots, a, b, line = self._line_arrays(num_seqs)
        j = bisect_right(line.knots, lo / num_seqs) - 1
        j = 0 if j < 0 else j
        if j < line.last and hi / num_seqs >= line.knots[j + 1]:
            return None
        line.used.add(j)
        alpha = self._steps_fixed(rows, sampled) + self.layers * line.a[j]
        beta = self.layers * line.b[j] / num_seqs
        if not host:
            return alpha, beta
        host_s = self.host_time(num_seqs)
        if not self.overlap:
            return alpha + host_s, beta
        if alpha + beta * lo >= host_s:
            return alpha, beta
        return (host_s, 0.0) if alpha + beta * hi < host_s else None

    def _steps_fixed(self, rows: int, sampled: int | None) -> float:
        """A pure-decode step's seconds besides its attention (decode_steps_time), memoised."""
        key = (rows, sampled)
        t = self._fixed_steps.get(key)
        if t is None:
            padded = self.padded(rows)
            t = self._fixed_steps[key] = (
                self.rows_time(padded or rows, padded > 0) + self.seqs_time(rows if sampled is None else sampled)
                + (self.terms.graph_step_overhead_s if padded else self.terms.step_overhead_s))
        return t

    def _line_arrays(self, num_seqs: int) -> tuple:
        out = self._lines_np.get(num_seqs)
        if out is None:
            line = self.decode_line(num_seqs)
            out = self._lines_np[num_seqs] = (np.asarray(line.knots), np.asarray(line.a), np.asarray(line.b), line)
        return out

    # ---- runs of pure-decode steps in closed form ----------------------------------------------
    def _run(self, num_seqs: int, read_tokens: int) -> tuple:
        """A cohort-only decode run's (fixed seconds a step, attention line, first mean keys, steps on
        its first segment of the line, that segment's a and b x layers, the host's seconds a step, how
        many first steps the host sets): the last run's, else anew. Under async scheduling a step takes
        the longer of the GPU's and the host's work; the GPU's grows along the run, the host's does not."""
        last = self._run_key
        if last[0] == num_seqs and last[1] == read_tokens:
            return last[2]
        fixed = self._fixed.get(num_seqs)
        if fixed is None:  # what a pure-decode step of num_seqs costs besides its attention
            padded = self.padded(num_seqs)
            fixed = (self.rows_time(padded or num_seqs, padded > 0) + self.seqs_time(num_seqs)
                     + (self.terms.graph_step_overhead_s if padded else self.piecewise_s))
            if not self.overlap:
                fixed += self.host_time(num_seqs)
            self._fixed[num_seqs] = fixed
        line = self._lines.get(num_seqs) or self.decode_line(num_seqs)
        s0 = read_tokens / num_seqs
        j = line.segment(s0)
        line.used.add(j)
        a, b = self.layers * line.a[j], self.layers * line.b[j]
        host, host_steps = self.host_time(num_seqs) if self.overlap else 0.0, 0
        if host > fixed + a + b * s0:  # the first steps wait for the host
            at = line.reach((host - fixed) / self.layers)
            host_steps = math.inf if at == math.inf else max(1, math.ceil(at - s0))
        out = (fixed, line, s0, 0 if host_steps else line.steps_in(j, s0), a, b, host, host_steps)
        self._run_key = (num_seqs, read_tokens, out)
        return out

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        """Seconds for the first k pure-decode steps of a run of `shape` (kvsim.perf.pricing; its `longest`
        is not read: see prices_longest_decode). Closed form, segment by segment."""
        num_seqs, read_tokens = shape[0], shape[1]
        if k <= 0 or num_seqs <= 0:
            return 0.0
        last = self._run_key
        fixed, line, s0, inside, a, b, host, host_steps = last[2] if last[0] == num_seqs and \
            last[1] == read_tokens else self._run(num_seqs, read_tokens)
        if k <= inside:  # the usual case: the whole run on one segment of the line
            return (fixed + a + b * s0) * k + b * (k * (k - 1) / 2)
        if host_steps:  # the first steps take the host's time, the rest the GPU's
            h = min(k, host_steps)
            return host * h + fixed * (k - h) + self.layers * line.run_sum(s0 + h, k - h)
        return fixed * k + self.layers * line.run_sum(s0, k)

    def decode_run_within(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        """The first k <= max_steps steps of the run that start within budget_s: k = max_steps if those
        all end before budget_s, else the smallest k whose steps reach it."""
        fixed, line, s0, inside, a, b, host, host_steps = self._run(shape[0], shape[1])
        first = host if host_steps else fixed + a + b * s0
        if max_steps == 1:
            return _new(DecodeRunPrice, (1, first, first))
        total = self.decode_run_time(shape, max_steps)
        if total < budget_s:
            return _new(DecodeRunPrice, (max_steps, total, first))
        k = self.decode_steps_within(shape, budget_s)
        return _new(DecodeRunPrice, (k, self.decode_run_time(shape, k), first))

    def decode_steps_within(self, shape: DecodeShape, budget_s: float) -> int:
        """The smallest k >= 1 whose first k steps take budget_s or more."""
        num_seqs = shape[0]
        if num_seqs <= 0 or not math.isfinite(budget_s):
            raise ValueError(f"need num_seqs > 0 and a finite budget, got {num_seqs}, {budget_s}")
        fixed, line, s0, inside, a, slope, host, host_steps = self._run(num_seqs, shape[1])
        first = host if host_steps else fixed + a + slope * s0
        if first >= budget_s:
            return 1
        # the step time grows along the line: solve the quadratic of the first step's segment, then check
        if host_steps:  # steps take at least `first`: a bound to bisect under
            k = math.ceil(budget_s / first)
        elif slope > 0:
            c = first - slope / 2
            k = math.ceil((-c + math.sqrt(c * c + 2 * slope * budget_s)) / slope)
        else:
            k = math.ceil(budget_s / first)
        k = max(k, 1)
        if k <= inside:  # on the first segment: the quadratic's answer, checked against rounding
            below = first * (k - 1) + slope * ((k - 1) * (k - 2) / 2)
            if first * k + slope * (k * (k - 1) / 2) >= budget_s and (k == 1 or below < budget_s):
                return k
        run = self.decode_run_time
        if run(shape, k) >= budget_s:
            if k == 1 or run(shape, k - 1) < budget_s:
                return k
            lo, hi = 0, k
        else:
            lo, hi = k, 2 * k
            while run(shape, hi) < budget_s:
                lo, hi = hi, 2 * hi
        return first_reaching(run, shape, budget_s, lo, hi)  # the run crossed a knot of the line

    # ---- what priced the run --------------------------------------------------------------------
    def describe(self) -> dict:
        """Which tables priced the run, and how many of the shapes it priced lay past them."""
        meta = self.tables.meta
        priced = {k: len(v) for k, v in self.priced.items()}
        extrapolated = {k: len(v) for k, v in self.extrapolated.items()}
        priced["decode_attention"] = sum(len(line.used) for line in self._lines.values())
        extrapolated["decode_attention"] = sum(line.extrapolated[j] for line in self._lines.values()
                                               for j in line.used)
        out = {"source": "measured", "vllm_version": self.tables.vllm_version,
                "tables": {"file": self.tables.path.name, "from": meta.get("source", {}),
                           "kernels": {k: v.get("kernel_source") for k, v in meta.get("tables", {}).items()
                                       if not k.startswith(DEPLOYED_ROWS) or k in self.kernels.tables_used}},
                "extrapolated": {k: f"{extrapolated[k]} of {n} shapes" for k, n in priced.items() if n},
                "any_extrapolated": any(extrapolated.values()), "estimates": list(self.kernels.notes),
                "server_terms": self.terms.to_dict()}
        if self.kernels.windows:  # how the windowed layers are priced (kvsim.perf.kernel_plan.window_plans)
            out["windows"] = [f"{plan.part.part}: {plan.part.why}" for plan, _ in self.kernels.windows]
        return out


def measured_step_model(scenario, policy, model, gpu, calibration, settings, capacity, decode_query_len: int = 1,
                        host: bool = True) -> MeasuredStepModel | None:
    """The measured pricer of the scenario's policy under its `settings` (kvsim.engine.settings) and KV
    `capacity` (kvsim.perf.memory.KvCapacity), or None: the roofline prices it (kvsim.perf.basis.measured_tables).
    `decode_query_len`: 1 + num_speculative_tokens (the CUDA graphs' sizes follow it); `host=False`: no
    host or fixed step costs (a speculative drafter's passes, inside the engine's step)."""
    path = measured_tables(scenario, gpu, model)
    if path is None:
        return None
    terms, _ = server_terms(scenario, gpu.name, load_tables(str(path)).vllm_version)
    if not host:
        terms = replace(terms, host_step_s=0.0, host_tp_step_s=0.0, host_per_seq_s=0.0, graph_step_overhead_s=0.0,
                        step_overhead_s=0.0)
    hw = scenario.hardware
    graphs = () if scenario.backend.enforce_eager else vllm_capture_sizes(settings.max_num_seqs,
                                                                          settings.max_num_batched_tokens,
                                                                          decode_query_len)
    return MeasuredStepModel(model, gpu, hw.tensor_parallel_size, policy.kv_cache_dtype, path, terms, calibration,
                             graphs, capacity.bytes_per_block, min(settings.step_budget, 32768),
                             hw.data_parallel_size, hw.enable_expert_parallel, scenario.model.expert_skew,
                             settings.async_scheduling)


def request_overhead_s(scenario, basis, gpu) -> float:
    """Seconds the API server adds to each request's TTFT and E2E (ServerTerms.api_server_s) when measured
    kernels price the run (`basis`: kvsim.perf.basis.PricingBasis; runs the roofline prices stay as they were)."""
    if basis.pricing != "measured":
        return 0.0
    return server_terms(scenario, gpu.name, basis.vllm_version)[0].api_server_s
