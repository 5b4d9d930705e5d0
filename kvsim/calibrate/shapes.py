"""The step shapes `kvsim profile` times, and the sequences that make one.

Three sets: the regular grid (`default_grid`: decode batch x context, prefill chunk x cached
context, mixed), the shapes serving produces (`serving_grid`: ragged decode batches whose contexts
differ per sequence, batch sizes between the CUDA-graph sizes, long chunks over long cached
prefixes) and random shapes off both, to test a fit on (`heldout_grid`, `ragged_heldout_grid`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsim.batch import Batch
from kvsim.errors import KvsimError
from kvsim.sequence import Request, Sequence


@dataclass(slots=True, frozen=True)
class Shape:
    """One step: `decode_seqs` decodes holding `decode_context` tokens each (the new one included), and
    `prefill_seqs` chunks of `prefill_chunk` new tokens after `prefill_cached` cached ones each. A
    ragged step lists each decode's context in `contexts` (then decode_context is the longest)."""

    phase: str
    decode_seqs: int = 0
    decode_context: int = 0
    prefill_seqs: int = 0
    prefill_chunk: int = 0
    prefill_cached: int = 0
    eager: bool = False  # a pure decode step run without its CUDA graph
    contexts: tuple = ()

    @classmethod
    def ragged(cls, contexts, prefill_chunk: int = 0, prefill_cached: int = 0) -> "Shape":
        """Decodes of the given contexts (plus one prefill chunk, if any): a decode or a mixed step."""
        contexts = tuple(int(c) for c in contexts)
        return cls("mixed" if prefill_chunk else "decode", len(contexts), max(contexts), int(prefill_chunk > 0),
                   prefill_chunk, prefill_cached, contexts=contexts)

    @property
    def decode_contexts(self) -> tuple:
        return self.contexts or (self.decode_context,) * self.decode_seqs

    @property
    def cache_tokens(self) -> int:
        return sum(self.decode_contexts) + self.prefill_seqs * (self.prefill_cached + self.prefill_chunk)

    @property
    def max_len(self) -> int:
        return max(self.decode_context, self.prefill_cached + self.prefill_chunk)


def _inside(shapes, max_model_len: int, max_cache_tokens: int, max_num_seqs: int) -> list[Shape]:
    return [s for s in shapes if s.max_len <= max_model_len and s.cache_tokens <= max_cache_tokens
            and s.decode_seqs <= max_num_seqs and s.prefill_seqs * s.prefill_chunk <= 8192]


def default_grid(full: bool = True, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                 max_num_seqs: int = 256) -> list[Shape]:
    """The shapes `kvsim profile` times: enough of each phase to fit the step model's terms and to
    hold some out. `full=False` is the cut-down grid used for the quantized caches."""
    batches = (1, 2, 4, 8, 16, 32, 64, 128, 256) if full else (1, 4, 16, 64, 256)
    contexts = (128, 512, 1024, 2048, 4096, 8192, 16384) if full else (512, 2048, 8192)
    chunks = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if full else (64, 512, 2048, 8192)
    cached = (0, 1024, 4096, 12288) if full else (0, 4096)
    shapes = [Shape("decode", b, c) for b in batches for c in contexts]
    shapes += [Shape("decode", b, 1024, eager=True) for b in ((1, 8, 64, 256) if full else (8, 64))]
    shapes += [Shape("prefill", prefill_seqs=1, prefill_chunk=n, prefill_cached=c) for n in chunks for c in cached]
    shapes += [Shape("prefill", prefill_seqs=s, prefill_chunk=n) for s, n in ((4, 512), (8, 256), (16, 128), (4, 2048))
               if full or s == 4]
    for d in ((4, 16, 64, 128, 256) if full else (4, 64)):
        for c in ((512, 2048) if full else (2048,)):
            for n in ((128, 512, 2048) if full else (512, 2048)):
                for pc in (0, 2048):
                    shapes.append(Shape("mixed", d, c, 1, n, pc))
    return _inside(shapes, max_model_len, max_cache_tokens, max_num_seqs)


def lognormal_contexts(rng, n: int, median: float, sigma: float, longest: int) -> tuple:
    """n decode contexts as a serving batch holds them: lognormal about `median`, within [16, longest]."""
    return tuple(np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), 16, longest).astype(int).tolist())


def serving_grid(full: bool = True, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                 max_num_seqs: int = 256) -> list[Shape]:
    """The shapes serving produces that the regular grid lacks: one long sequence among short ones (the
    longest then sets the decode kernel's time while the batch under-fills the GPU), lognormal contexts
    at batch sizes between the CUDA-graph sizes, a few 8k-16k contexts, ragged decodes beside a prefill
    chunk, and long chunks over long cached prefixes. Fixed seed: the same shapes on every run."""
    rng = np.random.default_rng(7)
    longest = max_model_len
    shapes = []
    for b in (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128) if full else (4, 16, 32, 64):
        for long in (2048, 8192) if full else (4096,):
            shapes.append(Shape.ragged((long,) + (128,) * (b - 1)))
    for i, b in enumerate((3, 6, 12, 20, 28, 40, 56, 96) if full else (6, 20, 40)):
        median, sigma = ((400, 0.6), (1000, 0.8), (3000, 0.6))[i % 3]
        shapes.append(Shape.ragged(lognormal_contexts(rng, b, median, sigma, longest)))
    for b in (2, 4, 8, 12) if full else (2, 6, 12):
        shapes.append(Shape.ragged(rng.integers(8192, min(16384, longest) + 1, b)))
    for d, chunk in ((6, 256), (16, 512), (32, 2048)) if full else ((6, 512),):
        shapes.append(Shape.ragged(lognormal_contexts(rng, d, 900, 0.8, longest), chunk))
    for chunk, cached in ((256, 0), (1024, 0), (2048, 0), (4096, 0), (8192, 0), (1024, 8192), (2048, 14336),
                          (4096, 12288), (8192, 8192)):
        shapes.append(Shape("prefill", prefill_seqs=1, prefill_chunk=chunk, prefill_cached=cached))
    for contexts, chunk, cached in (((14000, 9000), 8190, 8192), ((15000, 12000, 9500), 4096, 0)):
        shapes.append(Shape.ragged(contexts, chunk, cached))
    return _inside(shapes, max_model_len, max_cache_tokens, max_num_seqs)


