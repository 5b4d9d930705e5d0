"""`kvsim sweep`: a grid of `--set` overrides (or the rows of a CSV), every point simulated, one tidy table.

`--set key=v1,v2,v3` gives an axis (commas inside [...], {...} or quotes do not split); the grid is
every combination, the first axis varying slowest. `--from points.csv` takes the points as rows
(a header of keys, one value per cell). Every point is validated before anything runs. Points run
on the executors of kvsim/planning/executors.py and are collected by index, so the CSV is the same
bytes from one worker, many, or Ray. The table has a row per point × policy: the point's index,
its inputs, the policy and the figures of kvsim/planning/points.py. The HTML page draws each policy's
SLO figures and goodput against the arrival rate (or the first numeric axis).
"""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from kvsim.errors import KvsimError
from kvsim.planning.executors import make_executor, run_all
from kvsim.planning.points import FIGURES, check_fits, simulate
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.files import read_text
from kvsim.scenario.limits import MAX_POINTS
from kvsim.scenario.overrides import apply_overrides, parse_override, parse_value

RATE_KEY = "workload.arrival.rate"


def split_values(text: str) -> list[str]:
    """'1,2,[3, 4],"a,b"' -> ['1', '2', '[3, 4]', '"a,b"'] (top-level commas only)."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def grid_points(sets: list[str]) -> tuple[list[str], list[list[str]]]:
    """(swept keys, points as lists of 'key=value'): the cartesian product of every `--set` axis."""
    axes = []
    for text in sets:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise KvsimError(f"--set {text}: expected dotted.key=value[,value...]")
        values = split_values(raw)
        if any(not v for v in values):
            raise KvsimError(f"--set {text}: empty value")
        axes.append([f"{key.strip()}={v}" for v in values])
    keys = [a[0].partition("=")[0] for a in axes]
    check_count(math.prod(len(a) for a in axes), "--set: the grid")
    return keys, [list(p) for p in itertools.product(*axes)]


def check_count(n: int, what: str) -> None:
    """Refuse a sweep of more than MAX_POINTS points before any is built."""
    if n > MAX_POINTS:
        raise KvsimError(f"{what} has more than {MAX_POINTS:,} points ({n:,}): split the sweep")


def points_from_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """(keys, points) from a CSV file: a header of dotted keys, one point a row."""
    lines = read_text(Path(path), "points file").splitlines()
    check_count(len(lines) - 1, str(path))
    try:
        rows = list(csv.reader(lines))
    except csv.Error as exc:
        raise KvsimError(f"{path}: bad CSV: {exc}") from None
    if not rows or not rows[0]:
        raise KvsimError(f"{path}: empty points file (expected a header of dotted keys)")
    keys = [k.strip() for k in rows[0]]
    if "" in keys:
        raise KvsimError(f"{path}:1: column {keys.index('') + 1} has no key (the header names a dotted key a column)")
    points = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(keys):
            raise KvsimError(f"{path}:{line}: {len(row)} values for {len(keys)} keys")
        empty = next((k for k, v in zip(keys, row) if not v.strip()), None)
        if empty is not None:
            raise KvsimError(f"{path}:{line}: {empty}: empty value (every point gives each key a value)")
        points.append([f"{k}={v.strip()}" for k, v in zip(keys, row)])
    if not points:
        raise KvsimError(f"{path}: no points")
    return keys, points


def point_scenario(scenario, overrides: list[str]):
    """The scenario with a point's overrides applied and validated (one-line error naming the point)."""
    try:
        data = apply_overrides(scenario.model_dump(), overrides)
    except KvsimError as exc:
        raise KvsimError(f"{scenario.source}: {exc}") from None
    return scenario_from_dict(data, f"{scenario.source} with {' '.join(overrides)}", scenario.base_dir)


@dataclass(slots=True)
class SweepResult:
    """`kvsim.sweep`'s answer: a row per point × policy (point, inputs, policy, FIGURES)."""

    scenario: str
    keys: list[str]
    points: list[list[str]]
    rows: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return ["point", *self.keys, "policy", *FIGURES]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)


def sweep(scenario, points: list[list[str]] | dict, *, keys: Optional[list[str]] = None, workers: Optional[int] = None,
          ray: Optional[str] = None, executor=None,
          progress: Optional[Callable[[int, int], None]] = None) -> SweepResult:
    """Simulate every point (a list of 'key=value' overrides, or a dict {key: [values]} for a grid)."""
    if isinstance(points, dict):
        if not all(isinstance(v, (list, tuple)) for v in points.values()):
            raise KvsimError("sweep: a grid maps each dotted key to a list of values")
        keys, points = grid_points([f"{k}={','.join(map(_toml, v))}" for k, v in points.items()])
    elif isinstance(points, str) or not isinstance(points, (list, tuple)) or any(isinstance(p, str) for p in points):
        raise KvsimError("sweep: points must be a {key: [values]} grid or a list of points, each a list of "
                         "'dotted.key=value' strings")
    check_count(len(points), "sweep")
    for p in points:
        for o in p:
            parse_override(o)  # a malformed 'key=value' is one line, before anything runs
    keys = keys or list(dict.fromkeys(o.partition("=")[0].strip() for p in points for o in p))
    scenarios = [point_scenario(scenario, p) for p in points]  # every point validated before any runs
    for sc in scenarios:
        check_fits(sc)
    own = executor is None
    executor = executor or make_executor(workers, ray)
    done = [0]

    def tick(i, _):
        done[0] += 1
        if progress is not None:
            progress(done[0], len(points))

    try:
        results = run_all(executor, simulate, [(sc,) for sc in scenarios], tick)
    finally:
        if own:
            executor.close()
    rows = []
    for i, (p, per_policy) in enumerate(zip(points, results)):
        inputs = {o.partition("=")[0]: _value(o.partition("=")[2]) for o in p}
        for policy, record in per_policy.items():
            rows.append({"point": i, **inputs, "policy": policy, **{k: record[k] for k in FIGURES}})
    meta = {"policy_order": [p.name for p in scenario.policies], "slo": scenario.slo.model_dump()}
    return SweepResult(scenario.name or "scenario", keys, points, rows, meta)


def _value(raw: str):
    value = parse_value(raw)
    return value if isinstance(value, (int, float, str, bool)) else raw.strip()


def _toml(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
