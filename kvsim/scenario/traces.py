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

import json
import os
from array import array
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache, wraps
from pathlib import Path
from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.files import iter_lines, open_regular
from kvsim.scenario.limits import MAX_TRACE_BLOCK_IDS
from kvsim.scenario.trace_rows import (MOONCAKE_BLOCK_SIZE, Columns, NotPlain, Trace, azure_ns, azure_ns_many, fail,
                                       parse_len, parse_lens, parse_seconds, plain_csv_columns, read_csv, sorted_trace)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

def load_azure(path: Path) -> Trace:
    path = Path(path)
    try:
        return azure_in_bulk(path)
    except NotPlain:  # read row by row: the error, if any, names its line
        return azure_by_rows(path)


def azure_by_rows(path: Path) -> Trace:
    cols = Columns(path, "q")

    def row(line, f):
        ns = azure_ns(path, line, f[0])
        prompt = parse_len(path, line, "ContextTokens", f[1])
        output = parse_len(path, line, "GeneratedTokens", f[2], zero_ok=True)
        cols.add(line, ns, prompt, max(output, 1))

    read_csv(path, AZURE_COLUMNS, row)
    cols.nonempty()
    ns = np.frombuffer(cols.time, dtype=np.int64)
    return sorted_trace((ns - ns[0]) / 1e9, cols.prompt, cols.output)


def azure_in_bulk(path: Path) -> Trace:
    """azure_by_rows's trace, from a file of plain rows (kvsim.scenario.trace_rows.NotPlain at anything else)."""
    times, prompt, output = [], array("q"), array("q")
    for stamps, prompts, outputs in plain_csv_columns(path, AZURE_COLUMNS):
        times.append(azure_ns_many(stamps))
        prompt.extend(parse_lens(prompts))
        output.extend([n or 1 for n in parse_lens(outputs, zero_ok=True)])
    if not times:
        raise NotPlain
    ns = np.concatenate(times)
    return sorted_trace((ns - ns[0]) / 1e9, prompt, output)


def load_csv(path: Path) -> Trace:
    path = Path(path)
    cols = Columns(path)

    def row(line, f):
        cols.add(line, parse_seconds(path, line, "arrival_s", f[0]), parse_len(path, line, "prompt_tokens", f[1]),
                 parse_len(path, line, "output_tokens", f[2]))

    read_csv(path, ("arrival_s", "prompt_tokens", "output_tokens"), row)
    cols.nonempty()
    return sorted_trace(np.frombuffer(cols.time, dtype=np.float64).copy(), cols.prompt, cols.output)


