"""Speculative decoding against hand-computable figures, and KV slots against vLLM's allocation.

    python benchmarks/spec_hand.py       # writes benchmarks/results/spec_hand.{md,json}

1. Tokens a step. With i.i.d. acceptance a and k drafts a step yields E = (1 - a^(k+1)) / (1 - a)
   tokens; with per-position rates p_i (p_i the chance the first i drafts are all accepted, what vLLM
   reports per position) E = 1 + p_1 + ... + p_k, and for an n-gram lookup that proposes on a share q
   of the steps E = 1 + q (p_1 + ... + p_k) over all steps. Each case simulates 200 requests of 2,000
   output tokens (Llama-3.1-8B, one H100) and compares the simulated mean (vLLM's mean acceptance
   length over the proposing steps; tokens per step over all for n-gram) with E. The last step of a
   request can be cut by its max_tokens, which the closed form ignores: a bias of about
   (E[gain^2] / E[gain] - E[gain]) / (2 x steps per request), under 0.3% here.
2. KV slots. Every step of every sequence, step by step (no fused runs), the blocks a sequence holds
   equal ceil(max over its steps so far of min(computed + scheduled + lookahead, max_model_len) / 16):
   never more than vLLM's allocate_slots gives; counted over the run (the check of
   tests/test_speculative.py, over more requests).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [
    ("iid a=0.5 k=1", {"method": "eagle3", "num_speculative_tokens": 1, "acceptance_rate": 0.5}),
    ("iid a=0.6 k=3", {"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.6}),
    ("iid a=0.8 k=5", {"method": "eagle3", "num_speculative_tokens": 5, "acceptance_rate": 0.8}),
    ("iid a=0.9 k=8", {"method": "eagle", "num_speculative_tokens": 8, "acceptance_rate": 0.9}),
    ("per position eagle ShareGPT k=3", {"method": "eagle", "num_speculative_tokens": 3, "dataset": "sharegpt"}),
    ("per position mtp GPQA k=3", {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": [0.92, 0.68, 0.38]}),
    ("ngram q=0.4, per position k=4", {"method": "ngram", "num_speculative_tokens": 4, "proposal_rate": 0.4,
                                        "acceptance": [0.7, 0.5, 0.35, 0.2]}),
]


def scenario(spec: dict):
    from kvsim.scenario.config import scenario_from_dict

    return scenario_from_dict({
        "name": "hand", "model": {"name": "Llama-3.1-8B"}, "hardware": {"gpu": "H100-SXM"},
        "engine": {"max_model_len": 4096}, "policies": [{"name": "spec"}], "speculative": spec,
        "workload": {"seed": 2, "num_requests": 200, "arrival": {"process": "poisson", "rate": 2.0},
                     "prompt_len": {"dist": "fixed", "value": 300}, "output_len": {"dist": "fixed", "value": 2000}},
        "output": {"report_html": False}})


def position_rates(spec: dict) -> list[float]:
    """p_i, the chance that drafts 1..i are all accepted."""
    from kvsim.perf.acceptance import preset_rates

    k = spec["num_speculative_tokens"]
    if "acceptance_rate" in spec:
        return [spec["acceptance_rate"] ** i for i in range(1, k + 1)]
    return list((spec.get("acceptance") or preset_rates(spec["method"], spec["dataset"], k).rates)[:k])


def closed_form(spec: dict) -> tuple[float, float]:
    """(E over proposing steps, E over all steps); for i.i.d. a, 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    k = spec["num_speculative_tokens"]
    if "acceptance_rate" in spec:
        a = spec["acceptance_rate"]
        return (1 - a ** (k + 1)) / (1 - a), (1 - a ** (k + 1)) / (1 - a)
    rates, q = position_rates(spec), spec.get("proposal_rate", 1.0)
    return 1 + sum(rates), 1 + q * sum(rates)


def standard_error(spec: dict, steps: int) -> float:
    """Of the mean over `steps` proposing steps: Var(accepted) = sum (2i - 1) p_i - (sum p_i)^2."""
    rates = position_rates(spec)
    var = sum((2 * i - 1) * p for i, p in enumerate(rates, 1)) - sum(rates) ** 2
    return math.sqrt(var / steps)


def kv_check() -> int:
    """Step by step (no fusion), the blocks each scheduled sequence holds against vLLM's bound."""
    from kvsim.backends.analytic import AnalyticBackend
    from kvsim.engine.speculative import SpecScheduler
    from kvsim.pipeline import run_scenario

    checked, most = [0], {}
    schedule = SpecScheduler.schedule

    def check(self):
        batch = schedule(self)
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            look = 0 if s in self.admitted else self.speculator.lookahead
            slots = max(min(s.num_computed_tokens + n + look, self.max_model_len),
                        most.get(s, 0) if s.num_computed_tokens else 0)
            most[s] = slots
            assert len(s.block_table) == math.ceil(slots / 16), (s.seq_id, len(s.block_table), slots)
            checked[0] += 1
        return batch

    SpecScheduler.schedule, AnalyticBackend.fuses_decode_runs = check, False
    try:
        sc = scenario({"method": "eagle3", "num_speculative_tokens": 4})
        run_scenario(sc.model_copy(update={"workload": sc.workload.model_copy(update={"num_requests": 60})}),
                     write=False)
    finally:
        SpecScheduler.schedule, AnalyticBackend.fuses_decode_runs = schedule, True
    return checked[0]


def main() -> None:
    from kvsim.pipeline import run_scenario

    rows = []
    for name, spec in CASES:
        s = run_scenario(scenario(spec), write=False).summaries["spec"]
        sp = s["speculative"]
        proposing, every = closed_form(spec)
        steps = s["engine_steps"]
        rows.append({"case": name, "closed_form_proposing": proposing, "simulated_proposing": sp["mean_acceptance_length"],
                     "error": sp["mean_acceptance_length"] / proposing - 1, "closed_form_all_steps": every,
                     "simulated_all_steps": sp["tokens_per_sequence_step"],
                     "standard_error": standard_error(spec, sp["num_drafts"]),
                     "draft_steps": sp["num_drafts"], "sequence_steps": sp["num_sequence_steps"], "engine_steps": steps})
        print(rows[-1], flush=True)
    slots = kv_check()
    out = ROOT / "benchmarks" / "results"
    (out / "spec_hand.json").write_text(json.dumps({"tokens_per_step": rows, "kv_steps_checked": slots}, indent=1) + "\n")
    lines = ["| case | closed form (proposing steps) | simulated | error | in standard errors | closed form (all steps) | "
             "simulated (all) | drafting steps |", "|" + " --- |" * 8]
    for r in rows:
        lines.append(f"| {r['case']} | {r['closed_form_proposing']:.4f} | {r['simulated_proposing']:.4f} | "
                     f"{r['error']:+.2%} | {(r['simulated_proposing'] - r['closed_form_proposing']) / r['standard_error']:+.1f} | "
                     f"{r['closed_form_all_steps']:.4f} | {r['simulated_all_steps']:.4f} | "
                     f"{r['draft_steps']:,} |")
    lines.append(f"\nKV slots: {slots:,} scheduled sequence-steps checked step by step; every one held exactly "
                 "the blocks of vLLM's allocate_slots bound (none more).")
    (out / "spec_hand.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
