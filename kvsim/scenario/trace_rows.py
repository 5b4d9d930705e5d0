"""The rows every trace reader makes: the `Trace` record, synthetic token ids for Mooncake's block
ids, and the checked parsing of one field or CSV row (errors name the file and line as an editor
counts them). kvsim/scenario/traces.py (Azure, Mooncake, csv) and kvsim/scenario/datasets.py
(ShareGPT, vllm bench, mapped csv) read their formats with these.

A CSV of plain rows (no quotes, no carriage return but before a newline) is also read in bulk
(`plain_csv_columns`, `parse_lens`, `azure_ns_many`): a few MiB of rows at a time, each column's
fields checked by one pass of C loops, about five times faster than row by row. The bulk readers
take only what the row-by-row reader would take with the same values; at anything else they raise
`NotPlain`, and the row-by-row reader reads the file again (and names the line of the error).
"""

from __future__ import annotations

import csv
import re
from array import array
from itertools import chain, repeat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.files import iter_lines, iter_text_chunks
from kvsim.scenario.limits import MAX_REQUESTS, MAX_TOKENS, MAX_TRACE_SECONDS, MAX_TRACE_YEAR, MIN_TRACE_YEAR
from kvsim.sequence import mix64

VOCAB_SIZE = 32000  # synthetic token ids lie in [0, VOCAB_SIZE)
MOONCAKE_BLOCK_SIZE = 512

AZURE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")


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

    def tail(self, start: int) -> Trace:
        """The rows from `start` on, their times moved so the first arrives at 0 (views but the times)."""
        if start <= 0:
            return self
        times = self.arrival_s[start:] - self.arrival_s[start]
        times.flags.writeable = False
        if self.hash_ids is None:
            return Trace(times, self.prompt_len[start:], self.output_len[start:])
        return Trace(times, self.prompt_len[start:], self.output_len[start:], self.hash_ids,
                     self.hash_start[start:], self.hash_end[start:])

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

INTEGER = re.compile(r"[+-]?[0-9]{1,30}")


def fail(path: Path, line: int, reason: str):
    raise KvsimError(f"{path}:{line}: {reason}")


def show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_len(path: Path, line: int, name: str, text, zero_ok: bool = False) -> int:
    if isinstance(text, str) and INTEGER.fullmatch(text):
        value = int(text)
    elif isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        fail(path, line, f"{name} is not an integer: {show(text)}")
    if value < 0 or (value == 0 and not zero_ok):
        fail(path, line, f"{name} must be positive: {value}")
    if value > MAX_TOKENS:
        fail(path, line, f"{name} must be at most {MAX_TOKENS:,}: {show(value)}")
    return value


def parse_seconds(path: Path, line: int, name: str, raw, scale: float = 1.0) -> float:
    """A finite time within MAX_TRACE_SECONDS, in seconds (`raw` counts 1/scale seconds)."""
    value = raw
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            fail(path, line, f"bad timestamp in {name}: {show(raw)}")
    elif isinstance(raw, bool) or not isinstance(raw, (int, float)):
        fail(path, line, f"bad timestamp in {name}: {show(raw)}")
    seconds = value / scale
    if not -MAX_TRACE_SECONDS <= seconds <= MAX_TRACE_SECONDS:  # false for nan
        fail(path, line, f"bad timestamp in {name}: {show(raw)} (finite, within {MAX_TRACE_SECONDS:g} s)")
    return seconds


class Columns:
    """A trace's rows as they are read: typed columns, not a list of tuples (8 B a value), capped
    at MAX_REQUESTS rows."""

    def __init__(self, path: Path, time_code: str = "d"):
        self.path = path
        self.time, self.prompt, self.output = array(time_code), array("q"), array("q")

    def add(self, line: int, time, prompt: int, output: int) -> None:
        if len(self.prompt) >= MAX_REQUESTS:
            fail(self.path, line, f"trace has more than {MAX_REQUESTS:,} requests")
        self.time.append(time)
        self.prompt.append(prompt)
        self.output.append(output)

    def nonempty(self) -> None:
        if not self.prompt:
            raise KvsimError(f"{self.path}: trace has no requests")


def read_csv(path: Path, columns: tuple[str, ...], add_row: Callable[[int, list[str]], None],
              keys: Optional[dict] = None) -> None:
    """Each row of a headed CSV as `add_row(line, [value of each column])`, blank lines skipped;
    `keys` names the scenario key of each column in errors."""
    keys = keys or {}
    reader = csv.reader(text for _, text in iter_lines(path, "trace"))
    try:
        header = next(reader, None)
        if header is None:
            fail(path, 1, f"empty file, expected header {','.join(columns)}")
        header = [h.strip() for h in header]
        for name in columns:
            if name not in header:
                fail(path, 1, f"missing column {name!r} in header" + (f" ({keys[name]})" if name in keys else ""))
        idx = [header.index(name) for name in columns]
        width = max(idx) + 1
        for fields in reader:
            if not fields:
                continue
            if len(fields) < width:
                missing = next(columns[k] for k, i in enumerate(idx) if i >= len(fields))
                fail(path, reader.line_num, f"missing column {missing!r}")
            add_row(reader.line_num, [fields[i].strip() for i in idx])
    except csv.Error as exc:
        fail(path, reader.line_num, f"bad CSV: {exc}")


