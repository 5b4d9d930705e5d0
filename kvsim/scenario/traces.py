"""Request traces: Azure LLM 2023 CSV, Mooncake JSONL and a generic CSV, parsed once into numpy arrays.

A `Trace` holds one row per request, sorted by arrival (stably, when the file is not already):
`arrival_s` (float64 seconds, the first at 0), `prompt_len` and `output_len` (int64). Mooncake traces
also keep each row's 512-token prefix-block ids, which `Trace.token_ids(row)` expands on demand into
synthetic token ids (the whole trace expanded would take about half a gigabyte).

Formats:
- `azure`: `TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock timestamps such as
  `2023-11-16 18:15:46.6805900`; the first is subtracted. A row with 0 GeneratedTokens is read as 1
  output token (a request always produces at least one token; the 2023 conversation trace has none).
- `mooncake`: one JSON object a line with `timestamp` (ms), `input_length`, `output_length`,
  `hash_ids` (chained 512-token block ids, `len(hash_ids) == ceil(input_length / 512)`).
- `csv`: header `arrival_s,prompt_tokens,output_tokens`, arrival in seconds; or your own log, its
  columns named by `[workload.trace.columns]` (`arrival` in s, ms, us, ns or as datetimes, or left
  out for lengths only; `prompt_tokens`, `output_tokens`).
- `sharegpt`: a ShareGPT-style JSON list of conversations, and `vllm_bench`: a `vllm bench serve
  --save-result --save-detailed` JSON (kvsim/scenario/datasets.py reads both, and the mapped csv).

`sharegpt`, `vllm_bench` and a csv without an arrival column have lengths only (`arrival_s` all 0):
the scenario's arrivals are then synthetic.

Every malformed row raises `KvsimError("<path>:<line>: <reason>")`, lines counted from 1 as an
editor shows them (the CSV header is line 1); a JSON dataset's bad entry names its index
(`<path>: conversation 12: <reason>`).
"""

from __future__ import annotations

import csv
import json
import os
import re
from array import array
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache, wraps
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.files import iter_lines, open_regular
from kvsim.scenario.limits import (MAX_REQUESTS, MAX_TOKENS, MAX_TRACE_BLOCK_IDS, MAX_TRACE_SECONDS, MAX_TRACE_YEAR,
                                   MIN_TRACE_YEAR)
from kvsim.sequence import mix64

VOCAB_SIZE = 32000  # synthetic token ids lie in [0, VOCAB_SIZE)
MOONCAKE_BLOCK_SIZE = 512

_AZURE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")


@dataclass(slots=True, frozen=True)
class Trace:
    """One row per request, in arrival order; arrays are read-only and shared between streams."""

    arrival_s: np.ndarray  # float64, sorted, first 0
    prompt_len: np.ndarray  # int64
    output_len: np.ndarray  # int64
    # Mooncake only: row i's block ids are hash_ids[hash_start[i]:hash_end[i]].
    hash_ids: Optional[np.ndarray] = None
    hash_start: Optional[np.ndarray] = None
    hash_end: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, n: int) -> Trace:
        """The first n rows (views, no copy)."""
        if n >= len(self):
            return self
        if self.hash_ids is None:
            return Trace(self.arrival_s[:n], self.prompt_len[:n], self.output_len[:n])
        return Trace(self.arrival_s[:n], self.prompt_len[:n], self.output_len[:n], self.hash_ids,
                     self.hash_start[:n], self.hash_end[:n])

    def token_ids(self, row: int) -> Optional[np.ndarray]:
        """Row's prompt as synthetic token ids from its block ids (None without block ids)."""
        if self.hash_ids is None:
            return None
        blocks = self.hash_ids[self.hash_start[row]:self.hash_end[row]]
        tokens = block_token_ids(blocks)[: int(self.prompt_len[row])]
        tokens.flags.writeable = False
        return tokens


