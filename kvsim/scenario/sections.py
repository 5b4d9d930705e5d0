"""The base of every scenario section: strict, closed, frozen, finite.

Each `[section]` of a scenario is a pydantic model deriving from `Section`: unknown keys are refused
(`extra="forbid"`), values keep their TOML types (`strict`: "1" is not 1), a validated section never
changes (`frozen`) and no number is infinite or NaN. kvsim/scenario/config.py assembles the sections;
modules that define sections of their own (kvsim/scenario/load_curve.py, autoscaling.py) derive from it too.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
