"""Analytic step time: a roofline model of one engine step, and closed forms for runs of decode steps.

A step's GPU work (`body`) is a sum of separately priced parts, each its own roofline:

    GEMMs        max(FLOPs / (peak x compute_efficiency), streamed weights / bandwidth), for the layers and
                 for lm_head (sampled rows only) apart; the input embedding is a gather, not a table read.
                 A mixture-of-experts layer computes its router, shared experts and top_k routed experts
                 a token, and streams the experts the step's tokens touch: E x (1 - (1 - k/E)^tokens)
                 of its E under balanced routing (`MoeSpec.expected_experts`)
    attention    the decode and the prefill kernels apart, each max(FLOPs / (peak x attention_efficiency)
                 (+ KV dequantization), KV bytes / bandwidth, layers x attention_floor_s, a serial floor);
                 a quantized cache multiplies prefill attention by quantized_prefill_factor and adds
                 layers x quantized_prefill_token_s a new token. The decode kernel splits each sequence's
                 keys over `decode_splits` programs per KV head (the triton engine's rule); a program walks
                 its split alone at decode_key_s a key, so the longest sequence's programs set a floor,
                 and share the bandwidth with the others before it (a two-class fluid model: see
                 decode_attention_time): ragged batches, and batches too small to fill the GPU. In a
                 pure-decode step, blocks several sequences hold (a shared prefix) are read from HBM
                 once (Batch.decode_read_tokens): the other holders' programs find them in L2
    activations  the elementwise kernels' bytes per token (norms, RoPE, SwiGLU, KV store) and the logits'
                 bytes per sampled row, over bandwidth; plus layers x layer_overhead_s of small-kernel time
    all-reduce   (2 x layers + 1) calls x (allreduce_latency_s + ring bytes / (NVLink x allreduce_efficiency))

A pure-decode step replays a CUDA graph: `graph_step_overhead_s + per_seq x seqs + body`. Other steps
run eagerly (or as piecewise graphs), their host launching layer after layer: `step_overhead_s +
per_seq x seqs + max(layers x eager_layer_s, body)`. Swap copies over PCIe come on top. Within a run of
decode steps only the attention grows (with the context), so a step is a constant plus the maximum of
a few lines in the step index (every context, the longest and the others' mean too, grows by one a
step), and runs have closed forms. Pure Python: no torch.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import itemgetter

from kvsim.batch import Batch, DecodeShape
from kvsim.perf.calibration import Calibration, load_calibration  # noqa: F401  (re-exported)
from kvsim.perf.memory import QUANTIZED_KV, bytes_per_block, kv_bytes_per_token, kv_elements_per_token, \
    kv_heads_per_gpu
from kvsim.perf.moe import busiest_touched, expert_parallel_ranks, moe_load, ring_fraction
from kvsim.perf.pricing import DecodeRunPrice, first_reaching
from kvsim.perf.weights import weights_per_gpu
from kvsim.scenario.catalog import GpuSpec, ModelSpec

NEVER = 1 << 62  # a step index no run reaches
_new = tuple.__new__  # builds a named tuple without its Python-level __new__ (once or twice per decode run)
LOGITS_BYTES_PER_VOCAB = 12  # a sampled row: 16-bit logits written, read, fp32 copy written and read
# vLLM V1's CUDA-graph capture sizes (CompilationConfig): a decode batch is padded to the next one.
VLLM_GRAPH_SIZES = (1, 2, 4, *range(8, 513, 8))
# The triton engine's decode kernel: no split shorter than this many tokens of max_model_len, at most this many.
MIN_TOKENS_PER_SPLIT = 512
MAX_DECODE_SPLITS = 32


def decode_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int, quantized: bool,
                  power_of_two: bool = True) -> int:
    """Programs per (sequence, KV head) of the triton engine's decode kernel (flash-decoding splits):
    enough to give every SM about two programs (four for a quantized cache, whose programs spend longer
    converting than loading), none shorter than MIN_TOKENS_PER_SPLIT tokens of max_context; the engine
    rounds it down to a power of two, so that a few compiled variants serve every batch."""
    per_sm = 4 if quantized else 2
    want = -(-per_sm * num_sms // max(num_seqs * num_kv_heads, 1))
    n = max(1, min(want, max(max_context // MIN_TOKENS_PER_SPLIT, 1), MAX_DECODE_SPLITS))
    return 1 << (n.bit_length() - 1) if power_of_two else n


def activation_bytes_per_token(model: ModelSpec, kv_cache_dtype: str, tp: int = 1) -> float:
    """HBM bytes the elementwise kernels move per token on one GPU, over all layers: two fused
    residual-add + RMSNorms (read x and residual, write both), q/k norm + RoPE in place, SwiGLU (read
    gate and up, write the product), and the KV store (read the new K and V, write them to the cache)."""
    a = model.activation_bytes
    q = max(1, model.num_attention_heads // tp) * model.head_dim
    kv = kv_elements_per_token(model, tp) // (2 * model.num_hidden_layers)
    per_layer = 8 * model.hidden_size * a + 2 * (q + kv) * a + 2 * kv * a
    inter = model.num_dense_layers * math.ceil(model.intermediate_size / tp)
    if model.moe:  # each token's top_k routed experts and the shared experts
        moe = model.moe
        inter += model.num_moe_layers * (moe.num_experts_per_tok * math.ceil(moe.moe_intermediate_size / tp)
                                         + math.ceil(moe.shared_expert_intermediate_size / tp))
    return model.num_hidden_layers * per_layer + 3 * inter * a + kv_bytes_per_token(model, kv_cache_dtype, tp)


def allreduce_seconds(size_bytes: float, workers: int, gpu: GpuSpec, c: Calibration) -> float:
    """One all-reduce of `size_bytes` over `workers` GPUs: a latency, then a ring moving 2(w-1)/w of the data."""
    if workers <= 1:
        return 0.0
    return c.allreduce_latency_s + 2 * (workers - 1) / workers * size_bytes / (
        gpu.nvlink_gbps * 1e9 * c.allreduce_efficiency)


def _undominated(lines: list) -> list:
    """The first line (the floor, kept) and the others no other line is at least as high as at every step."""
    rest, keep = lines[1:], [lines[0]]
    for k, ln in enumerate(rest):
        a, b = ln
        for j, o in enumerate(rest):  # (loops, not any() over a generator: this runs at every priced run)
            if o[0] >= a and o[1] >= b and j != k and (j < k or o != ln):
                break
        else:
            keep.append(ln)
    return keep


def _line_sum(a: float, b: float, lo: int, hi: int) -> float:
    """sum of a + b*i for i in [lo, hi)."""
    n = hi - lo
    return a * n + b * ((lo + hi - 1) * n / 2) if n > 0 else 0.0


_slope = itemgetter(1)


def _envelope(fixed: float, lines) -> tuple:
    """max over `lines` (a, b) of a + b*i, for integers i >= 0, as (fixed, a, b, s, later): line (a, b)
    is on top for i < s, then each (start, a, b) of `later` from its start on (s = NEVER: one line)."""
    cur_a, cur_b = max(lines)  # on top at i = 0 (a tie goes to the steeper line)
    if max(lines, key=_slope)[1] <= cur_b:  # no line overtakes it (the usual case)
        return fixed, cur_a, cur_b, NEVER, ()
    regimes, start = [[0, cur_a, cur_b]], 0
    while True:
        nxt = None
        for a, b in lines:
            if b > cur_b:
                x = (cur_a - a) / (b - cur_b)  # where the steeper line overtakes
                if nxt is None or x < nxt[0] or (x == nxt[0] and b > nxt[2]):
                    nxt = (x, a, b)
        if nxt is None or nxt[0] >= NEVER:
            break
        x, cur_a, cur_b = nxt
        s = max(math.ceil(x), start)
        if s == start:  # on top from the current regime's first step: that regime is empty
            regimes[-1][1:] = [cur_a, cur_b]
        else:
            regimes.append([s, cur_a, cur_b])
            start = s
    _, a, b = regimes[0]
    if len(regimes) == 1:
        return fixed, a, b, NEVER, ()
    return fixed, a, b, regimes[1][0], tuple(tuple(r) for r in regimes[1:])


def _run_time(lines: tuple, k: int) -> float:
    """Seconds of a run's first k steps, with `lines` as _envelope returns them."""
    fixed, a, b, s, later = lines
    if k <= s:  # one regime for the whole run (the usual case)
        return fixed * k + (a * k + b * ((k - 1) * k / 2))
    total = fixed * k + _line_sum(a, b, 0, s)
    for j, (lo, a, b) in enumerate(later):
        hi = later[j + 1][0] if j + 1 < len(later) else NEVER
        total += _line_sum(a, b, lo, min(hi, k))
        if hi >= k:
            break
    return total