def block_token_ids(block_ids: np.ndarray, block_size: int = MOONCAKE_BLOCK_SIZE) -> np.ndarray:
    """`block_size` synthetic token ids per block id, concatenated (int32 in [0, VOCAB_SIZE)).

    A token depends only on (block id, position in block), so a block id shared by two requests
    gives both the same tokens, and different block ids almost surely give different ones.
    """
    seeds = mix64(np.asarray(block_ids, dtype=np.uint64))
    mixed = (seeds[:, None] ^ _position_keys(block_size)[None, :]) * np.uint64(0x9E3779B97F4A7C15)
    # High 32 bits scaled into [0, VOCAB_SIZE): Lemire's multiply-shift, much faster than a modulo.
    return (((mixed >> np.uint64(32)) * np.uint64(VOCAB_SIZE)) >> np.uint64(32)).astype(np.int32).ravel()


@lru_cache(maxsize=8)
def _position_keys(block_size: int) -> np.ndarray:
    # Offset into a range no real block id reaches: were positions mixed like ids, mix(i) ^ mix(p)
    # would equal mix(p) ^ mix(i) and blocks i, p would share tokens (swapped positions).
    keys = mix64(np.arange(block_size, dtype=np.uint64) + np.uint64(0xD6E8FEB86659FD93))
    keys.flags.writeable = False
    return keys


# --- parsing helpers -------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")


def _fail(path: Path, line: int, reason: str):
    raise KvsimError(f"{path}:{line}: {reason}")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_len(path: Path, line: int, name: str, text, zero_ok: bool = False) -> int:
    if isinstance(text, str) and _INTEGER.fullmatch(text):
        value = int(text)
    elif isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        _fail(path, line, f"{name} is not an integer: {_show(text)}")
    if value < 0 or (value == 0 and not zero_ok):
        _fail(path, line, f"{name} must be positive: {value}")
    if value > MAX_TOKENS:
        _fail(path, line, f"{name} must be at most {MAX_TOKENS:,}: {_show(value)}")
    return value