def anchor_grid(full: bool = True) -> list[Shape]:
    """A few shapes of the regular grid, timed beside the serving grid to tie its table to an earlier
    profile's (the same engine on another machine or day)."""
    if full:
        return [Shape("decode", 1, 4096), Shape("decode", 16, 1024), Shape("decode", 64, 2048),
                Shape("decode", 4, 16384), Shape("prefill", prefill_seqs=1, prefill_chunk=2048),
                Shape("prefill", prefill_seqs=1, prefill_chunk=512, prefill_cached=4096),
                Shape("mixed", 16, 512, 1, 512, 0)]
    return [Shape("decode", 16, 2048), Shape("decode", 64, 512), Shape("prefill", prefill_seqs=1, prefill_chunk=2048),
            Shape("mixed", 4, 2048, 1, 512, 0)]


def _log_uniform(rng, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def heldout_grid(seed: int, per_phase: int, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                 max_num_seqs: int = 256) -> list[Shape]:
    """Random shapes off the regular grid (log-uniform batches, contexts and chunks), to test a fit on."""
    rng = np.random.default_rng(seed)
    shapes: list[Shape] = []
    while len(shapes) < 3 * per_phase:
        kind = ("decode", "prefill", "mixed")[len(shapes) % 3]
        cached = 0 if rng.random() < 0.4 else _log_uniform(rng, 64, 12288)
        if kind == "decode":
            shape = Shape("decode", _log_uniform(rng, 1, max_num_seqs), _log_uniform(rng, 64, max_model_len))
        elif kind == "prefill":
            seqs = 1 if rng.random() < 0.75 else _log_uniform(rng, 2, 8)
            shape = Shape("prefill", prefill_seqs=seqs, prefill_chunk=_log_uniform(rng, 16, 8192 // seqs),
                          prefill_cached=cached)
        else:
            shape = Shape("mixed", _log_uniform(rng, 1, 128), _log_uniform(rng, 64, 8192), 1,
                          _log_uniform(rng, 16, 4096), cached)
        if shape.max_len <= max_model_len and shape.cache_tokens <= max_cache_tokens:
            shapes.append(shape)
    return shapes


def ragged_heldout_grid(seed: int, count: int, max_model_len: int = 16384, max_cache_tokens: int = 300_000,
                        max_num_seqs: int = 128) -> list[Shape]:
    """Random ragged decode batches, to test a fit on: log-uniform batch size, lognormal contexts about a
    log-uniform median with a random spread; one in four holds 8k-16k contexts (long prompts)."""
    rng = np.random.default_rng(seed)
    shapes: list[Shape] = []
    while len(shapes) < count:
        b = _log_uniform(rng, 2, max_num_seqs)
        if rng.random() < 0.25:
            contexts = lognormal_contexts(rng, min(b, 12), 12000, 0.2, max_model_len)
        else:
            contexts = lognormal_contexts(rng, b, _log_uniform(rng, 150, 4000), rng.uniform(0.3, 1.1), max_model_len)
        shape = Shape.ragged(contexts)
        if shape.cache_tokens <= max_cache_tokens:
            shapes.append(shape)
    return shapes


def build_step(shape: Shape, blocks: np.ndarray, block_size: int) -> tuple[list[Sequence], list[int], Batch]:
    """Sequences for `shape` whose block tables take consecutive ids of `blocks`, their new-token
    counts, and the Batch the scheduler would have built (decodes first, as the runner packs them)."""
    seqs, counts, batch, next_block = [], [], Batch(), 0
    rows = [(c - 1, 1) for c in shape.decode_contexts]
    rows += [(shape.prefill_cached, shape.prefill_chunk)] * shape.prefill_seqs
    for i, (computed, new) in enumerate(rows):
        total = computed + new
        need = -(-total // block_size)
        if next_block + need > len(blocks):
            raise KvsimError(f"profile shape {shape} needs more than the {len(blocks)} cache blocks")
        prompt = computed if new == 1 else total  # a decode's prompt is done; a chunk ends its prompt
        seq = Sequence(Request(i, 0.0, prompt, 1 << 20))
        seq.block_table = blocks[next_block:next_block + need].tolist()
        next_block += need
        seq.num_computed_tokens, seq.num_tokens = computed, total
        seq.num_output_tokens = total - prompt
        seqs.append(seq)
        counts.append(new)
        batch.add(seq, new)
    return seqs, counts, batch