def _sum_max_lines(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """sum over i in [0, k) of max(a1 + b1*i, a2 + b2*i)."""
    return _run_time(_envelope(0.0, ((a1, b1), (a2, b2))), k)


class StepModel:
    """Step time of one replica (tp GPUs) serving `model` with a given KV-cache dtype. A pure-decode step
    of n sequences replays the CUDA graph of the least of `graph_sizes` >= n, padded to it (none: eager).
    `max_model_len` caps the decode kernel's splits as the engine's does (0: no cap). A `RunPricer`
    (kvsim.perf.pricing) whose run searches are closed forms."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, kv_cache_dtype: str,
                 calibration: Calibration, block_size: int = 16, graph_sizes: tuple = VLLM_GRAPH_SIZES,
                 max_model_len: int = 0, per_token_scales: bool = False, window: int = 0, dp: int = 1,
                 expert_parallel: bool = False, expert_skew: float = 0.0):
        self.model, self.gpu, self.tp = model, gpu, tp
        # Data-parallel attention ranks sharing the MoE layers (each rank's step sees dp x its tokens
        # enter them), experts whole over tp x dp GPUs or sliced, and the routing's skew (kvsim.perf.moe)
        self.dp, self.expert_skew = dp, expert_skew
        self.ep_ranks = expert_parallel_ranks(tp, dp, expert_parallel)
        # Sliding-window layers (a window shorter than max_model_len): their share of the layers,
        # whose attention reads at most `window` keys a query (priced apart, `window_attention_lines`)
        self.window = window
        self.window_share = model.num_sliding_layers / model.num_hidden_layers if window else 0.0
        self.kv_cache_dtype, self.calibration, self.block_size = kv_cache_dtype, calibration, block_size
        self.max_model_len = max_model_len
        self.graph_sizes = tuple(sorted(graph_sizes))
        self.graph_max_seqs = self.graph_sizes[-1] if self.graph_sizes else 0
        c, layers = calibration, model.num_hidden_layers
        peak = (gpu.fp8_tflops if model.gemm_dtype == "fp8" else gpu.bf16_tflops) * 1e12
        bandwidth = gpu.hbm_bandwidth_gbps * 1e9 * c.memory_efficiency
        w = weights_per_gpu(model, tp, dp, expert_parallel)
        self.kv_bytes_per_token = kv_bytes_per_token(model, kv_cache_dtype, tp, per_token_scales)
        self.bytes_per_block = bytes_per_block(model, kv_cache_dtype, block_size, tp, per_token_scales)
        # Seconds per unit of work, per GPU.
        gemm_s_per_flop = 1.0 / (tp * peak * c.compute_efficiency)
        self.gemm_pad = c.gemm_pad_tokens
        self.layers_s_per_token = model.gemm_flops(1, 0) * gemm_s_per_flop
        moe = model.moe
        self.moe_s_per_token = (2 * model.num_moe_layers * moe.num_experts_per_tok * model.expert_params
                                * gemm_s_per_flop) if moe else 0.0  # the routed experts' share of the above
        self.lm_head_s_per_seq = model.gemm_flops(0, 1) * gemm_s_per_flop  # only sampled rows go through lm_head
        layer_bytes = w.attn + w.attn_kv + w.attn_replicated + w.dense_mlp + w.shared_experts
        self.layers_weights_s = layer_bytes / bandwidth  # read by every step (norm weights left out: tiny)
        self.expert_weights_s = w.experts / bandwidth  # all routed experts; a step reads those its tokens touch
        self.lm_head_weights_s = (w.lm_head or w.embed) / bandwidth  # the embedding, when tied
        self.attn_s_per_pair = model.attention_flops(1) / (tp * peak * c.attention_efficiency)
        # MLA: decode runs absorbed (each head's query against the latent: kv_lora_rank + rope for the
        # keys, kv_lora_rank for the values); prefill expanded (attention_flops), kv_b_proj expanding the
        # cached context's latent for every head besides the new tokens'
        m = model.mla
        self.decode_pair_s = (2.0 * layers * model.num_attention_heads * (m.latent_dim + m.kv_lora_rank)
                              / (tp * peak * c.attention_efficiency)) if m else self.attn_s_per_pair
        self.mla_expand_s_per_token = (2.0 * layers * m.kv_lora_rank * model.num_attention_heads
                                       * (m.qk_nope_head_dim + m.v_head_dim) * gemm_s_per_flop) if m else 0.0
        quant = c.quantized_prefill_factor if kv_cache_dtype in QUANTIZED_KV else 1.0
        self.prefill_attn_s_per_pair = self.attn_s_per_pair * quant
        self.prefill_key_s = layers * c.prefill_key_s * quant
        self.quantized_prefill_token_s = layers * c.quantized_prefill_token_s if kv_cache_dtype in QUANTIZED_KV else 0.0
        dequant = 0.0
        if kv_cache_dtype in QUANTIZED_KV:
            per_elem = c.dequant_flops_per_element * (2 if kv_cache_dtype == "int4" else 1)
            dequant = kv_elements_per_token(model, tp) * per_elem / (gpu.fp32_tflops * 1e12)
        self.dequant_s_per_kv_token = dequant
        self.decode_s_per_pair = self.decode_pair_s + dequant  # decode attention's compute, dequantization included
        self.kv_s_per_token = self.kv_bytes_per_token / bandwidth
        self.attn_floor_s = layers * c.attention_floor_s
        self.decode_floor_line = (self.attn_floor_s, 0.0)  # decode attention's floor, flat in a run
        self.decode_key_s = layers * c.decode_key_s
        self._splits: dict[int, int] = {}
        self.act_s_per_token = activation_bytes_per_token(model, kv_cache_dtype, tp) / bandwidth
        self.logits_s_per_seq = LOGITS_BYTES_PER_VOCAB * model.vocab_size / tp / bandwidth
        self.layers_fixed_s = layers * c.layer_overhead_s
        self.eager_host_s = layers * c.eager_layer_s
        self.eager_attention_s = layers * c.eager_attention_s
        self.eager_quantized_s = layers * c.eager_quantized_s if kv_cache_dtype in QUANTIZED_KV else 0.0
        # Two all-reduces per layer (after attention and after the MLP) and one after the vocab-parallel
        # embedding, each of the step's hidden states.
        calls = 2 * layers + 1 if tp > 1 else 0
        per_token = model.hidden_size * model.activation_bytes
        if dp > 1 and moe:  # MoE layers: one all-reduce (attention's), then an all-gather and a reduce-scatter
            calls = (2 * model.num_dense_layers + model.num_moe_layers + 1) if tp > 1 else 0
        self.allreduce_fixed_s = calls * allreduce_seconds(0, tp, gpu, c)
        self.allreduce_s_per_token = calls * (allreduce_seconds(per_token, tp, gpu, c) - allreduce_seconds(0, tp, gpu, c))
        if dp > 1 and moe:  # vLLM's allgather_reducescatter all2all over the tp x dp GPUs, of dp x the tokens
            link = gpu.nvlink_gbps * 1e9 * c.allreduce_efficiency
            self.allreduce_fixed_s += 2 * model.num_moe_layers * c.allreduce_latency_s
            self.allreduce_s_per_token += (2 * model.num_moe_layers * ring_fraction(tp * dp) * dp * per_token / link)
        self._decode_base: dict[int, tuple] = {}
        self._last_lines: tuple = (None, None)  # (the shape last priced, its lines)
        self._steps_memo: dict = {}  # decode_steps_time's constant parts and attention lines, per shape

    # ---- the parts of a step ---------------------------------------------------------------------
    def overhead(self, num_seqs: int, graph: bool = False) -> float:
        c = self.calibration
        return (c.graph_step_overhead_s if graph else c.step_overhead_s) + c.per_seq_overhead_s * num_seqs

    def gemm_time(self, num_tokens: int, num_seqs: int) -> float:
        layers = (num_tokens + self.gemm_pad) * self.layers_s_per_token
        if self.expert_skew:  # the busiest expert-parallel GPU computes more than its share
            layers += (num_tokens + self.gemm_pad) * self.moe_s_per_token * (self.moe_load(num_tokens)[1] - 1.0)
        head = (num_seqs + self.gemm_pad) * self.lm_head_s_per_seq
        return (max(layers, self.layers_weights_time(num_tokens)) if num_tokens else 0.0) + \
            (max(head, self.lm_head_weights_s) if num_seqs else 0.0)

    def layers_weights_time(self, num_tokens: int) -> float:
        """Seconds to stream the layers' weights a step of num_tokens tokens reads: of the routed
        experts, those the tokens entering the MoE layers touch (dp x num_tokens with DP attention)."""
        if self.model.moe is None:
            return self.layers_weights_s
        return self.layers_weights_s + self.expert_weights_s * self.moe_load(num_tokens)[0]

    def moe_load(self, num_tokens: int) -> tuple[float, float]:
        """(share of this GPU's experts streamed, the busiest GPU's work over its share) (kvsim.perf.moe)."""
        moe, skew, ranks = self.model.moe, self.expert_skew, self.ep_ranks
        tokens = self.dp * num_tokens
        touched, factor = moe_load(moe.n_routed_experts, moe.num_experts_per_tok, tokens, skew, ranks)
        if skew and ranks > 1:
            touched = busiest_touched(moe.n_routed_experts, moe.num_experts_per_tok, tokens, skew, ranks)
        return touched, factor

    def decode_splits(self, rows: int) -> int:
        """The decode kernel's programs per (sequence, KV head) for a batch of `rows` (padded) sequences."""
        splits = self._splits.get(rows)
        if splits is None:
            splits = decode_splits(rows, kv_heads_per_gpu(self.model, self.tp), self.max_model_len or NEVER,
                                   self.gpu.num_sms, self.kv_cache_dtype in QUANTIZED_KV)
            self._splits[rows] = splits
        return splits

    def decode_attention_time(self, num_decode: int, context_tokens: int, longest: float = 0, rows: int = 0) -> float:
        """num_decode sequences holding context_tokens in all, the longest `longest` (0: the mean), in a
        batch of `rows` (a graph's padded size; 0: num_decode) that sets the kernel's splits: the
        largest of `decode_attention_lines` at step 0."""
        if not num_decode:
            return 0.0
        return max(self.decode_attention_lines(num_decode, context_tokens, longest, rows or num_decode))[0]

    def decode_attention_lines(self, n: int, x0: int, longest: float, rows: int) -> list[tuple[float, float]]:
        """The decode attention price, written once for single steps and runs: its terms as lines
        (seconds at step 0, seconds more a step) in the step index of a run whose every context grows
        by one a step; a step takes the largest term. n sequences hold x0 context tokens, the longest
        `longest` (0: the mean), in a batch of `rows` (padded) rows.

        The terms: the per-layer floor, compute and memory rooflines, and the longest sequence's
        programs at s = decode_key_s / splits a key. The others, at their mean m, share the bandwidth
        with those while they run: the roofline's time for n*m keys, in which the longest's programs
        also walk m keys; then they walk their last L - m alone (two classes of program in a fluid
        model: uniform batches get the roofline, a long sequence among short ones its serial time,
        and a mix of both more than either)."""
        c, m = self.decode_s_per_pair, self.kv_s_per_token
        cn, mn = c * n, m * n
        lines = [self.decode_floor_line, (c * x0, cn), (m * x0, mn)]
        if self.decode_key_s:
            s = self.decode_key_s / self.decode_splits(rows)
            first = max(longest, x0 / n)
            lines.append((s * first, s))
            if n > 1:
                others = (x0 - first) / (n - 1)  # their mean grows by one a step, as the longest does
                tail = s * (first - others)
                lines += [(tail + cn * others, cn), (tail + mn * others, mn)]
        return lines

    def prefill_attention_time(self, num_prefill: int, attn_pairs: int, kv_tokens: int, new_tokens: int = 0) -> float:
        """kv_tokens: the cached and new tokens the prefill kernels read from the cache. Besides the
        compute and memory rooflines, one program walks a whole sequence's keys: a serial floor. A
        quantized cache adds a cost per new token (quantized_prefill_token_s)."""
        if not num_prefill:
            return 0.0
        compute = attn_pairs * self.prefill_attn_s_per_pair + kv_tokens * self.dequant_s_per_kv_token
        if self.mla_expand_s_per_token:  # MLA expands the cached context's latent (the new tokens' is a layer GEMM)
            compute += (kv_tokens - new_tokens) * self.mla_expand_s_per_token
        serial = kv_tokens / num_prefill * self.prefill_key_s
        return max(compute, kv_tokens * self.kv_s_per_token, serial, self.attn_floor_s) + \
            new_tokens * self.quantized_prefill_token_s

    def layer_gemm_time(self, num_tokens: int) -> float:
        """One layer's projections (qkv, o, gate_up, down) for num_tokens tokens."""
        layers = self.model.num_hidden_layers
        compute = (num_tokens + self.gemm_pad) * self.layers_s_per_token
        return max(compute, self.layers_weights_time(num_tokens)) / layers

    def layer_small_kernels_time(self, num_tokens: int) -> float:
        """One layer's elementwise kernels (norms, RoPE, activation, KV store) for num_tokens tokens."""
        return max(num_tokens * self.act_s_per_token, self.layers_fixed_s) / self.model.num_hidden_layers

    def activation_time(self, num_tokens: int, num_seqs: int) -> float:
        return max(num_tokens * self.act_s_per_token, self.layers_fixed_s) + num_seqs * self.logits_s_per_seq

    def allreduce_time(self, num_tokens: int) -> float:
        return self.allreduce_fixed_s + self.allreduce_s_per_token * num_tokens

    def swap_time(self, num_blocks: int) -> float:
        return num_blocks * self.bytes_per_block / (self.gpu.pcie_gbps * 1e9)

    def graph_batch(self, num_prefill_seqs: int, num_decode_seqs: int) -> int:
        """The CUDA graph's batch size a step replays (padded), or 0 when it runs eagerly."""
        if num_prefill_seqs or num_decode_seqs > self.graph_max_seqs:
            return 0
        return self.graph_sizes[bisect_left(self.graph_sizes, num_decode_seqs)]

    def host_time(self, num_prefill_seqs: int, num_decode_seqs: int) -> float:
        """Host time to launch an eager step's kernels, layer after layer."""
        host = self.eager_host_s + self.eager_attention_s * ((num_prefill_seqs > 0) + (num_decode_seqs > 0))
        return host + self.eager_quantized_s if num_decode_seqs else host

    def step_time(self, batch: Batch) -> float:
        """Seconds for one step of `batch` (only its aggregate counts are read)."""
        swapped = batch.swap_in_blocks + batch.swap_out_blocks
        swap = self.swap_time(swapped) if swapped else 0.0
        nd, np_, spec = batch.num_decode_seqs, batch.num_prefill_seqs, batch.num_spec_tokens
        tokens = batch.num_prefill_tokens + nd + spec  # a verify step's drafts are token rows, and sampled
        if tokens == 0:
            return swap
        seqs = np_ + nd
        padded = self.graph_batch(np_, nd + spec)
        rows = padded or tokens  # a graph computes its padded rows too
        body = (self.gemm_time(rows, padded or seqs + spec) + self.activation_time(rows, padded or seqs + spec)
                + self.allreduce_time(rows) + self.attention_time(batch, nd, np_, padded))
        if padded:
            return self.overhead(seqs, True) + body + swap
        host = self.host_time(np_, nd)
        return self.overhead(seqs) + (body if body > host else host) + swap

    def attention_time(self, batch: Batch, nd: int, np_: int, padded: int) -> float:
        """Decode and prefill attention of a step; sliding-window layers (window_share of them) priced
        on what they read (Batch.window_reads), the others on the whole context."""
        decode = self.decode_attention_time(nd, batch.decode_read_tokens, batch.decode_max_context, padded)
        prefill = self.prefill_attention_time(np_, batch.prefill_attn_pairs,
                                              batch.prefill_context_tokens + batch.num_prefill_tokens,
                                              batch.num_prefill_tokens)
        share = self.window_share
        if not share:
            return decode + prefill
        w = self.window
        dec, pairs, kv = batch.window_reads(w)
        longest = min(batch.decode_max_context, w)
        if (dec, pairs, kv, longest) == (batch.decode_read_tokens, batch.prefill_attn_pairs, batch.prefill_context_tokens
                                         + batch.num_prefill_tokens, batch.decode_max_context):
            return decode + prefill  # no sequence past the window: the windowed layers read what the others do
        windowed = (self.decode_attention_time(nd, dec, longest, padded)
                    + self.prefill_attention_time(np_, pairs, kv, batch.num_prefill_tokens))
        return (1.0 - share) * (decode + prefill) + share * windowed

    def window_attention_lines(self, n: int, x0: int, growth: int, longest: int, rows: int) -> list[tuple]:
        """decode_attention_lines for sliding-window layers: n sequences read x0 tokens (min(context,
        window) each), `growth` more a step (those not yet past the window), the longest
        min(longest, window), one more a step until it reaches the window. The same terms, their
        slopes those of the windowed reads."""
        c, m, w = self.decode_s_per_pair, self.kv_s_per_token, self.window
        lines = [self.decode_floor_line, (c * x0, c * growth), (m * x0, m * growth)]
        if self.decode_key_s:
            s = self.decode_key_s / self.decode_splits(rows)
            longest = min(longest, w)
            if longest >= x0 / n:
                first, g_first = longest, (1 if longest < w else 0)
            else:
                first, g_first = x0 / n, growth / n
            lines.append((s * first, s * g_first))
            if n > 1:
                others, g_others = (x0 - first) / (n - 1), (growth - g_first) / (n - 1)
                tail, g_tail = s * (first - others), s * (g_first - g_others)
                cn, mn = c * n, m * n
                lines += [(tail + cn * others, g_tail + cn * g_others), (tail + mn * others, g_tail + mn * g_others)]
        return lines

    def _blend(self, full: list, windowed: list) -> list:
        """The lines of (1 - share) x max(full) + share x max(windowed): every pair's weighted sum, the
        two floors' first (the eager step adds the host time to that one); lines that another beats at
        every step (no lower start, no lower slope) are left out first."""
        a, b = 1.0 - self.window_share, self.window_share
        full, windowed = _undominated(full), _undominated(windowed)
        pairs = [(a * fa + b * wa, a * fb + b * wb) for i, (fa, fb) in enumerate(full)
                 for j, (wa, wb) in enumerate(windowed) if i or j]
        return [(a * full[0][0] + b * windowed[0][0], 0.0), *pairs]

    def decode_steps_time(self, num_seqs: int, rows, read_tokens, sampled: int | None = None, host: bool = True):
        """Seconds of pure-decode steps of `num_seqs` sequences, step i computing rows[i] token rows (an
        int: every step the same; all sampled unless `sampled` says how many: a verify step of
        speculative decoding) and reading read_tokens[i] keys, the longest not known (the mean):
        step_time's price of such batches, many at once. `host=False`: the GPU's work alone (an eager
        step's host launch time left out)."""
        import numpy as np

        x = np.asarray(read_tokens, dtype=np.float64)
        if isinstance(rows, (int, np.integer)) or rows.min() == rows.max():
            r = int(rows if isinstance(rows, (int, np.integer)) else rows[0])
            return self._steps_of(num_seqs, r, sampled, host, x)
        out = np.empty(len(x))
        rows = np.asarray(rows)
        for r in np.unique(rows).tolist():
            mask = rows == r
            out[mask] = self._steps_of(num_seqs, r, sampled, host, x[mask])
        return out

    def decode_steps_affine(self, num_seqs: int, rows: int, lo: float, hi: float, sampled: int | None = None,
                            host: bool = True) -> tuple[float, float] | None:
        """(alpha, beta) with decode_steps_time(num_seqs, rows, x, sampled, host) = alpha + beta * x for
        every x in [lo, hi] keys, or None when the price bends in between (another attention term
        overtakes, or an eager step's host time does)."""
        import numpy as np

        self._steps_of(num_seqs, rows, sampled, host, np.zeros(1))  # fills the memo
        padded, body, (a0, slope), host_s = self._steps_memo[(num_seqs, rows, sampled, host)]
        at_lo, at_hi = a0 + slope * lo, a0 + slope * hi
        top = int(at_lo.argmax())
        if int(at_hi.argmax()) != top and at_hi[top] < at_hi.max():
            return None
        if padded:
            return self.overhead(num_seqs, True) + body + float(a0[top]), float(slope[top])
        alpha, beta = body + float(a0[top]), float(slope[top])
        if host:
            if alpha + beta * lo < host_s:
                return (self.overhead(num_seqs) + host_s, 0.0) if alpha + beta * hi <= host_s else None
        return self.overhead(num_seqs) + alpha, beta

    def _steps_of(self, n: int, r: int, sampled, host: bool, x):
        """decode_steps_time for steps of r rows: the constant part and the attention lines (their value
        at x keys: each line is affine in x when the longest is the mean), memoised per shape."""
        import numpy as np

        key = (n, r, sampled, host)
        memo = self._steps_memo.get(key)
        if memo is None:
            padded = self.graph_batch(0, r)
            logits = padded or (r if sampled is None else sampled)  # a CUDA graph computes its padded rows
            body = (self.gemm_time(padded or r, logits) + self.activation_time(padded or r, logits)
                    + self.allreduce_time(padded or r))
            at0 = self.decode_attention_lines(n, 0, 0, padded or n)
            at1 = self.decode_attention_lines(n, 1, 0, padded or n)
            lines = (np.array([a0 for a0, _ in at0]), np.array([a1 - a0 for (a0, _), (a1, _) in zip(at0, at1)]))
            memo = self._steps_memo[key] = (padded, body, lines, self.host_time(0, n))
        padded, body, (a0, slope), host_s = memo
        attention = (a0[:, None] + slope[:, None] * x[None, :]).max(axis=0)
        if padded:
            return self.overhead(n, True) + (body + attention)
        gpu = body + attention
        return self.overhead(n) + (np.maximum(gpu, host_s) if host else gpu)

    # ---- runs of pure-decode steps in closed form -----------------------------------------------
    def _decode_lines(self, shape: DecodeShape) -> tuple:
        """Decode step i of n sequences holding x0 + i*n context tokens, the longest longest + i (0: the
        mean), as _envelope's lines in i: the step's constant part, and decode_attention_lines (blended
        with window_attention_lines for sliding-window layers, which read window_x0 + i*window_growth)."""
        last = self._last_lines
        if shape == last[0]:  # a run is sized, then priced
            return last[1]
        n, x0, longest, window_x0, window_growth = shape
        base = self._decode_base.get(n)
        if base is None:
            base = self._decode_base[n] = self._decode_constants(n)
        fixed, top, host, rows = base
        attention = self.decode_attention_lines(n, x0, longest, rows)
        if self.window_share and not (window_x0 == x0 and window_growth == n and longest < self.window):
            attention = self._blend(attention, self.window_attention_lines(n, window_x0, window_growth, longest, rows))
        if top is None:  # a graph: fixed + max(attention terms)
            lines = _envelope(fixed, attention)
        else:  # eager: fixed + max(host, rest + attention terms)
            floor, *terms = attention
            lines = _envelope(fixed, [(max(host, top + floor[0]), 0.0), *((top + a, b) for a, b in terms)])
        self._last_lines = (shape, lines)
        return lines

    def _decode_constants(self, n: int) -> tuple:
        """What _decode_lines reads for n sequences whatever their context: (the envelope's fixed
        part; None for a CUDA graph, else the eager step's GEMM, elementwise and all-reduce time added
        to each attention term; the eager host time; the kernel's rows)."""
        rows = self.graph_batch(0, n)
        graph = rows > 0
        rows = rows or n
        rest = self.gemm_time(rows, rows) + self.activation_time(rows, rows) + self.allreduce_time(rows)
        fixed = self.overhead(n, graph)
        if graph:
            return fixed + rest, None, 0.0, rows
        return fixed, rest, self.host_time(0, n), rows

    def decode_run_time(self, shape: DecodeShape, k: int) -> float:
        """Seconds for the first k pure-decode steps of a run of `shape` (kvsim.perf.pricing). Closed form in k."""
        if k <= 0 or shape.num_seqs <= 0:
            return 0.0
        return _run_time(self._decode_lines(shape), k)

    def decode_run_within(self, shape: DecodeShape, max_steps: int, budget_s: float = math.inf) -> DecodeRunPrice:
        """The first k <= max_steps steps of the run that start within budget_s: k = max_steps if those
        all end before budget_s, else the smallest k whose steps reach it (decode_steps_within)."""
        lines = self._decode_lines(shape)
        first = lines[0] + lines[1]
        if max_steps == 1:
            return _new(DecodeRunPrice, (1, first, first))
        total = _run_time(lines, max_steps)
        if total < budget_s:
            return _new(DecodeRunPrice, (max_steps, total, first))
        return _new(DecodeRunPrice, (*_steps_within(lines, budget_s), first))

    def decode_steps_within(self, shape: DecodeShape, budget_s: float) -> int:
        """The smallest k >= 1 with decode_run_time(shape, k) >= budget_s."""
        if shape.num_seqs <= 0 or not math.isfinite(budget_s):
            raise ValueError(f"need num_seqs > 0 and a finite budget, got {shape.num_seqs}, {budget_s}")
        return _steps_within(self._decode_lines(shape), budget_s)[0]


def _steps_within(lines: tuple, budget_s: float) -> tuple[int, float]:
    """The smallest k >= 1 whose run of `lines` (as StepModel._decode_lines) takes >= budget_s, and
    that run's seconds. Solves the quadratic of the regime the run starts in, checks the answer
    against the closed form, and falls back to bisection when the run changes regime."""
    fixed, a, b = lines[0], lines[1], lines[2]
    a += fixed  # sum_{i<k} (a + b i) >= budget, in the first regime
    if a >= budget_s:
        return 1, a
    if b > 0:
        k = math.ceil((-(a - b / 2) + math.sqrt((a - b / 2) ** 2 + 2 * b * budget_s)) / b)
    else:
        k = math.ceil(budget_s / a)
    k = max(k, 1)
    total = _run_time(lines, k)
    if total >= budget_s:
        if k == 1 or _run_time(lines, k - 1) < budget_s:
            return k, total
        if k == 2 or _run_time(lines, k - 2) < budget_s:
            return k - 1, _run_time(lines, k - 1)
    elif k > 1 and _run_time(lines, k - 1) >= budget_s and (k == 2 or _run_time(lines, k - 2) < budget_s):  # rounding
        return k - 1, _run_time(lines, k - 1)
    elif _run_time(lines, k + 1) >= budget_s:
        return k + 1, _run_time(lines, k + 1)
    return _bisect_steps(lines, budget_s)


def _bisect_steps(lines: tuple, budget_s: float) -> tuple[int, float]:
    """_steps_within for a run that changes regime: bisection over the closed form."""
    lo, hi = 1, 2
    while _run_time(lines, hi) < budget_s:
        lo, hi = hi, hi * 2
    hi = first_reaching(lambda _, k: _run_time(lines, k), None, budget_s, lo, hi)
    return hi, _run_time(lines, hi)
