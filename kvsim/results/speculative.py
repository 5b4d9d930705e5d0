"""summary.json's "speculative" section: the plan a policy ran and vLLM's spec-decode figures.

vLLM's `SpecDecodingLogging` (vllm/v1/spec_decode/metrics.py) reports, over the steps that proposed
drafts: the mean acceptance length (1 + accepted / drafts: the tokens a proposing step yields), the
draft acceptance rate (accepted / draft tokens) and the acceptance rate per draft position (steps that
accepted at least i drafts / drafts). The engine's `SpecCounters` hold them per replica; ITL and TPOT
are the metrics' own (a verify step's tokens reach the client as one chunk: vllm bench serve counts
one ITL gap a chunk, and TPOT is (E2E - TTFT) / (output tokens - 1)).
"""

from __future__ import annotations


def speculative_summary(plan, counters: list) -> dict:
    """The plan (kvsim.perf.speculative.SpecPlan.describe) and the replicas' counters summed."""
    total = None
    for c in counters:
        if total is None:
            total = type(c)(c.k)
        total.merge(c)
    drafts, draft_tokens = total.num_drafts, total.num_draft_tokens
    accepted = total.num_accepted_tokens
    return {**plan.describe(),
            "num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
            "num_sequence_steps": total.num_steps,
            "tokens_per_sequence_step": 1 + accepted / total.num_steps if total.num_steps else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "acceptance_rate_per_position": [n / drafts for n in total.accepted_per_pos] if drafts else None}


def speculation_line(policy: str, summary: dict) -> list[str]:
    """The report's line on a policy's speculative decoding (none without it)."""
    s = summary.get("speculative")
    if not s or not s.get("num_drafts"):
        return []
    per = ", ".join(f"{r:.2f}" for r in s["acceptance_rate_per_position"])
    return [f"  {policy}: {s['method']} k={s['num_speculative_tokens']}: {s['mean_acceptance_length']:.2f} tokens a "
            f"step (acceptance by position {per}; {s['acceptance_source']}); ITL counts a step's tokens as one chunk, "
            f"TPOT per token, as vllm bench serve"]
