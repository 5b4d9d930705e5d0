"""The GPU engine's model runner: a kvsim `Batch` -> packed inputs -> one forward -> greedy tokens.

`ModelRunner` owns the model and the per-layer paged KV caches. Each step packs the scheduled
sequences' new tokens (decode rows first, then prefill chunks, as vLLM V1 does) with their positions,
slots (`block_table[p // block_size] * block_size + p % block_size`), context lengths and block
tables, all built in numpy and sent to the device in one copy. Pure-decode steps replay a CUDA graph
captured for the next padded batch size; padded rows store nothing (slot -1) and attend to one token.

Token ids: a prompt position covered by `Request.token_ids` uses that id (so shared prefixes are the
same tokens), other prompt positions a pseudo-random id of (request id, position), output positions
the tokens this runner sampled for the sequence. When the device is not told `num_blocks`, it is
sized like vLLM: a profiling forward of `max_num_batched_tokens` tokens gives the activation peak, and
what `gpu_memory_utilization` leaves after weights, activations and non-torch memory becomes KV blocks.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import numpy as np
import torch

from kvsim.backends.triton_engine.decode_attention import choose_num_splits
from kvsim.backends.triton_engine.kv_quant import LayerKVCache, allocate_kv_cache, resolve_kv_dtype
from kvsim.backends.triton_engine.model import TORCH_DTYPES, AttentionMetadata, PagedAttention, Transformer
from kvsim.errors import KvsimError
from kvsim.perf.roofline import VLLM_GRAPH_SIZES
from kvsim.sequence import Sequence


def table_width(num_blocks: int) -> int:
    """Block-table columns, a multiple of 16: Triton then compiles one kernel variant for every width."""
    return -(-max(num_blocks, 1) // 16) * 16


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Padded decode batch sizes that get a CUDA graph: vLLM V1's capture sizes (1, 2, 4, then steps of 8
    to 256 and of 16 to 512) up to the first that holds max_num_seqs; larger batches run eagerly, as in vLLM."""
    sizes = [b for b in VLLM_GRAPH_SIZES if b < max_num_seqs]
    return sizes + [b for b in VLLM_GRAPH_SIZES if b >= max_num_seqs][:1]