def _mooncake_row(path: Path, line: int, text: str) -> tuple:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(path, line, f"bad JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:
        fail(path, line, "bad JSON: nested too deeply")
    except ValueError:
        fail(path, line, "bad JSON: integer too long")
    if not isinstance(obj, dict):
        fail(path, line, "bad JSON: expected an object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            fail(path, line, f"missing column {key!r}")
    arrival = parse_seconds(path, line, "timestamp", obj["timestamp"], scale=1000.0)
    prompt = parse_len(path, line, "input_length", obj["input_length"])  # checked before the ids are looked at
    output = parse_len(path, line, "output_length", obj["output_length"])
    ids = obj["hash_ids"]
    need = -(-prompt // MOONCAKE_BLOCK_SIZE)
    if isinstance(ids, list) and len(ids) != need:
        fail(path, line, f"hash_ids has {len(ids)} ids, input_length {prompt} needs {need} "
                          f"({MOONCAKE_BLOCK_SIZE}-token blocks)")
    if not isinstance(ids, list) or not all(type(h) is int and 0 <= h < 2**63 for h in ids):
        fail(path, line, "hash_ids is not a list of non-negative integers")
    return arrival, prompt, output, ids


def load_mooncake(path: Path) -> Trace:
    path = Path(path)
    cols = Columns(path)
    flat, ends = array("q"), array("q")
    for line, text in iter_lines(path, "trace"):
        if text.strip():
            arrival, prompt, output, ids = _mooncake_row(path, line, text)
            if len(flat) + len(ids) > MAX_TRACE_BLOCK_IDS:
                fail(path, line, f"trace has more than {MAX_TRACE_BLOCK_IDS:,} hash_ids")
            cols.add(line, arrival, prompt, output)
            flat.extend(ids)
            ends.append(len(flat))
    cols.nonempty()
    end = np.frombuffer(ends, dtype=np.int64).copy()
    counts = np.diff(end, prepend=0)
    return sorted_trace(np.frombuffer(cols.time, dtype=np.float64).copy(), cols.prompt, cols.output,
                         np.frombuffer(flat, dtype=np.int64), end - counts, end)


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


def trace_reads() -> Optional[dict]:
    """The traces the current run has read (`one_read_per_call`), for its worker processes (`reading`)."""
    return _read_once.get()


@contextmanager
def reading(reads: Optional[dict]):
    """Within: `load_trace` gives the traces in `reads` (a run's, from `trace_reads`), as in that run."""
    token = _read_once.set(reads)
    try:
        yield
    finally:
        _read_once.reset(token)


@lru_cache(maxsize=4)
def _load_cached_with(path: str, fmt: str, options, mtime_ns: int, size: int, ino: int) -> Trace:
    """A format read with options (a csv's column mapping, a dataset's bytes per token)."""
    from kvsim.scenario.datasets import load_csv_columns, load_sharegpt, load_sharegpt_conversations

    if fmt == "sharegpt":
        return load_sharegpt(Path(path), options)
    if fmt == CONVERSATIONS:
        return load_sharegpt_conversations(Path(path), options)
    return load_csv_columns(Path(path), *options)


CONVERSATIONS = "sharegpt conversations"  # a ShareGPT dataset read whole, as multi-turn sessions


def _options(cfg):
    """The hashable reading options of a trace config, or None for the formats read as they are."""
    if cfg.format == "sharegpt":
        from kvsim.scenario.datasets import DEFAULT_BYTES_PER_TOKEN

        return cfg.bytes_per_token or DEFAULT_BYTES_PER_TOKEN
    c = cfg.columns
    return (c.arrival, c.arrival_unit, c.prompt_tokens, c.output_tokens) if cfg.format == "csv" and c else None


def load_trace(scenario) -> Trace:
    """The scenario's `workload.trace`, cut to `max_requests`, then less its first `skip_rows`; parsed once
    per file version (and once per run: `one_read_per_call`)."""
    cfg = scenario.workload.trace
    trace = _read(scenario, cfg.format)
    trace = trace if cfg.max_requests is None else trace.head(cfg.max_requests)
    if cfg.skip_rows:
        if cfg.skip_rows >= len(trace):
            raise KvsimError(f"{scenario.source}: workload.trace.skip_rows: {cfg.skip_rows:,} skips every one of "
                             f"the trace's {len(trace):,} rows")
        trace = trace.tail(cfg.skip_rows)
    return trace


def load_conversations(scenario):
    """The scenario's ShareGPT dataset as conversations (kvsim.scenario.datasets.Conversations),
    read as `load_trace` reads a file."""
    return _read(scenario, CONVERSATIONS)


def _read(scenario, fmt: str):
    cfg = scenario.workload.trace
    path = scenario.resolve(cfg.path)
    read = _read_once.get()
    options = _options(cfg)
    key = (str(path), fmt, options)
    trace = None if read is None else read.get(key)
    if trace is None:
        if not os.path.lexists(path):
            raise KvsimError(f"{scenario.source}: workload.trace.path: file not found: {path}")
        with open_regular(path, "trace") as f:
            st = os.fstat(f.fileno())
        trace = (_load_cached(str(path), fmt, st.st_mtime_ns, st.st_size, st.st_ino) if options is None
                 else _load_cached_with(str(path), fmt, options, st.st_mtime_ns, st.st_size, st.st_ino))
        if read is not None:
            read[key] = trace
    return trace