def azure_ns(path: Path, line: int, stamp: str, column: str = "TIMESTAMP") -> int:
    """A wall-clock timestamp as int64 nanoseconds since 1970, within MIN/MAX_TRACE_YEAR."""
    if not AZURE_TIME.fullmatch(stamp) or not MIN_TRACE_YEAR <= int(stamp[:4]) <= MAX_TRACE_YEAR:
        fail(path, line, f"bad timestamp in {column}: {show(stamp)} (years {MIN_TRACE_YEAR}-{MAX_TRACE_YEAR})")
    try:
        return int(np.datetime64(stamp, "ns").astype(np.int64))
    except ValueError:
        fail(path, line, f"bad timestamp in {column}: {show(stamp)}")


def sorted_trace(arrival: np.ndarray, prompt, output, hash_ids=None, start=None, end=None) -> Trace:
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


# --- reading plain rows in bulk ----------------------------------------------------------------

class NotPlain(Exception):
    """A bulk reader met something it does not take as it is: read the file row by row."""


@lru_cache(maxsize=16)
def many(field: re.Pattern) -> re.Pattern:
    """Lines that each match `field` (a pattern without newlines), joined by newlines: one C loop
    checks a whole column. Its digits are ASCII digits (\\d also takes other scripts' digits, and is
    slower): what it takes, `field` takes."""
    one = field.pattern.replace(r"\d", "[0-9]")
    return re.compile(rf"(?:{one})(?:\n(?:{one}))*")


def plain_csv_columns(path: Path, columns: tuple[str, ...]) -> Iterator[list[list[str]]]:
    """A headed CSV's rows a few MiB at a time, as a list per named column of its stripped fields
    (as `read_csv` gives them). Every row must have the header's number of fields: NotPlain at a
    quote, a lone carriage return, a blank line, a row of more or fewer fields, a field past the csv
    module's limit, more than MAX_REQUESTS rows or a missing column."""
    chunks = iter_text_chunks(path, "trace")
    head, _, text = next(chunks, "").partition("\n")
    head = head[:-1] if head.endswith("\r") else head
    if '"' in head or "\r" in head:
        raise NotPlain
    header = [h.strip() for h in head.split(",")]
    if any(name not in header for name in columns):
        raise NotPlain
    idx, width, rows = [header.index(name) for name in columns], len(header), 0
    for text in chain((text,), chunks):
        if not text or text == "\n":  # the header's newline alone, or a last line without fields
            continue
        if '"' in text or text.count("\r") != text.count("\r\n"):
            raise NotPlain
        body = text.replace("\r\n", "\n")
        body = body[:-1] if body.endswith("\n") else body
        lines = body.split("\n")
        if set(map(str.count, lines, repeat(","))) != {width - 1} or max(map(len, lines)) > csv.field_size_limit():
            raise NotPlain
        fields = body.replace("\n", ",").split(",")  # row after row, `width` fields each
        rows += len(fields) // width
        if rows > MAX_REQUESTS:
            raise NotPlain
        yield [list(map(str.strip, fields[i::width])) for i in idx]


def parse_lens(texts: list[str], zero_ok: bool = False) -> list[int]:
    """Each text as `parse_len` reads it, or NotPlain if any would fail."""
    if texts and not many(INTEGER).fullmatch("\n".join(texts)):
        raise NotPlain
    values = list(map(int, texts))
    if values and (min(values) < (0 if zero_ok else 1) or max(values) > MAX_TOKENS):
        raise NotPlain
    return values


def azure_ns_many(stamps: list[str]) -> np.ndarray:
    """Each timestamp as `azure_ns` reads it (int64 nanoseconds), or NotPlain if any would fail."""
    if stamps and not many(AZURE_TIME).fullmatch("\n".join(stamps)):
        raise NotPlain
    try:
        ns = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:
        raise NotPlain from None
    if len(ns) and (ns.min() < _YEAR_NS[0] or ns.max() >= _YEAR_NS[1]):
        raise NotPlain
    return ns


# azure_ns's years as nanoseconds: from the first instant of MIN_TRACE_YEAR to the first after MAX_TRACE_YEAR
_YEAR_NS = tuple(int(np.datetime64(f"{year}-01-01", "ns").astype(np.int64)) for year in (MIN_TRACE_YEAR, MAX_TRACE_YEAR + 1))
