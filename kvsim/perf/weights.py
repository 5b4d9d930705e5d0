"""Weight bytes per GPU as vLLM shards a model (v0.11.0 parallel linear layers and FusedMoE).

Over the `tp` ranks of a replica (tensor parallel): attention projections, dense MLPs, shared
experts, the vision encoder and the vocab-parallel embedding and lm_head (the vocabulary padded to a
multiple of 64) are split; k and v are replicated once tp exceeds the KV heads (each rank keeps
one); MLA's q_a_proj and kv_a_proj_with_mqa, norms and routers are whole on every rank. With
`dp` data-parallel attention ranks (vLLM's DP + EP for MoE), attention and dense layers are
replicated per DP rank while the routed experts span all tp x dp GPUs: whole experts, ceil(E / (tp x
dp)) on the busiest rank, with `enable_expert_parallel`; otherwise every expert's intermediate
dimension split over tp x dp (vLLM flattens TP across DP for the MoE layers).
"""

from __future__ import annotations

import math

from kvsim.scenario.models import ModelSpec, ParamGroups

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def weights_per_gpu(model: ModelSpec, tp: int = 1, dp: int = 1, enable_expert_parallel: bool = False) -> ParamGroups:
    """Weight bytes on the busiest GPU of a replica of tp GPUs (dp of them sharing the experts), by group."""
    b = model.group_bytes()
    padded = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    vocab = math.ceil(padded / tp) / model.vocab_size
    moe_ranks = tp * dp
    if enable_expert_parallel and model.moe:
        experts = b.experts * math.ceil(model.moe.n_routed_experts / moe_ranks) / model.moe.n_routed_experts
    else:
        experts = b.experts / moe_ranks
    return ParamGroups(embed=b.embed * vocab, lm_head=b.lm_head * vocab, attn=b.attn / tp,
                       attn_kv=b.attn_kv / min(tp, model.num_key_value_heads), attn_replicated=b.attn_replicated,
                       dense_mlp=b.dense_mlp / tp, shared_experts=b.shared_experts / tp, experts=experts,
                       small=b.small, encoder=b.encoder / tp)
