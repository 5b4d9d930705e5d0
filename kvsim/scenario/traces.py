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
- `csv`: header `arrival_s,prompt_tokens,output_tokens`, arrival in seconds.

Every malformed row raises `KvsimError("<path>:<line>: <reason>")`, lines counted from 1 as an
editor shows them (the CSV header is line 1).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from kvsim.errors import KvsimError

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


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection on uint64 that scatters nearby inputs."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_token_ids(block_ids: np.ndarray, block_size: int = MOONCAKE_BLOCK_SIZE) -> np.ndarray:
    """`block_size` synthetic token ids per block id, concatenated (int32 in [0, VOCAB_SIZE)).

    A token depends only on (block id, position in block), so a block id shared by two requests
    gives both the same tokens, and different block ids almost surely give different ones.
    """
    seeds = _mix64(np.asarray(block_ids, dtype=np.uint64))
    mixed = (seeds[:, None] ^ _position_keys(block_size)[None, :]) * np.uint64(0x9E3779B97F4A7C15)
    # High 32 bits scaled into [0, VOCAB_SIZE): Lemire's multiply-shift, much faster than a modulo.
    return (((mixed >> np.uint64(32)) * np.uint64(VOCAB_SIZE)) >> np.uint64(32)).astype(np.int32).ravel()


@lru_cache(maxsize=8)
def _position_keys(block_size: int) -> np.ndarray:
    # Offset into a range no real block id reaches: were positions mixed like ids, mix(i) ^ mix(p)
    # would equal mix(p) ^ mix(i) and blocks i, p would share tokens (swapped positions).
    keys = _mix64(np.arange(block_size, dtype=np.uint64) + np.uint64(0xD6E8FEB86659FD93))
    keys.flags.writeable = False
    return keys


# --- parsing helpers -------------------------------------------------------------------------


def _fail(path: Path, line: int, reason: str):
    raise KvsimError(f"{path}:{line}: {reason}")


def _parse_len(path: Path, line: int, name: str, text, zero_ok: bool = False) -> int:
    if isinstance(text, str):
        try:
            value = int(text)
        except ValueError:
            _fail(path, line, f"{name} is not an integer: {text!r}")
    elif isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        _fail(path, line, f"{name} is not an integer: {text!r}")
    if value < 0 or (value == 0 and not zero_ok):
        _fail(path, line, f"{name} must be positive: {value}")
    return value


def _parse_seconds(path: Path, line: int, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        _fail(path, line, f"bad timestamp in {name}: {text!r}")
    if not math.isfinite(value):
        _fail(path, line, f"bad timestamp in {name}: {text!r}")
    return value


def _read_csv(path: Path, columns: tuple[str, str, str],
              parse_row: Callable[[int, list[str]], tuple]) -> list[tuple]:
    """Rows of a headed CSV as `parse_row(line, [time, prompt, output])` tuples, blank lines skipped."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            _fail(path, 1, f"empty file, expected header {','.join(columns)}")
        header = [h.strip() for h in header]
        for name in columns:
            if name not in header:
                _fail(path, 1, f"missing column {name!r} in header")
        idx = [header.index(name) for name in columns]
        width = max(idx) + 1
        rows = []
        for fields in reader:
            if not fields:
                continue
            if len(fields) < width:
                missing = next(columns[k] for k, i in enumerate(idx) if i >= len(fields))
                _fail(path, reader.line_num, f"missing column {missing!r}")
            rows.append(parse_row(reader.line_num, [fields[i].strip() for i in idx]))
    return rows


def _azure_seconds(path: Path, stamps: list[str], lines: list[int]) -> np.ndarray:
    """Wall-clock timestamps as float64 seconds after the first row's."""
    try:
        t = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        for stamp, line in zip(stamps, lines):  # find the culprit for the message
            try:
                np.datetime64(stamp, "ns")
            except ValueError:
                _fail(path, line, f"bad timestamp in TIMESTAMP: {stamp!r}")
        raise
    return (t - t[0]).astype(np.int64) / 1e9


def load_azure(path: Path) -> Trace:
    path = Path(path)

    def row(line, f):
        if not _AZURE_TIME.fullmatch(f[0]):
            _fail(path, line, f"bad timestamp in TIMESTAMP: {f[0]!r}")
        prompt = _parse_len(path, line, "ContextTokens", f[1])
        output = _parse_len(path, line, "GeneratedTokens", f[2], zero_ok=True)
        return f[0], prompt, max(output, 1), line

    rows = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), row)
    _nonempty(path, rows)
    stamps, prompt, output, lines = zip(*rows)
    return _sorted_trace(_azure_seconds(path, list(stamps), list(lines)), prompt, output)


