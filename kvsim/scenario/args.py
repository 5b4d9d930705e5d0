"""The scenario arguments every scenario command takes: `SCENARIO.toml` and repeatable `--set` overrides.

Kept apart from `overrides` (which `config` imports to apply overrides before validation) so that
imports point one way: this module reads scenarios through `config`.
"""

from __future__ import annotations

from pathlib import Path


def add_scenario_arguments(parser) -> None:
    """The SCENARIO argument and repeatable `--set`, for every command that reads a scenario."""
    parser.add_argument("scenario", type=Path, help="scenario TOML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key before validation, e.g. --set engine.max_num_seqs=128 "
                             "or --set policies.paged.kv_cache_dtype=fp8 (repeatable)")


def scenario_from_args(args):
    """The validated scenario named by `args.scenario`, with `args.overrides` applied."""
    from kvsim.scenario.config import load_scenario

    return load_scenario(args.scenario, args.overrides)
