"""`kvsim plan --tune`: the engine settings that raise a policy's safe rate, as vLLM's flags
`--max-num-seqs` and `--max-num-batched-tokens`.

The search follows the binding constraint at the knee (kvsim/results/verdict.py), one setting at a
time: when `max_num_seqs` binds, the policy is planned again with twice as many sequences; when the
token budget binds, with twice `max_num_batched_tokens`; when the decoding pace binds with chunked
prefill (step time, compute or bandwidth, and TPOT or ITL the tightest figure), with half the budget
(shorter prefill chunks in each mixed step). A change is kept only when the safe rate rises by more
than the search resolution; the search stops when none is kept, when something no engine setting
moves binds (the KV cache, rejections), at the caps (`MAX_SEQS`, `MAX_TOKENS`, `MIN_TOKENS`), or after
`MAX_STEPS` changes. Every candidate is a full plan of that policy (all seeds, the safe rate's long
run), started from the safe rate it must beat; every policy is tuned side by side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

MAX_STEPS = 4
MAX_SEQS = 4096
MAX_TOKENS = 65536
MIN_TOKENS = 512


@dataclass(slots=True)
class Tuned:
    """A policy's best engine settings found, against its defaults."""

    policy: str
    max_num_seqs: int
    max_num_batched_tokens: int
    safe_rate: float
    baseline_safe_rate: float  # at the scenario's settings
    binding: Optional[str]
    binding_detail: Optional[str]
    enable_chunked_prefill: bool
    tried: list = field(default_factory=list)  # {max_num_seqs, max_num_batched_tokens, safe_rate, binding, kept}

    @property
    def gain(self) -> float:
        return self.safe_rate / self.baseline_safe_rate - 1 if self.baseline_safe_rate else float("inf")

    def flags(self) -> str:
        """The settings as `vllm serve` flags."""
        out = f"--max-num-seqs {self.max_num_seqs} --max-num-batched-tokens {self.max_num_batched_tokens}"
        return out + (" --enable-chunked-prefill" if self.enable_chunked_prefill else " --no-enable-chunked-prefill")

    def as_dict(self) -> dict:
        return {**asdict(self), "gain": self.gain, "vllm_flags": self.flags()}


def next_setting(binding: Optional[str], pace: bool, chunked: bool, seqs: int, tokens: int) -> Optional[tuple[int, int]]:
    """The one change the binding constraint suggests, or None."""
    if binding == "max_num_seqs" and seqs < MAX_SEQS:
        return min(MAX_SEQS, 2 * seqs), tokens
    if binding == "token_budget" and tokens < MAX_TOKENS:
        return seqs, min(MAX_TOKENS, 2 * tokens)
    if binding in ("step_time", "compute", "bandwidth") and pace and chunked and tokens > MIN_TOKENS:
        return seqs, max(MIN_TOKENS, tokens // 2)
    return None


def _pace_binds(answer) -> bool:
    """The binding detail says the decoding pace was the tightest figure (verdict.binding_constraint)."""
    return "decoding pace" in (answer.binding_detail or "")


def tune(executor, scenario, answers: list, seeds: list[int], resolution: float, num_requests: int, trace_rate,
         tick, capacity_search: Callable) -> tuple[list[Tuned], list[dict]]:
    """Each answered policy's best max_num_seqs and max_num_batched_tokens (module docstring); the
    tuning and the point rows of every candidate planned. `capacity_search`: the plan's search
    (kvsim.planning.capacity, which calls this module)."""
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.scenario.defaults import engine_limits

    model, gpu = model_spec(scenario), gpu_spec(scenario)
    policies = {p.name: p for p in scenario.policies}
    state = {}
    for a in answers:
        lim = engine_limits(scenario, policies[a.policy], model, gpu)
        state[a.policy] = (Tuned(a.policy, lim.max_num_seqs, lim.max_num_batched_tokens, a.safe_rate, a.safe_rate,
                                 a.binding, a.binding_detail, lim.enable_chunked_prefill), a)
    rows: list[dict] = []
    for _ in range(MAX_STEPS):
        labels = []
        for name, (t, a) in state.items():
            change = next_setting(a.binding, _pace_binds(a), t.enable_chunked_prefill, t.max_num_seqs,
                                  t.max_num_batched_tokens) if a.safe_rate > 0 else None
            if change is not None:
                labels.append((name, *change))
        if not labels:
            break
        found, points = capacity_search(
            executor, scenario, labels, seeds, resolution, tick, start=min(state[lb[0]][0].safe_rate for lb in labels),
            start_of=lambda label: state[label[0]][0].safe_rate, num_requests=lambda label: num_requests,
            trace_rate=trace_rate, policy_of=lambda label: label[0],
            overrides_of=lambda label: {"engine": {"max_num_seqs": label[1]},
                                        "policies": {"max_num_batched_tokens": label[2]}})
        for row in points:
            name, seqs, tokens = row["policy"]
            row.update(policy=name, phase=f"tune_{row['phase']}", max_num_seqs=seqs, max_num_batched_tokens=tokens)
        rows += points
        for (name, seqs, tokens), answer in zip(labels, found):
            t, _ = state[name]
            kept = answer.safe_rate > t.safe_rate * (1 + resolution)
            t.tried.append({"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "safe_rate": answer.safe_rate,
                            "binding": answer.binding, "kept": kept})
            if kept:
                t.max_num_seqs, t.max_num_batched_tokens, t.safe_rate = seqs, tokens, answer.safe_rate
                t.binding, t.binding_detail = answer.binding, answer.binding_detail
                state[name] = (t, answer)
            else:
                state[name] = (t, _Stop())
    return [t for t, _ in state.values()], rows


class _Stop:
    """A policy whose last change was not kept: nothing more to try."""

    binding = None
    binding_detail = None
    safe_rate = 0.0