def load_csv(path: Path) -> Trace:
    path = Path(path)

    def row(line, f):
        return (_parse_seconds(path, line, "arrival_s", f[0]), _parse_len(path, line, "prompt_tokens", f[1]),
                _parse_len(path, line, "output_tokens", f[2]))

    rows = _read_csv(path, ("arrival_s", "prompt_tokens", "output_tokens"), row)
    _nonempty(path, rows)
    arrival, prompt, output = zip(*rows)
    return _sorted_trace(np.array(arrival, dtype=np.float64), prompt, output)


def _mooncake_row(path: Path, line: int, text: str) -> tuple:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(path, line, f"bad JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(obj, dict):
        _fail(path, line, "bad JSON: expected an object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            _fail(path, line, f"missing column {key!r}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        _fail(path, line, f"bad timestamp in timestamp: {ts!r}")
    prompt = _parse_len(path, line, "input_length", obj["input_length"])
    output = _parse_len(path, line, "output_length", obj["output_length"])
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(type(h) is int and 0 <= h < 2**63 for h in ids):
        _fail(path, line, "hash_ids is not a list of non-negative integers")
    need = -(-prompt // MOONCAKE_BLOCK_SIZE)
    if len(ids) != need:
        _fail(path, line, f"hash_ids has {len(ids)} ids, input_length {prompt} needs {need} "
                          f"({MOONCAKE_BLOCK_SIZE}-token blocks)")
    return ts / 1000.0, prompt, output, ids


def load_mooncake(path: Path) -> Trace:
    path = Path(path)
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f, start=1):
            if text.strip():
                rows.append(_mooncake_row(path, line, text))
    _nonempty(path, rows)
    arrival, prompt, output, ids = zip(*rows)
    counts = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    end = np.cumsum(counts)
    flat = np.fromiter((h for x in ids for h in x), dtype=np.int64, count=int(end[-1]) if len(end) else 0)
    return _sorted_trace(np.array(arrival, dtype=np.float64), prompt, output, flat, end - counts, end)


def _nonempty(path: Path, rows: list) -> None:
    if not rows:
        raise KvsimError(f"{path}: trace has no requests")


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


_LOADERS = {"azure": load_azure, "mooncake": load_mooncake, "csv": load_csv}


@lru_cache(maxsize=4)
def _load_cached(path: str, fmt: str, mtime_ns: int, size: int) -> Trace:
    return _LOADERS[fmt](Path(path))


def load_trace(scenario) -> Trace:
    """The scenario's `workload.trace`, cut to `max_requests`; parsed once per file version."""
    cfg = scenario.workload.trace
    path = scenario.resolve(cfg.path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KvsimError(f"{scenario.source}: workload.trace.path: file not found: {path}") from None
    except OSError as exc:
        raise KvsimError(f"{scenario.source}: workload.trace.path: cannot read {path} ({exc.strerror})") from None
    if not path.is_file():
        raise KvsimError(f"{scenario.source}: workload.trace.path: not a file: {path}")
    try:
        trace = _load_cached(str(path), cfg.format, st.st_mtime_ns, st.st_size)
    except UnicodeDecodeError as exc:
        raise KvsimError(f"{path}: not a text file ({exc.reason})") from None
    return trace if cfg.max_requests is None else trace.head(cfg.max_requests)