def pseudo_token_ids(request_ids: np.ndarray, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    """A fixed token id per (request id, position): splitmix64 of the pair, mod vocab_size."""
    x = request_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= positions.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return (x % np.uint64(vocab_size)).astype(np.int32)


@dataclass(slots=True)
class RunnerConfig:
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    kv_cache_dtype: str = "auto"  # a scenario name: resolved by kv_quant.resolve_kv_dtype
    gpu_memory_utilization: float = 0.9
    num_blocks: Optional[int] = None  # None: size the cache by profiling the device
    enforce_eager: bool = False  # no CUDA graphs
    device: str = "cuda:0"
    seed: int = 0
    init_std: float = 0.02


@dataclass(slots=True)
class MemoryProfile:
    """What the profiling run measured, in bytes; kv = budget - weights - other torch - activations - non-torch."""

    total: int
    gpu_memory_utilization: float
    weights: int
    other_torch: int  # torch memory held besides weights at profiling time (buffers, earlier engines)
    activation_peak: int
    non_torch: int  # CUDA context, cuBLAS workspaces, other processes
    bytes_per_block: int
    num_blocks: int

    @property
    def budget(self) -> float:
        return self.total * self.gpu_memory_utilization

    @property
    def kv(self) -> float:
        return self.budget - self.weights - self.other_torch - self.activation_peak - self.non_torch


@dataclass(slots=True)
class StepInputs:
    """One step's packed host arrays (int32): decode rows first, then prefill rows."""

    input_ids: np.ndarray  # (num_tokens,)
    positions: np.ndarray  # (num_tokens,)
    slot_mapping: np.ndarray  # (num_tokens,)
    context_lens: np.ndarray  # (num_seqs,) cached + new
    block_tables: np.ndarray  # (num_seqs, width)
    cu_seqlens_q: np.ndarray  # (num_prefill_seqs + 1,) offsets into the prefill rows
    logits_indices: np.ndarray  # rows whose logits are sampled
    num_decode: int
    max_seqlen_q: int
    sampled: list[Sequence] = field(default_factory=list)  # the sequences of logits_indices, in order


@dataclass(slots=True)
class StepOutput:
    seq_ids: list[int]
    token_ids: list[int]
    logits: Optional[torch.Tensor] = None  # (len(seq_ids), vocab) float32, when asked for


def bytes_of(caches: list[LayerKVCache]) -> int:
    tensors = chain.from_iterable((c.k, c.v, c.k_scale, c.v_scale) for c in caches)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class ModelRunner:
    def __init__(self, spec, cfg: RunnerConfig):
        self.spec, self.cfg = spec, cfg
        self.device = torch.device(cfg.device)
        self.dtype = TORCH_DTYPES[spec.dtype]
        self.kv_dtype = resolve_kv_dtype(cfg.kv_cache_dtype, self.dtype)
        self.block_size = cfg.block_size
        self.scale = spec.head_dim ** -0.5
        self.model = Transformer(spec, self.dtype, self.device, cfg.seed, cfg.init_std)
        self._sampled: dict[int, list[int]] = {}
        self.profile: Optional[MemoryProfile] = None
        num_blocks = cfg.num_blocks
        if num_blocks is None:
            self.profile = self.profile_num_blocks()
            num_blocks = self.profile.num_blocks
            if num_blocks * self.block_size < cfg.max_model_len:  # before any kernel reads block 0
                raise KvsimError(f"the KV cache left on {torch.cuda.get_device_name(self.device)} holds {num_blocks} "
                                 f"blocks, fewer than one max_model_len ({cfg.max_model_len}) sequence: lower "
                                 f"engine.max_model_len or raise hardware.gpu_memory_utilization")
        self.num_blocks = num_blocks
        self.kv_caches = self._allocate(num_blocks)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if self.device.type == "cuda":
            self.warmup_decode()
            if not cfg.enforce_eager:
                self.capture_cudagraphs()

    @property
    def graph_sizes(self) -> list[int]:
        """Decode batch sizes with a captured CUDA graph (empty: eager only)."""
        return list(self._graphs)

    @contextmanager
    def eager(self, enabled: bool = True):
        """Steps inside run eagerly (no CUDA graph replayed) when `enabled`; the graphs stay captured."""
        graphs = self._graphs
        if enabled:
            self._graphs = {}
        try:
            yield self
        finally:
            self._graphs = graphs

    def _allocate(self, num_blocks: int) -> list[LayerKVCache]:
        s = self.spec
        return allocate_kv_cache(s.num_hidden_layers, num_blocks, self.block_size, s.num_key_value_heads,
                                 s.head_dim, self.kv_dtype, self.device, self.dtype)

    # ---- host-side preparation -----------------------------------------------------------
    def prepare_decode(self, seqs: list[Sequence]) -> StepInputs:
        return self._build(seqs, [1] * len(seqs), len(seqs))

    def prepare_prefill(self, seqs: list[Sequence], num_new_tokens: list[int]) -> StepInputs:
        return self._build(seqs, num_new_tokens, 0)

    def prepare(self, seqs: list[Sequence], num_new_tokens: list[int]) -> StepInputs:
        """A mixed step: single-token rows go to the decode kernel, the others to the prefill kernel."""
        decode = [s for s, n in zip(seqs, num_new_tokens) if n == 1]
        prefill = [(s, n) for s, n in zip(seqs, num_new_tokens) if n != 1]
        return self._build(decode + [s for s, _ in prefill], [1] * len(decode) + [n for _, n in prefill],
                           len(decode))

    def _build(self, seqs: list[Sequence], num_new_tokens: list[int], num_decode: int) -> StepInputs:
        n, bs = len(seqs), self.block_size
        starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, n)
        counts = np.asarray(num_new_tokens, dtype=np.int64)
        ends = starts + counts
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=cu[1:])
        seq_idx = np.repeat(np.arange(n), counts)
        positions = np.arange(cu[-1]) - cu[:-1][seq_idx] + starts[seq_idx]
        tables = self._block_tables(seqs, ends)
        slots = tables[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        done = ends == np.fromiter((s.num_tokens for s in seqs), np.int64, n)
        prefill_counts = counts[num_decode:]
        return StepInputs(
            input_ids=self._token_ids(seqs, starts, ends, cu, positions, seq_idx),
            positions=positions.astype(np.int32), slot_mapping=slots.astype(np.int32),
            context_lens=ends.astype(np.int32), block_tables=tables,
            cu_seqlens_q=(cu[num_decode:] - cu[num_decode]).astype(np.int32),
            logits_indices=(cu[1:][done] - 1).astype(np.int32), num_decode=num_decode,
            max_seqlen_q=int(prefill_counts.max()) if len(prefill_counts) else 0,
            sampled=[s for s, d in zip(seqs, done) if d])

    def _block_tables(self, seqs: list[Sequence], ends: np.ndarray) -> np.ndarray:
        """(num_seqs, width) int32: the blocks covering each sequence's first `ends` tokens, zero padded."""
        need = (ends + self.block_size - 1) // self.block_size
        table = np.zeros((len(seqs), table_width(int(need.max(initial=1)))), dtype=np.int32)
        flat = np.fromiter(chain.from_iterable(s.block_table[:k] for s, k in zip(seqs, need.tolist())),
                           np.int32, int(need.sum()))
        table[np.arange(table.shape[1])[None, :] < need[:, None]] = flat
        return table

    def _token_ids(self, seqs, starts, ends, cu, positions, seq_idx) -> np.ndarray:
        rids = np.fromiter((s.seq_id for s in seqs), np.int64, len(seqs))
        ids = pseudo_token_ids(rids[seq_idx], positions, self.spec.vocab_size)
        for i, s in enumerate(seqs):
            st, en, off = int(starts[i]), int(ends[i]), int(cu[i])
            known = s.request.token_ids
            if known is not None and st < len(known):
                k = min(en, len(known))
                ids[off:off + k - st] = known[st:k] % self.spec.vocab_size  # trace ids may exceed the vocab
            out, plen = self._sampled.get(s.seq_id), s.prompt_len
            if out and en > plen:
                a, b = max(st, plen), min(en, plen + len(out))
                if b > a:
                    ids[off + a - st:off + b - st] = out[a - plen:b - plen]
        return ids

    def _record(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Keep each sampled token as the sequence's output number `num_output_tokens`."""
        for s, t in zip(seqs, tokens):
            out = self._sampled.setdefault(s.seq_id, [])
            j = s.num_output_tokens
            if len(out) < j:  # outputs forgotten by free() (recompute): their pseudo-random stand-ins
                pos = np.arange(s.prompt_len + len(out), s.prompt_len + j)
                out.extend(pseudo_token_ids(np.full(len(pos), s.seq_id), pos, self.spec.vocab_size).tolist())
            del out[j:]
            out.append(t)

    def free(self, seq: Sequence) -> None:
        self._sampled.pop(seq.seq_id, None)

    # ---- device side ---------------------------------------------------------------------
    def _upload(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """One host-to-device copy of several int32 arrays; returns device views shaped like them,
        each 16-byte aligned (Triton compiles a kernel variant per pointer alignment)."""
        sizes = [-(-a.size // 4) * 4 for a in arrays]
        flat = torch.from_numpy(np.concatenate([np.resize(a.ravel(), n) for a, n in zip(arrays, sizes)]))
        if self.device.type == "cuda":
            flat = flat.pin_memory()
        dev = flat.to(self.device, non_blocking=True)
        views, off = [], 0
        for a, n in zip(arrays, sizes):
            views.append(dev[off:off + a.size].view(a.shape))
            off += n
        return views

    def _forward_eager(self, inp: StepInputs, caches: list[LayerKVCache], with_logits: bool):
        nd = inp.num_decode
        ids, pos, slots, decode_ctx, prefill_ctx, tables, cu, idx = self._upload(
            inp.input_ids, inp.positions, inp.slot_mapping, inp.context_lens[:nd], inp.context_lens[nd:],
            inp.block_tables, inp.cu_seqlens_q, inp.logits_indices)
        meta = AttentionMetadata(slot_mapping=slots, num_decode_tokens=nd, decode_block_tables=tables[:nd],
                                 decode_context_lens=decode_ctx, num_splits=self.decode_splits(nd) if nd else None)
        if len(inp.cu_seqlens_q) > 1:
            meta.prefill_block_tables, meta.cu_seqlens_q = tables[nd:], cu
            meta.prefill_context_lens, meta.max_seqlen_q = prefill_ctx, inp.max_seqlen_q
        hidden = self.model(ids, pos, PagedAttention(caches, meta, self.scale))
        logits = self.model.compute_logits(hidden[idx])
        return logits.argmax(dim=-1), (logits if with_logits else None)

    @torch.inference_mode()
    def execute_model(self, seqs: list[Sequence], num_new_tokens: list[int], with_logits: bool = False) -> StepOutput:
        """Run one step; record and return the tokens of sequences that reach their end."""
        if not seqs:
            return StepOutput([], [])
        inp = self.prepare(seqs, num_new_tokens)
        padded = next((b for b in self._graphs if b >= len(seqs)), None)
        if inp.num_decode == len(seqs) and padded is not None and not with_logits:
            rows = self._replay(inp, padded).tolist()
            tokens, logits = [rows[i] for i in inp.logits_indices], None
        else:
            tokens, logits = self._forward_eager(inp, self.kv_caches, with_logits)
            tokens = tokens.tolist()
        self._record(inp.sampled, tokens)
        return StepOutput([s.seq_id for s in inp.sampled], tokens, logits)

    # ---- decode kernel variants and CUDA graphs ---------------------------------------------
    def decode_splits(self, num_decode: int) -> int:
        """Flash-decoding splits for a decode batch: the kernel's choice for max_model_len, rounded down to a
        power of two, so a handful of compiled variants (one per value) serve every step."""
        return choose_num_splits(num_decode, self.spec.num_key_value_heads, self.cfg.max_model_len, self.device,
                                 self.kv_dtype, power_of_two=True)

    def _dummy_decode(self, num_decode: int) -> StepInputs:
        zeros = np.zeros(num_decode, np.int32)
        return StepInputs(input_ids=zeros, positions=zeros, slot_mapping=zeros - 1, context_lens=zeros + 1,
                          block_tables=np.zeros((num_decode, table_width(1)), np.int32),
                          cu_seqlens_q=np.zeros(1, np.int32), logits_indices=np.arange(num_decode, dtype=np.int32),
                          num_decode=num_decode, max_seqlen_q=0)

    @torch.inference_mode()
    def warmup_decode(self) -> None:
        """Compile every decode variant now (one per split count), so that no timed step pays for it."""
        first = {}
        for b in range(1, self.cfg.max_num_seqs + 1):
            first.setdefault(self.decode_splits(b), b)
        for b in first.values():
            self._forward_eager(self._dummy_decode(b), self.kv_caches, with_logits=False)
        torch.cuda.synchronize(self.device)

    def capture_cudagraphs(self) -> None:
        sizes = graph_batch_sizes(self.cfg.max_num_seqs)
        biggest, width = sizes[-1], table_width(-(-self.cfg.max_model_len // self.block_size))
        new = lambda fill, *shape: torch.full(shape, fill, dtype=torch.int32, device=self.device)  # noqa: E731
        self._g_ids, self._g_pos = new(0, biggest), new(0, biggest)
        self._g_slots, self._g_ctx = new(-1, biggest), new(1, biggest)
        self._g_tables = new(0, biggest, width)
        self._g_tokens = torch.zeros(biggest, dtype=torch.int64, device=self.device)
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for b in reversed(sizes):  # biggest first, so the smaller graphs reuse its memory
                meta = AttentionMetadata(slot_mapping=self._g_slots[:b], num_decode_tokens=b,
                                         decode_block_tables=self._g_tables[:b], decode_context_lens=self._g_ctx[:b],
                                         num_splits=self.decode_splits(b))
                attend = PagedAttention(self.kv_caches, meta, self.scale)

                def run(b=b, attend=attend):
                    hidden = self.model(self._g_ids[:b], self._g_pos[:b], attend)
                    self._g_tokens[:b] = self.model.compute_logits(hidden).argmax(dim=-1)

                run()  # compiles the kernels outside the capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    run()
                self._graphs[b] = graph
        self._graphs = dict(sorted(self._graphs.items()))
        torch.cuda.synchronize(self.device)

    def _replay(self, inp: StepInputs, padded: int) -> torch.Tensor:
        n, b = len(inp.context_lens), padded
        pad = lambda a, fill: np.concatenate([a, np.full(b - n, fill, np.int32)])  # noqa: E731
        ids, pos, slots, ctx, tables = self._upload(pad(inp.input_ids, 0), pad(inp.positions, 0),
                                                    pad(inp.slot_mapping, -1), pad(inp.context_lens, 1),
                                                    inp.block_tables)
        self._g_ids[:b], self._g_pos[:b], self._g_slots[:b], self._g_ctx[:b] = ids, pos, slots, ctx
        self._g_tables[:n, :tables.shape[1]] = tables
        self._graphs[b].replay()
        return self._g_tokens[:n]

    # ---- KV sizing from the device ---------------------------------------------------------
    def _dummy_inputs(self) -> StepInputs:
        """A prefill of max_num_batched_tokens tokens over min(max_num_seqs, tokens) sequences, storing nothing."""
        total = self.cfg.max_num_batched_tokens
        n = min(self.cfg.max_num_seqs, total)
        lens = np.full(n, total // n, dtype=np.int32)
        lens[-1] += total % n
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        width = table_width(-(-int(lens.max()) // self.block_size))
        return StepInputs(
            input_ids=np.zeros(total, np.int32),
            positions=(np.arange(total) - np.repeat(cu[:-1], lens)).astype(np.int32),
            slot_mapping=np.full(total, -1, np.int32), context_lens=lens,
            block_tables=np.zeros((n, width), np.int32),  # every block is the probe cache's one block
            cu_seqlens_q=cu, logits_indices=cu[1:] - 1, num_decode=0, max_seqlen_q=int(lens.max()))

    @torch.inference_mode()
    def profile_num_blocks(self) -> MemoryProfile:
        dev, cfg = self.device, self.cfg
        gc.collect()
        torch.cuda.empty_cache()
        probe = self._allocate(1)
        bytes_per_block = bytes_of(probe)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        held = torch.cuda.memory_allocated(dev)
        self._forward_eager(self._dummy_inputs(), probe, with_logits=False)
        torch.cuda.synchronize(dev)
        activation_peak = torch.cuda.max_memory_allocated(dev) - held
        free, total = torch.cuda.mem_get_info(dev)
        non_torch = max(0, total - free - torch.cuda.memory_reserved(dev))
        weights = self.model.weight_bytes
        prof = MemoryProfile(total, cfg.gpu_memory_utilization, weights, held - weights - bytes_per_block,
                             activation_peak, non_torch, bytes_per_block, 0)
        del probe
        torch.cuda.empty_cache()
        prof.num_blocks = max(0, int(prof.kv // bytes_per_block))
        return prof
