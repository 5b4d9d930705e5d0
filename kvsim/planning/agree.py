"""Do two capacity answers agree? The fast search (early stops, guided seeds) against `--exhaustive`.

`differences(fast, full)` compares two answers of one kind (`PlanResult`, `DeployResult`, `PDPlan`)
and lists, one line each, what a user would act on that differs: a policy's (or deployment's) safe
rate beyond `RATE_TOLERANCE`, its binding constraint, the deployment chosen (GPU, layout, replicas,
policy) and its cost. An empty list: the same answer. benchmarks/plan_speed.py and tests/test_fast_plan.py
read it.
"""

from __future__ import annotations

RATE_TOLERANCE = 0.01  # relative


def _rate(a: float, b: float) -> bool:
    return abs(a - b) <= RATE_TOLERANCE * max(abs(a), abs(b), 1e-12)


def plan_differences(fast, full) -> list[str]:
    out = []
    theirs = {p.policy: p for p in full.policies}
    for p in fast.policies:
        q = theirs.get(p.policy)
        if q is None:
            out.append(f"{p.policy}: not in the exhaustive plan")
            continue
        if not _rate(p.safe_rate, q.safe_rate):
            out.append(f"{p.policy}: safe rate {p.safe_rate:.4g} vs {q.safe_rate:.4g}")
        if p.binding != q.binding:
            out.append(f"{p.policy}: binding {p.binding} vs {q.binding}")
    best_fast = max(fast.policies, key=lambda p: p.safe_rate, default=None)
    best_full = max(full.policies, key=lambda p: p.safe_rate, default=None)
    if best_fast is not None and best_full is not None and best_fast.safe_rate != best_full.safe_rate \
            and best_fast.policy != best_full.policy:
        out.append(f"best policy {best_fast.policy} vs {best_full.policy}")
    return out


def _deployment(d) -> tuple:
    return (d.gpu, d.tensor_parallel_size, d.data_parallel_size, d.num_replicas, d.policy, round(d.usd_per_hour, 6))


def deploy_differences(fast, full) -> list[str]:
    out = []
    mine, theirs = [_deployment(d) for d in fast.deployments], [_deployment(d) for d in full.deployments]
    if mine[:1] != theirs[:1]:
        out.append(f"winner {mine[:1]} vs {theirs[:1]}")
    if mine != theirs:
        out.append(f"deployments listed {mine} vs {theirs}")
    for d, e in zip(fast.deployments, full.deployments):
        if _deployment(d) != _deployment(e):
            continue
        if (d.safe_rate is None) != (e.safe_rate is None) or (d.safe_rate is not None and not _rate(d.safe_rate,
                                                                                                     e.safe_rate)):
            out.append(f"{d.label}: safe rate {d.safe_rate} vs {e.safe_rate}")
        if d.binding != e.binding:
            out.append(f"{d.label}: binding {d.binding} vs {e.binding}")
    return out


def pd_differences(fast, full) -> list[str]:
    def key(d):
        return (d.prefill_gpu, d.prefill_tp, d.num_prefill, d.decode_gpu, d.decode_tp, d.num_decode, d.policy,
                round(d.usd_per_hour, 6), d.prefill_binding, d.decode_binding)

    out = []
    mine, theirs = [key(d) for d in fast.deployments], [key(d) for d in full.deployments]
    if mine[:1] != theirs[:1]:
        out.append(f"P:D winner {mine[:1]} vs {theirs[:1]}")
    elif mine != theirs:
        out.append(f"P:D deployments {mine} vs {theirs}")
    return out + [f"aggregated: {line}" for line in deploy_differences(fast.aggregated, full.aggregated)]


def differences(fast, full) -> list[str]:
    """What differs between two answers of one kind (module docstring)."""
    if hasattr(fast, "policies"):
        return plan_differences(fast, full)
    if hasattr(fast, "aggregated"):
        return pd_differences(fast, full)
    return deploy_differences(fast, full)
