"""KV cache groups as vLLM V1's KV cache manager forms them (v0.11.0: `kv_cache_interface.py`,
`core/kv_cache_utils.py` `get_kv_cache_config`, `core/single_type_kv_cache_manager.py`).

Each attention layer has a spec (vLLM's `FullAttentionSpec`, `SlidingWindowSpec`,
`ChunkedLocalAttentionSpec`, `MLAAttentionSpec`) with a page: the bytes of one block of
`block_size` tokens in that layer (K and V of the KV heads on this GPU; MLA: one latent vector of
kv_lora_rank + qk_rope_head_dim, whole on every tensor-parallel rank).

- One spec for every layer: one group holding every layer; a pool block is one page per layer.
- Several specs (hybrid manager on): layers grouped by spec, each type cut into groups of
  `group_size` layers (the fewest layers of any type; v0.11.0; later releases take the most when
  the counts are within 1.25-1.5x), type by type, `layers[i::n]`, the last group of a type padded.
  All groups share one pool of blocks of `group_size` pages; each group keeps its own block table.
- Hybrid manager off: sliding-window and chunked-local layers become full attention (they keep the
  whole context). vLLM v0.11.0 turns it off for chunked-local attention (Llama-4) unless
  VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.

A sliding-window group frees the blocks that left the window (`remove_skipped_blocks`: those
wholly before token `computed - window + 1`), so a decoding sequence holds at most
ceil((window - 1) / block) + 1 blocks there; a chunked-local group frees the blocks before the
current chunk. vLLM reserves for one request (`max_memory_usage_bytes`, its "Maximum concurrency"
and start-up check) a full group's ceil(max_model_len / block) blocks, a sliding group's
ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block) + 1 (a prefill chunk's new
tokens all take slots before the window moves), a chunked group's
ceil(min(chunk + max_num_batched_tokens, max_model_len) / block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.scenario.models import CHUNKED, SLIDING, ModelSpec

FULL_SPEC, SLIDING_SPEC, CHUNKED_SPEC, MLA_SPEC = ("FullAttentionSpec", "SlidingWindowSpec",
                                                    "ChunkedLocalAttentionSpec", "MLAAttentionSpec")
# vLLM v0.11.0 (platforms/cuda.py) forces the block size of MLA models: FlashMLA on Hopper, CUTLASS MLA on Blackwell.
MLA_BLOCK_SIZE = {"H100-SXM": 64, "H200": 64, "B200": 128}


@dataclass(slots=True, frozen=True)
class KvCacheGroup:
    """One KV cache group (vLLM's KVCacheGroupSpec): layers of one spec sharing a block table."""

    spec: str
    layers: tuple[int, ...]  # model layers it serves; fewer than the layout's group_size when padded
    block_size: int
    page_bytes: int  # one layer's block (vLLM's page_size_bytes)
    window: int = 0  # sliding_window or attention_chunk_size

    def blocks_held(self, num_tokens: int, num_new_tokens: int = 1) -> int:
        """Blocks a sequence holds in this group with `num_tokens` slots, the last `num_new_tokens`
        of them computed this step (vLLM's allocate_slots after remove_skipped_blocks)."""
        blocks = -(-num_tokens // self.block_size)
        computed = max(num_tokens - num_new_tokens, 0)
        if self.spec == SLIDING_SPEC:
            return blocks - max(computed - self.window + 1, 0) // self.block_size
        if self.spec == CHUNKED_SPEC:
            return blocks - computed // self.window * self.window // self.block_size
        return blocks

    def max_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """What vLLM reserves for one request: max_memory_usage_bytes / page_size_bytes."""
        if self.spec == SLIDING_SPEC:
            return -(-min(self.window - 1 + max_num_batched_tokens, max_model_len) // self.block_size) + 1
        if self.spec == CHUNKED_SPEC:
            return -(-min(self.window + max_num_batched_tokens, max_model_len) // self.block_size)
        return -(-max_model_len // self.block_size)


@dataclass(slots=True, frozen=True)
class KvCacheLayout:
    """vLLM's KVCacheConfig on one GPU: the groups and the block pool they share."""

    groups: tuple[KvCacheGroup, ...]
    group_size: int  # layers per group: a pool block is group_size pages
    num_layers: int
    hybrid: bool  # vLLM's hybrid KV cache manager on (a group per spec) or off

    @property
    def page_bytes(self) -> int:
        return self.groups[0].page_bytes

    @property
    def block_bytes(self) -> int:
        """One block of the shared pool: a page in each of group_size layers."""
        return self.page_bytes * self.group_size

    @property
    def block_size(self) -> int:
        return min(g.block_size for g in self.groups)

    @property
    def padding_layers(self) -> int:
        return len(self.groups) * self.group_size - self.num_layers

    def num_blocks(self, kv_bytes: float) -> int:
        """vLLM's get_num_blocks: available memory // page_size // layers per group."""
        return max(0, int(kv_bytes // self.page_bytes // self.group_size))

    def tokens(self, num_blocks: int) -> int:
        """What vLLM logs as "GPU KV cache size: N tokens": blocks per group x block size."""
        return num_blocks // len(self.groups) * self.block_size

    def blocks_held(self, num_tokens: int, num_new_tokens: int = 1) -> int:
        return sum(g.blocks_held(num_tokens, num_new_tokens) for g in self.groups)

    def max_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return sum(g.max_blocks(max_model_len, max_num_batched_tokens) for g in self.groups)

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request"."""
        return num_blocks / self.max_blocks(max_model_len, max_num_batched_tokens)

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """vLLM's start-up check: the bytes one max_model_len request needs, summed over the real layers."""
        return sum(len(g.layers) * g.max_blocks(max_model_len, max_num_batched_tokens) * g.page_bytes
                   for g in self.groups)


def layer_specs(model: ModelSpec, naive: bool = False) -> list[tuple[str, int]]:
    """(spec, window) of each layer; `naive`: every layer full attention."""
    if model.mla:
        return [(MLA_SPEC, 0)] * model.num_hidden_layers
    out = []
    for i in range(model.num_hidden_layers):
        kind = model.layer_type(i)
        if naive or kind not in (SLIDING, CHUNKED):
            out.append((FULL_SPEC, 0))
        else:
            out.append((SLIDING_SPEC, model.sliding_window) if kind == SLIDING
                       else (CHUNKED_SPEC, model.attention_chunk_size))
    return out


def hybrid_manager(model: ModelSpec) -> bool:
    """Whether vLLM v0.11.0 runs the hybrid KV cache manager: not for chunked-local attention."""
    return not any(model.layer_type(i) == CHUNKED for i in range(model.num_hidden_layers))


def kv_cache_layout(model: ModelSpec, page_bytes: int, block_size: int, naive: bool = False,
                    hybrid: bool | None = None) -> KvCacheLayout:
    """The layout vLLM gives `model` with pages of `page_bytes` (every layer's the same: one token's
    K and V, or latent, in one layer times block_size). `naive`: every layer full attention;
    `hybrid`: the manager on or off (None: as vLLM v0.11.0 decides)."""
    specs = layer_specs(model, naive)
    if hybrid is None:
        hybrid = hybrid_manager(model)
    kinds = {s for s, _ in specs}
    if not hybrid and FULL_SPEC in kinds and kinds & {SLIDING_SPEC, CHUNKED_SPEC}:
        specs = [(FULL_SPEC, 0)] * len(specs)  # unify_hybrid_kv_cache_specs
    by_spec: dict[tuple[str, int], list[int]] = {}
    for layer, spec in enumerate(specs):
        by_spec.setdefault(spec, []).append(layer)
    group_size = min(len(v) for v in by_spec.values())
    groups = []
    for (spec, window), layers in by_spec.items():
        n = math.ceil(len(layers) / group_size)
        groups += [KvCacheGroup(spec, tuple(layers[i::n]), block_size, page_bytes, window) for i in range(n)]
    if len(by_spec) == 1:
        group_size = len(specs)
    return KvCacheLayout(tuple(groups), group_size, len(specs), hybrid and len(by_spec) > 1)


def vllm_block_size(model: ModelSpec, gpu_name: str, block_size: int) -> int:
    """The block size vLLM v0.11.0 runs with: MLA models get FlashMLA's 64 on Hopper, CUTLASS MLA's
    128 on Blackwell (unless the requested size is already a multiple)."""
    forced = MLA_BLOCK_SIZE.get(gpu_name) if model.mla else None
    return forced if forced and block_size % forced else block_size


def simulation_problem(model: ModelSpec, layout: KvCacheLayout, gpu_name: str, block_size: int,
                       preemption_mode: str = "recompute") -> str:
    """Why kvsim's engine cannot simulate this layout as vLLM v0.11.0 runs it ('' if it can): an MLA
    model at a block size vLLM would not use, or swap preemption (kvsim's own, from vLLM V0) with
    sliding-window groups, whose windows a swapped-out sequence would have to bring back whole."""
    forced = vllm_block_size(model, gpu_name, block_size)
    if forced != block_size:
        return (f"vLLM v0.11.0 runs {model.name}'s latent attention (MLA) with block_size {forced} on {gpu_name}: "
                f"set engine.block_size = {forced}")
    windowed = any(g.spec == SLIDING_SPEC for g in layout.groups)
    if windowed and preemption_mode == "swap":
        return (f"engine.preemption_mode: swap is not simulated for {model.name}'s sliding-window KV cache groups "
                f"(vLLM V1 has no swap): use recompute")
    return ""
