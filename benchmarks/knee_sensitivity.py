"""Near saturation: how the predicted knee moves when every step cost moves by ±5%.

    python benchmarks/knee_sensitivity.py > benchmarks/results/knee_sensitivity.md

For each scenario: the load swept up to the knee (TTFT and TPOT at the SLO's percentile, fractions of
the knee), the knee searched (one seed, the plan's search) with every step priced x0.95, x1.00 and
x1.05 (`backend.step_time_scale`), the knee's elasticity to the step cost, and what `kvsim plan`
answers with the margin it carries (kvsim/planning/sensitivity.py): the safe rate checked with steps
5% dearer, and the knee's 95% interval widened by the ±5% knees. A scenario vLLM sustains should not
tip into overload because of a small step-time error: the safe rate is where it does not.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.planning.capacity import capacity_search, plan  # noqa: E402
from kvsim.planning.executors import InlineExecutor  # noqa: E402
from kvsim.planning.points import base_rate, evaluate_point  # noqa: E402
from kvsim.planning.sensitivity import STEP_COST_MARGIN, with_step_scale  # noqa: E402
from kvsim.scenario.config import scenario_from_dict  # noqa: E402

REQUESTS = 2000
SCALES = (1.0 - STEP_COST_MARGIN, 1.0, 1.0 + STEP_COST_MARGIN)
FRACTIONS = (0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1)


def scenario(name: str, model: str, tp: int, prompt: dict, output: dict, slo: dict, rate: float, **engine):
    return scenario_from_dict({
        "name": name, "model": {"name": model}, "hardware": {"gpu": "H100-SXM", "tensor_parallel_size": tp},
        "engine": {"max_model_len": 8192, **engine}, "policies": [{"name": "paged"}],
        "workload": {"seed": 1, "num_requests": REQUESTS, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": prompt, "output_len": output},
        "slo": slo, "output": {"report_html": False}}, f"<{name}>", ROOT)


def cases() -> list:
    chat_in = {"dist": "lognormal", "mean": 800, "sigma": 0.9, "max": 6000}
    chat_out = {"dist": "lognormal", "mean": 220, "sigma": 0.8, "max": 1500}
    return [
        scenario("8B-chat-TTFT", "Llama-3.1-8B", 1, chat_in, chat_out,
                 {"ttft_ms": 500, "tpot_ms": None, "percentile": 99}, 10.0),
        scenario("8B-chat-TPOT", "Llama-3.1-8B", 1, chat_in, chat_out,
                 {"ttft_ms": None, "tpot_ms": 30, "percentile": 99}, 10.0),
        scenario("70B-TP4-sharegpt", "Llama-3.1-70B", 4, {"dist": "lognormal", "mean": 230, "sigma": 1.0, "max": 1024},
                 {"dist": "lognormal", "mean": 200, "sigma": 1.0, "max": 1024},
                 {"ttft_ms": 1000, "tpot_ms": 60, "percentile": 99}, 4.0),
        scenario("8B-long-prompts-KV", "Llama-3.1-8B", 1, {"dist": "lognormal", "mean": 4000, "sigma": 0.5, "max": 7000},
                 {"dist": "lognormal", "mean": 400, "sigma": 0.6, "max": 1000},
                 {"ttft_ms": 3000, "tpot_ms": None, "percentile": 99}, 2.0, max_num_seqs=64),
    ]


def knee(sc, scale: float) -> tuple[float, str]:
    answers, _ = capacity_search(InlineExecutor(), sc, ["paged"], [sc.workload.seed], 0.01, lambda *a: None,
                                 start=base_rate(sc), num_requests=lambda label: REQUESTS, confirm=False,
                                 overrides_of=lambda label: with_step_scale(None, scale))
    return answers[0].mean_rate, answers[0].binding or "–"


def main() -> None:
    t0 = time.perf_counter()
    print(__doc__.split("\n\n", 1)[1].split("\n\n")[0].replace("\n", " ") + "\n")
    summary, sweeps = [], []
    for sc in cases():
        knees = {s: knee(sc, s) for s in SCALES}
        k0, binding = knees[1.0]
        p = plan(sc, seeds=3, resolution=0.02, num_requests=REQUESTS, executor=InlineExecutor()).policies[0]
        summary.append((sc.name, binding, *(knees[s][0] for s in SCALES), k0, p))
        for f in FRACTIONS:
            rec = evaluate_point(sc, "paged", k0 * f, sc.workload.seed, REQUESTS)
            sweeps.append((sc.name, f, k0 * f, rec))
    print("| scenario | binds at the knee | knee x0.95 steps | knee x1.00 | knee x1.05 | knee moves (-5% / +5% cost) "
          "| elasticity | plan: safe rate (steps +5%) | plan: knee, widened 95% CI | safe / knee |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, binding, fast, mid, slow, k0, p in summary:
        el = ((slow / mid) - (fast / mid)) / (2 * STEP_COST_MARGIN)
        print(f"| {name} | {binding} | {fast:.3g} | {mid:.3g} | {slow:.3g} | {fast / mid - 1:+.1%} / {slow / mid - 1:+.1%} "
              f"| {el:+.2f} | {p.safe_rate:.3g} | {p.mean_rate:.3g} ({p.ci_low:.3g}–{p.ci_high:.3g}) "
              f"| {p.safe_rate / p.mean_rate:.2f} |")
    print("\nThe load swept up to the knee (x1.00 steps; one seed, {REQUESTS:,} requests):\n".replace("{REQUESTS:,}",
                                                                                                  f"{REQUESTS:,}"))
    print("| scenario | rate / knee | req/s | sustainable | TTFT p99 ms | TPOT p99 ms | backlog | binds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, f, rate, r in sweeps:
        ttft, tpot = r["ttft_p99_ms"], r["tpot_p99_ms"]
        print(f"| {name} | {f:.2f} | {rate:.3g} | {'yes' if r['sustainable'] else 'no'} | "
              f"{'–' if ttft is None else f'{ttft:,.0f}'} | {'–' if tpot is None else f'{tpot:.1f}'} | "
              f"{r['backlog_fraction']:.0%} | {r['binding']} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
