"""Mixture-of-experts routing as a step's price sees it: how many experts a step's tokens touch (whose
weights it streams) and how much more than its share the busiest expert-parallel GPU computes.

Balanced routing (skew 0): each token picks its top_k of E experts uniformly at random, so T tokens
touch E x (1 - (1 - k/E)^T) experts and every GPU gets its share. Skewed routing (a power law of
exponent a >= 1, AIConfigurator's `power_law_a` routing, collector/helper.py `power_law_logits_v3`):
the tokens per expert are E draws of a power law on [1, 0.8 T] (on [0.01, 2] when T k <= E), scaled to
T k in all. Here the draws are their expected order statistics (the quantiles at (i + 1/2) / E), an
expert with L tokens expected is touched with probability 1 - exp(-L), and with experts placed on the
GPUs in order (vLLM's linear placement) of a random popularity, the busiest GPU holds the most popular
expert and the mean of the rest: factor = (L_max + (E/G - 1) x mean other L) / (T k / G).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def _loads(experts: int, top_k: int, tokens: int, skew: float) -> np.ndarray:
    """Expected tokens per expert, largest first."""
    total = tokens * top_k
    if not skew:
        return np.full(experts, total / experts)
    lo, hi = (1.0, max(0.8 * tokens, 1.0 + 1e-9)) if total > experts else (0.01, 2.0)
    u = (np.arange(experts)[::-1] + 0.5) / experts
    if abs(skew - 1.0) < 1e-9:
        q = lo * (hi / lo) ** u
    else:
        a = 1.0 - skew
        q = ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a)
    return np.sort(q / q.sum() * total)[::-1]


@lru_cache(maxsize=4096)
def moe_load(experts: int, top_k: int, tokens: int, skew: float, gpus: int) -> tuple[float, float]:
    """(share of the experts the tokens touch, the busiest of `gpus` expert-parallel GPUs' work over an
    even share: 1 when balanced or when every GPU holds a slice of every expert, gpus = 1)."""
    if tokens <= 0:
        return 0.0, 1.0
    if not skew:
        return 1.0 - (1.0 - top_k / experts) ** tokens, 1.0
    loads = _loads(experts, top_k, tokens, skew)
    touched = float(np.mean(1.0 - np.exp(-loads)))
    if gpus <= 1:
        return touched, 1.0
    per = max(experts // gpus, 1)
    rest = (loads.sum() - loads[0]) / max(experts - 1, 1)
    return touched, float((loads[0] + (per - 1) * rest) / (tokens * top_k / gpus))


def busiest_touched(experts: int, top_k: int, tokens: int, skew: float, gpus: int) -> float:
    """Share of its experts the busiest expert-parallel GPU streams (its top expert and the rest's mean)."""
    touched, _ = moe_load(experts, top_k, tokens, skew, gpus)
    if not skew or gpus <= 1:
        return touched
    per = max(experts // gpus, 1)
    return (1.0 + (per - 1) * touched) / per if per > 1 else 1.0


def expert_parallel_ranks(tp: int, dp: int, expert_parallel: bool) -> int:
    """GPUs the routed experts are spread over whole (1: every GPU holds a slice of every expert)."""
    return tp * dp if expert_parallel else 1


def ring_fraction(workers: int) -> float:
    """Share of a collective's data each GPU sends in a ring all-gather or reduce-scatter."""
    return (workers - 1) / workers if workers > 1 else 0.0