def _parse_seconds(path: Path, line: int, name: str, raw, scale: float = 1.0) -> float:
    """A finite time within MAX_TRACE_SECONDS, in seconds (`raw` counts 1/scale seconds)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            _fail(path, line, f"bad timestamp in {name}: {_show(raw)}")
    elif isinstance(raw, bool) or not isinstance(raw, (int, float)):
        _fail(path, line, f"bad timestamp in {name}: {_show(raw)}")
    seconds = value / scale
    if not -MAX_TRACE_SECONDS <= seconds <= MAX_TRACE_SECONDS:  # false for nan
        _fail(path, line, f"bad timestamp in {name}: {_show(raw)} (finite, within {MAX_TRACE_SECONDS:g} s)")
    return seconds


class _Columns:
    """A trace's rows as they are read: typed columns, not a list of tuples (8 B a value), capped
    at MAX_REQUESTS rows."""

    def __init__(self, path: Path, time_code: str = "d"):
        self.path = path
        self.time, self.prompt, self.output = array(time_code), array("q"), array("q")

    def add(self, line: int, time, prompt: int, output: int) -> None:
        if len(self.prompt) >= MAX_REQUESTS:
            _fail(self.path, line, f"trace has more than {MAX_REQUESTS:,} requests")
        self.time.append(time)
        self.prompt.append(prompt)
        self.output.append(output)

    def nonempty(self) -> None:
        if not self.prompt:
            raise KvsimError(f"{self.path}: trace has no requests")


def _read_csv(path: Path, columns: tuple[str, ...], add_row: Callable[[int, list[str]], None],
              keys: Optional[dict] = None) -> None:
    """Each row of a headed CSV as `add_row(line, [value of each column])`, blank lines skipped;
    `keys` names the scenario key of each column in errors."""
    keys = keys or {}
    reader = csv.reader(text for _, text in iter_lines(path, "trace"))
    try:
        header = next(reader, None)
        if header is None:
            _fail(path, 1, f"empty file, expected header {','.join(columns)}")
        header = [h.strip() for h in header]
        for name in columns:
            if name not in header:
                _fail(path, 1, f"missing column {name!r} in header" + (f" ({keys[name]})" if name in keys else ""))
        idx = [header.index(name) for name in columns]
        width = max(idx) + 1
        for fields in reader:
            if not fields:
                continue
            if len(fields) < width:
                missing = next(columns[k] for k, i in enumerate(idx) if i >= len(fields))
                _fail(path, reader.line_num, f"missing column {missing!r}")
            add_row(reader.line_num, [fields[i].strip() for i in idx])
    except csv.Error as exc:
        _fail(path, reader.line_num, f"bad CSV: {exc}")


def _azure_ns(path: Path, line: int, stamp: str, column: str = "TIMESTAMP") -> int:
    """A wall-clock timestamp as int64 nanoseconds since 1970, within MIN/MAX_TRACE_YEAR."""
    if not _AZURE_TIME.fullmatch(stamp) or not MIN_TRACE_YEAR <= int(stamp[:4]) <= MAX_TRACE_YEAR:
        _fail(path, line, f"bad timestamp in {column}: {_show(stamp)} (years {MIN_TRACE_YEAR}-{MAX_TRACE_YEAR})")
    try:
        return int(np.datetime64(stamp, "ns").astype(np.int64))
    except ValueError:
        _fail(path, line, f"bad timestamp in {column}: {_show(stamp)}")


def load_azure(path: Path) -> Trace:
    path = Path(path)
    cols = _Columns(path, "q")

    def row(line, f):
        ns = _azure_ns(path, line, f[0])
        prompt = _parse_len(path, line, "ContextTokens", f[1])
        output = _parse_len(path, line, "GeneratedTokens", f[2], zero_ok=True)
        cols.add(line, ns, prompt, max(output, 1))

    _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), row)
    cols.nonempty()
    ns = np.frombuffer(cols.time, dtype=np.int64)
    return _sorted_trace((ns - ns[0]) / 1e9, cols.prompt, cols.output)


def load_csv(path: Path) -> Trace:
    path = Path(path)
    cols = _Columns(path)

    def row(line, f):
        cols.add(line, _parse_seconds(path, line, "arrival_s", f[0]), _parse_len(path, line, "prompt_tokens", f[1]),
                 _parse_len(path, line, "output_tokens", f[2]))

    _read_csv(path, ("arrival_s", "prompt_tokens", "output_tokens"), row)
    cols.nonempty()
    return _sorted_trace(np.frombuffer(cols.time, dtype=np.float64).copy(), cols.prompt, cols.output)


def _mooncake_row(path: Path, line: int, text: str) -> tuple:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(path, line, f"bad JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:
        _fail(path, line, "bad JSON: nested too deeply")
    except ValueError:
        _fail(path, line, "bad JSON: integer too long")
    if not isinstance(obj, dict):
        _fail(path, line, "bad JSON: expected an object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            _fail(path, line, f"missing column {key!r}")
    arrival = _parse_seconds(path, line, "timestamp", obj["timestamp"], scale=1000.0)
    prompt = _parse_len(path, line, "input_length", obj["input_length"])  # checked before the ids are looked at
    output = _parse_len(path, line, "output_length", obj["output_length"])
    ids = obj["hash_ids"]
    need = -(-prompt // MOONCAKE_BLOCK_SIZE)
    if isinstance(ids, list) and len(ids) != need:
        _fail(path, line, f"hash_ids has {len(ids)} ids, input_length {prompt} needs {need} "
                          f"({MOONCAKE_BLOCK_SIZE}-token blocks)")
    if not isinstance(ids, list) or not all(type(h) is int and 0 <= h < 2**63 for h in ids):
        _fail(path, line, "hash_ids is not a list of non-negative integers")
    return arrival, prompt, output, ids


def load_mooncake(path: Path) -> Trace:
    path = Path(path)
    cols = _Columns(path)
    flat, ends = array("q"), array("q")
    for line, text in iter_lines(path, "trace"):
        if text.strip():
            arrival, prompt, output, ids = _mooncake_row(path, line, text)
            if len(flat) + len(ids) > MAX_TRACE_BLOCK_IDS:
                _fail(path, line, f"trace has more than {MAX_TRACE_BLOCK_IDS:,} hash_ids")
            cols.add(line, arrival, prompt, output)
            flat.extend(ids)
            ends.append(len(flat))
    cols.nonempty()
    end = np.frombuffer(ends, dtype=np.int64).copy()
    counts = np.diff(end, prepend=0)
    return _sorted_trace(np.frombuffer(cols.time, dtype=np.float64).copy(), cols.prompt, cols.output,
                         np.frombuffer(flat, dtype=np.int64), end - counts, end)


def _sorted_trace(arrival: np.ndarray, prompt, output, hash_ids=None, start=None, end=None) -> Trace:
    """Rows in stable arrival order, times shifted so the first is 0, arrays read-only."""
    prompt = np.array(prompt, dtype=np.int64)
    output = np.array(output, dtype=np.int64)
    if np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        arrival, prompt, output = arrival[order], prompt[order], output[order]
        if hash_ids is not None:
            start, end = start[order], end[order]
    arrival = arrival - arrival[0]
    for a in (arrival, prompt, output, hash_ids, start, end):
        if a is not None:
            a.flags.writeable = False
    return Trace(arrival, prompt, output, hash_ids, start, end)


def _load_vllm_bench(path: Path) -> Trace:
    from kvsim.scenario.datasets import load_vllm_bench

    return load_vllm_bench(path)


_LOADERS = {"azure": load_azure, "mooncake": load_mooncake, "csv": load_csv, "vllm_bench": _load_vllm_bench}


@lru_cache(maxsize=4)
def _load_cached(path: str, fmt: str, mtime_ns: int, size: int, inode: int) -> Trace:
    return _LOADERS[fmt](Path(path))


_read_once: ContextVar[Optional[dict]] = ContextVar("kvsim_traces_read_once", default=None)


def one_read_per_call(fn):
    """Decorate a run: within it every `load_trace` of a file gives the Trace first read, so a trace file
    replaced while a run reads it again (for its next policy) cannot change what that policy replays."""
    @wraps(fn)
    def run(*args, **kwargs):
        if _read_once.get() is not None:
            return fn(*args, **kwargs)
        token = _read_once.set({})
        try:
            return fn(*args, **kwargs)
        finally:
            _read_once.reset(token)
    return run


@lru_cache(maxsize=4)
def _load_cached_with(path: str, fmt: str, options, mtime_ns: int, size: int, ino: int) -> Trace:
    """A format read with options (a csv's column mapping, a dataset's bytes per token)."""
    from kvsim.scenario.datasets import load_csv_columns, load_sharegpt

    if fmt == "sharegpt":
        return load_sharegpt(Path(path), options)
    return load_csv_columns(Path(path), *options)


def _options(cfg):
    """The hashable reading options of a trace config, or None for the formats read as they are."""
    if cfg.format == "sharegpt":
        from kvsim.scenario.datasets import DEFAULT_BYTES_PER_TOKEN

        return cfg.bytes_per_token or DEFAULT_BYTES_PER_TOKEN
    c = cfg.columns
    return (c.arrival, c.arrival_unit, c.prompt_tokens, c.output_tokens) if cfg.format == "csv" and c else None


def load_trace(scenario) -> Trace:
    """The scenario's `workload.trace`, cut to `max_requests`; parsed once per file version (and once per
    run: `one_read_per_call`)."""
    cfg = scenario.workload.trace
    path = scenario.resolve(cfg.path)
    read = _read_once.get()
    options = _options(cfg)
    key = (str(path), cfg.format, options)
    trace = None if read is None else read.get(key)
    if trace is None:
        if not os.path.lexists(path):
            raise KvsimError(f"{scenario.source}: workload.trace.path: file not found: {path}")
        with open_regular(path, "trace") as f:
            st = os.fstat(f.fileno())
        trace = (_load_cached(str(path), cfg.format, st.st_mtime_ns, st.st_size, st.st_ino) if options is None
                 else _load_cached_with(str(path), cfg.format, options, st.st_mtime_ns, st.st_size, st.st_ino))
        if read is not None:
            read[key] = trace
    return trace if cfg.max_requests is None else trace.head(cfg.max_requests)
