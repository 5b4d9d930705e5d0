"""Scenario schema fields as widgets: a dotted key (`engine.max_num_seqs`) names its pydantic field,
whose type picks the widget and whose description, default and bounds are the widget's help.

Nothing here knows a field by name: a new field, bound or description in kvsim/scenario/config.py
shows up in the dashboard as it is.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kvsim.scenario.config import Scenario


@dataclass(frozen=True, slots=True)
class Field:
    """One scenario key's field: the type it holds (Optional and Annotated unwrapped) and its bounds."""

    key: str
    info: FieldInfo
    kind: type  # int, float, bool, str, or typing.Literal for a choice
    choices: tuple = ()  # the Literal's values
    optional: bool = False  # None is a value (the key may be left out)
    bounds: tuple = ()  # (("gt", 0), ("le", 1), ...)

    @property
    def default(self):
        return None if self.info.default is PydanticUndefined else self.info.default

    def minimum(self):
        """The smallest value a widget should offer (an open bound `gt` rounds up for integers)."""
        b = dict(self.bounds)
        if "ge" in b:
            return b["ge"]
        if "gt" in b:
            return b["gt"] + 1 if self.kind is int else b["gt"]
        return None

    def maximum(self):
        b = dict(self.bounds)
        if "le" in b:
            return b["le"]
        if "lt" in b:
            return b["lt"] - 1 if self.kind is int else b["lt"]
        return None


def _unwrap(annotation) -> tuple[object, bool, list]:
    """(inner type, optional, constraint objects) of `Optional[Annotated[T, Field(...)]]` and the like."""
    optional, metadata = False, []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = get_args(annotation)
            for m in extra:
                metadata.extend(getattr(m, "metadata", None) or [m])
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(get_args(annotation))
            if len(args) != 1:
                return annotation, optional, metadata
            annotation = args[0]
        else:
            return annotation, optional, metadata


def scalar_fields(section: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a schema section that one widget can set (not sub-tables or lists)."""
    return tuple(name for name, info in section.model_fields.items()
                 if _section(info.annotation) is None and get_origin(_unwrap(info.annotation)[0]) is not list)


def _section(annotation) -> type[BaseModel] | None:
    inner, _, _ = _unwrap(annotation)
    if get_origin(inner) is list:
        inner, _, _ = _unwrap(get_args(inner)[0])
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def field(key: str) -> Field:
    """The schema field of a dotted scenario key; policies are addressed as `policies.<index>.<key>`."""
    model: type[BaseModel] = Scenario
    parts = key.split(".")
    i = 0
    while True:
        info = model.model_fields[parts[i]]
        if i == len(parts) - 1:
            break
        model = _section(info.annotation)
        i += 2 if parts[i] == "policies" else 1  # skip the policy index
    inner, optional, metadata = _unwrap(info.annotation)
    metadata += list(info.metadata)
    bounds = tuple((b, getattr(m, b)) for m in metadata for b in ("gt", "ge", "lt", "le")
                   if getattr(m, b, None) is not None)
    if get_origin(inner) is Literal:
        return Field(key, info, typing.Literal, get_args(inner), optional, bounds)
    return Field(key, info, inner if inner in (int, float, bool) else str, (), optional, bounds)


_SIGNS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
JS_MAX_INT = 2**53 - 1  # the browser's largest exact integer: a number input cannot offer more


def _fmt(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, BaseModel):
        return "a table"
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"


def help_text(key: str) -> str:
    """The widget help for a scenario key: the field's description (when the schema has one), its
    default, bounds or choices, and the key to give `--set` or write in the TOML file."""
    f = field(key)
    lines = [f.info.description.strip()] if f.info.description else []
    facts = ["Default: " + ("unset (leave empty)" if f.default is None and f.optional else _fmt(f.default))]
    if f.choices:
        facts.append("one of " + ", ".join(_fmt(c) for c in f.choices))
    if f.bounds:
        facts.append("range " + ", ".join(f"{_SIGNS[b]} {_fmt(v)}" for b, v in f.bounds))
    lines.append("; ".join(facts) + ".")
    lines.append(f"Scenario key `{_generic(key)}`.")
    return "  \n".join(lines)


def _generic(key: str) -> str:
    """`policies.3.allocator` as `policies.<name>.allocator`."""
    parts = key.split(".")
    if parts[0] == "policies" and len(parts) > 2:
        parts[1] = "<name>"
    return ".".join(parts)


def widget(container, key: str, value, *, widget_key: str, label: str | None = None, options=None,
           step=None, format_func=None):
    """A widget for scenario `key` showing `value`, with the field's help; returns the widget's value.

    bool: checkbox; a choice (or `options`): selectbox; int and float: number input within the
    field's bounds, empty allowed when the field may be None."""
    f = field(key)
    label = label or key.rsplit(".", 1)[-1]
    helptext = help_text(key)
    if options is not None or f.kind is typing.Literal or (f.kind is bool and f.optional):
        opts = list(options if options is not None else f.choices or (True, False))
        if f.optional and None not in opts:
            opts.insert(0, None)
        if value not in opts:
            opts.append(value)
        fmt = format_func or (lambda v: "(default)" if v is None else str(v))
        return container.selectbox(label, opts, index=opts.index(value), key=widget_key, help=helptext,
                                   format_func=fmt)
    if f.kind is bool:
        return container.checkbox(label, value=bool(value), key=widget_key, help=helptext)
    if f.kind in (int, float):
        cast = f.kind
        lo, hi = (None if b is None or (cast is int and abs(b) > JS_MAX_INT) else cast(b)  # the schema checks it
                  for b in (f.minimum(), f.maximum()))
        kwargs = {"min_value": lo, "max_value": hi}
        if cast is int:
            kwargs["step"] = step or 1
        else:
            kwargs["step"] = float(step or 0.1)
            kwargs["format"] = "%g"
        shown = None if value is None else cast(value)
        if shown is not None and kwargs["min_value"] is not None and shown < kwargs["min_value"]:
            kwargs["min_value"] = shown  # the schema rejects it with a one-line error; the widget must not
        if shown is not None and kwargs["max_value"] is not None and shown > kwargs["max_value"]:
            kwargs["max_value"] = shown
        return container.number_input(label, value=shown, key=widget_key, help=helptext, **kwargs)
    return container.text_input(label, value="" if value is None else str(value), key=widget_key,
                                help=helptext) or None
