"""How a plan's answers stand up to an error in the step price.

Near saturation a small step-time error moves the knee: the queue grows whenever the engine's
service rate falls below the arrival rate, so a step priced 5% too fast promises a knee about 5%
too high (more where the SLO is a TTFT tail). `benchmarks/knee_sensitivity.py` measures how far the
knee moves when every step cost moves by STEP_COST_MARGIN; the planner carries it twice:

- the safe rate is checked with every step STEP_COST_MARGIN slower than priced
  (`backend.step_time_scale` = 1 + margin on every safe-check point; `check_scale`), so the headline
  survives the pricing error rather than sitting on the knee's edge;
- `plan` re-searches the first seed's knee with steps STEP_COST_MARGIN faster and slower (from the
  knee it found, `KNEE_GROWTH` a step) and widens each answer's 95% interval by the ratios
  (`widen`): [ci_low x slow / k0, ci_high x fast / k0].

Both need a backend whose steps can be scaled (the analytic one); the triton backend's steps are
timed on the device, and its answers are left as they are.
"""

from __future__ import annotations

STEP_COST_MARGIN = 0.05
KNEE_GROWTH = 1.0 + 2 * STEP_COST_MARGIN  # the re-search's step up from the knee it starts at


def scalable(scenario) -> bool:
    return scenario.backend.name == "analytic"


def check_scale(scenario) -> float:
    """The step_time_scale the safe rate is checked at (1.0 where steps cannot be scaled)."""
    return 1.0 + STEP_COST_MARGIN if scalable(scenario) else 1.0


def with_step_scale(overrides: dict | None, scale: float) -> dict | None:
    """`overrides` (kvsim.planning.points.at_load's section updates) with backend.step_time_scale set."""
    if scale == 1.0:
        return overrides
    out = dict(overrides or {})
    out["backend"] = {**(out.get("backend") or {}), "step_time_scale": scale}
    return out


def widen(answer, k0: float, fast: float, slow: float) -> None:
    """Record the knees at faster and slower steps on `answer` (a PolicyCapacity) and widen its 95%
    interval by their ratios to the knee k0 they were searched from (the same seed's)."""
    answer.knee_faster_steps, answer.knee_slower_steps = fast, slow
    if k0 > 0:
        answer.ci_low = min(answer.ci_low, answer.ci_low * slow / k0)
        answer.ci_high = max(answer.ci_high, answer.ci_high * fast / k0)
