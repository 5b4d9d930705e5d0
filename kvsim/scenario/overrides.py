"""`--set dotted.key=value` overrides, applied to a scenario's TOML data before it is validated.

A key is a dotted path into the scenario's tables: `engine.max_num_seqs`, `workload.arrival.rate`,
`hardware.gpu`. Policies are addressed by name (`policies.paged.kv_cache_dtype`), by index
(`policies.0.kv_cache_dtype`) or all at once (`policies.*.enable_prefix_caching`). A value is read
as a TOML value (`8`, `0.5`, `true`, `"fp8"`, `[1, 2]`, `{ process = "poisson", rate = 4.0 }`); a
bare word that is not one (`H200`, `fp8`) is taken as a string. Missing tables on the way are
created, so `--set workload.prefix.num_groups=4` adds a `[workload.prefix]` table. The result goes
through the same strict schema as the file itself, so a bad key or value is one line naming it.
"""

from __future__ import annotations

import copy
import sys
from typing import Iterable

from kvsim.errors import KvsimError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_value(text: str):
    """A TOML value, or the text itself when it is not one (a bare word)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except RecursionError:
        raise KvsimError(f"--set: cannot read value {text[:40]!r}...: nested too deeply") from None
    except tomllib.TOMLDecodeError:
        stripped = text.strip()
        if not stripped or any(c in stripped for c in "[]{}\"'=\n"):
            raise KvsimError(f"--set: cannot read value {text!r} (a TOML value such as 8, 0.5, true, "
                             f"\"fp8\" or [1, 2])") from None
        return stripped
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise KvsimError(f"--set: cannot read value {text[:40]!r}...: integer too long") from None


def parse_override(text: str) -> tuple[list[str], object]:
    """`dotted.key=value` as (key parts, value)."""
    if not isinstance(text, str):
        raise KvsimError(f"--set: expected a 'dotted.key=value' string, got {type(text).__name__} {str(text)[:40]}")
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts) or len(parts) > 8:
        raise KvsimError(f"--set {text[:80]}: expected dotted.key=value (at most 8 parts), "
                         f"e.g. engine.max_num_seqs=128")
    return [p.strip() for p in parts], parse_value(raw)


def _policy_tables(policies: list, part: str, key: str) -> list[dict]:
    if part == "*":
        return policies
    if part.isdigit():
        if int(part) >= len(policies):
            raise KvsimError(f"--set {key}: the scenario has {len(policies)} policies (index {part} is out of range)")
        return [policies[int(part)]]
    named = [p for p in policies if isinstance(p, dict) and p.get("name") == part]
    if not named:
        names = ", ".join(str(p.get("name")) for p in policies if isinstance(p, dict))
        raise KvsimError(f"--set {key}: no policy named {part!r} (policies: {names})")
    return named


def _set(table: dict, parts: list[str], value, key: str) -> None:
    head, rest = parts[0], parts[1:]
    if head == "policies" and rest:
        policies = table.get("policies")
        if not isinstance(policies, list):
            raise KvsimError(f"--set {key}: the scenario has no [[policies]]")
        if len(rest) == 1:
            raise KvsimError(f"--set {key}: name a policy key, e.g. policies.{rest[0]}.kv_cache_dtype")
        for policy in _policy_tables(policies, rest[0], key):
            _set(policy, rest[1:], value, key)
        return
    if not rest:
        table[head] = copy.deepcopy(value)
        return
    child = table.setdefault(head, {})
    if not isinstance(child, dict):
        raise KvsimError(f"--set {key}: {head} is a value, not a table")
    _set(child, rest, value, key)


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """A copy of scenario data with each `dotted.key=value` applied in order."""
    if isinstance(overrides, str):
        raise KvsimError(f"--set: expected a list of 'dotted.key=value' strings, got the string {overrides[:40]!r}")
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        _set(out, parts, value, text.partition("=")[0].strip())
    return out
