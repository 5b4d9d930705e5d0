"""Figures on the page: plotly figure dicts (the library's, kvsim.results.figures, and the pages' own)
drawn without Streamlit's theme, so their colours are the report's.

Every log axis is labelled in whole numbers. Left to itself, plotly labels the ticks between decades
as a bare, smaller "2" and "5" (or every digit), which read as values; labelled in full, every digit
crowds the axis, so the ticks are chosen by the decades the axis spans: every digit under 0.7 of one,
1-2-5 up to 3, decades beyond.
"""

from __future__ import annotations

import math
import numbers
import re

import plotly.graph_objects as go
import streamlit as st

LOG_TICKS = ",.3~r"  # d3-format: 3 significant digits, thousands separated, no trailing zeros (200, 5,000, 0.02)
AXIS = re.compile(r"([xy])axis(\d*)$")


def readable(fig: dict) -> dict:
    """A copy of the figure with each log axis that sets no tick labels of its own labelled by LOG_TICKS,
    at ticks its span allows (module docstring)."""
    layout = dict(fig.get("layout") or {})
    for name, axis in layout.items():
        found = AXIS.match(name)
        if found and isinstance(axis, dict) and axis.get("type") == "log" \
                and "tickformat" not in axis and "ticktext" not in axis:
            span = _decades(fig.get("data") or [], axis, *found.groups())
            dtick = {} if span is None or "dtick" in axis else {"dtick": "D1" if span < 0.7 else "D2" if span <= 3 else 1}
            layout[name] = {**axis, "tickformat": LOG_TICKS, **dtick}
    return {**fig, "layout": layout}


def _decades(data: list, axis: dict, letter: str, number: str) -> float | None:
    """How many decades the axis spans: its range, else its traces' positive values; None when unknown."""
    if axis.get("range") and None not in axis["range"]:
        return abs(axis["range"][1] - axis["range"][0])  # a log axis's range is in decades already
    ref = letter + number
    values = [v for t in data if (t.get(f"{letter}axis") or letter) == ref for v in _numbers(t.get(letter))]
    return math.log10(max(values) / min(values)) if values else None


def _numbers(values) -> list[float]:
    if values is None or isinstance(values, (str, dict)):
        return []
    return [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0
            and math.isfinite(v)]


def plot(fig: dict | go.Figure, key: str) -> None:
    """Draw `fig` (a dict, or a Figure: its dict) at `key`."""
    st.plotly_chart(go.Figure(readable(fig.to_dict() if isinstance(fig, go.Figure) else fig)), theme=None, key=key)
