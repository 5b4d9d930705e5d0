"""The one reader of every file a user hands kvsim: scenarios, model configs, calibrations and traces.

A file must be a regular file (a FIFO would block, a device never ends), readable, and no bigger
than a cap checked before it is parsed (1 MiB for TOML, whose parser is pure Python and takes
about a second a MiB; 64 MiB for JSON); traces are streamed a line at a
time with a cap on the line. Text must be UTF-8 without NUL bytes. Parsed TOML and JSON must nest
at most `MAX_DEPTH` levels and hold only finite floats and integers that fit in 64 bits (the
scenario schema then bounds each key). Every problem is a `KvsimError` naming the file, and the
line or key where it is known. Writing outputs (never over what kvsim did not write) is
kvsim.scenario.publish's.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

from kvsim.errors import KvsimError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_DOC_BYTES = 64 << 20  # a JSON file or a table
MAX_TOML_BYTES = 1 << 20  # a scenario: hand-written, a few KiB (sweep points live in CSV)
MAX_LINE_BYTES = 64 << 20  # one line of a trace (a Mooncake row of 2^31 tokens has 4M block ids)
CHUNK_BYTES = 4 << 20  # what readers of many lines at once read at a time (iter_text_chunks)
MAX_DEPTH = 32  # nesting of tables and arrays (a scenario needs 4)
_INT64 = 2**63
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))
_LONG_INT = re.compile(r"\d[\d_]{4299,}")  # past Python's 4,300-digit int conversion limit


def key_path(parts) -> str:
    """`("policies", 0, "name")` as `policies[0].name`."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(top level)"


def user_path(value, what: str) -> Path:
    """`value` (a str or os.PathLike, as the library API takes it) as a Path; else one line naming `what`."""
    try:
        return Path(value)
    except TypeError:
        raise KvsimError(f"{what}: expected a file path (str or os.PathLike), got {type(value).__name__}") from None


def open_regular(path: Path, what: str) -> BinaryIO:
    """`path` opened for binary reading, after checking it is a regular file (`what` names it in errors)."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)  # the same file, should it have been swapped since the stat
            if stat.S_ISREG(st.st_mode):
                return os.fdopen(fd, "rb")
            os.close(fd)
    except FileNotFoundError:
        raise KvsimError(f"{path}: {what} not found") from None
    except ValueError:  # an embedded NUL
        raise KvsimError(f"{str(path)!r}: {what} is not a valid path") from None
    except OSError as exc:
        raise KvsimError(f"{path}: cannot read {what} ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise KvsimError(f"{path}: {what} is a folder, not a file")
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise KvsimError(f"{path}: {what} is {kind}, not a regular file")


def _line_of(data, offset: int) -> int:
    return data.count(b"\n" if isinstance(data, bytes) else "\n", 0, offset) + 1


def decode_text(path, data: bytes, what: str, first_line: int = 1) -> str:
    """`data` as text: UTF-8 (a BOM skipped at the start), no NUL byte; errors name the line."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise KvsimError(f"{path}:{first_line - 1 + _line_of(data, nul)}: NUL byte: {what} is not a text file")
    try:
        return data.decode("utf-8-sig" if first_line == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        line = first_line - 1 + _line_of(data, exc.start)
        raise KvsimError(f"{path}:{line}: {what} is not UTF-8 text ({exc.reason})") from None


def iter_text_chunks(path: Path, what: str, size: int = CHUNK_BYTES, limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """A text file's whole lines (each with its newline; the file's last maybe without) as a few
    MiB of text at a time, checked as `iter_lines` checks each line: for readers that take many lines
    at once. `size` is below `limit`, so only a block's first line can be too long."""
    with open_regular(path, what) as f:
        line, rest = 1, b""
        while True:
            try:
                data = f.read(size)
            except OSError as exc:
                raise KvsimError(f"{path}:{line}: cannot read {what} ({exc.strerror})") from None
            first = data.find(b"\n")
            if len(rest) + (first + 1 if first >= 0 else len(data)) > limit:
                raise KvsimError(f"{path}:{line}: line longer than {limit >> 20} MiB")
            if first < 0 and data:  # no line ends in this read
                rest += data
                continue
            cut = data.rfind(b"\n") + 1
            block, rest = rest + data[:cut], data[cut:]
            if block:
                yield decode_text(path, block, what, line)
                line += block.count(b"\n")
            if not data:
                return


def read_text(path: Path, what: str, limit: int = MAX_DOC_BYTES) -> str:
    """The text of a user's file (`what` names it in errors: "scenario file", "model config", ...)."""
    with open_regular(path, what) as f:
        try:
            data = f.read(limit + 1)  # not trusting st_size: /proc files say 0, files grow
        except OSError as exc:
            raise KvsimError(f"{path}: cannot read {what} ({exc.strerror})") from None
    if len(data) > limit:
        raise KvsimError(f"{path}: {what} is larger than {limit >> 20} MiB")
    return decode_text(path, data, what)


def _items(value):
    return iter(value.items() if isinstance(value, dict) else enumerate(value))


def _check_number(value, loc, source: str) -> None:
    if isinstance(value, float) and value - value != 0:  # inf or nan
        raise KvsimError(f"{source}: {key_path(loc)}: must be a finite number, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        raise KvsimError(f"{source}: {key_path(loc)}: integer out of range (more than 64 bits)")


def check_values(data, source: str) -> None:
    """Raise unless `data` nests at most MAX_DEPTH levels and its numbers are finite 64-bit values.
    Walked depth first with one iterator per open level, so a huge array costs no extra memory."""
    if not isinstance(data, (dict, list)):
        return _check_number(data, (), source)
    stack = [((), _items(data))]
    while stack:
        loc, items = stack[-1]
        for key, value in items:
            if isinstance(value, (dict, list)):
                if len(loc) + 1 >= MAX_DEPTH:
                    raise KvsimError(f"{source}: {key_path((*loc, key)[:4])}...: nested more than {MAX_DEPTH} "
                                     f"levels deep")
                stack.append(((*loc, key), _items(value)))
                break
            if isinstance(value, (int, float)):
                _check_number(value, (*loc, key), source)
        else:
            stack.pop()


def _parse(loads, text: str, source: str, kind: str):
    try:
        data = loads(text)
    except RecursionError:
        raise KvsimError(f"{source}: nested more than {MAX_DEPTH} levels deep") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError):
        raise
    except ValueError as exc:  # an integer past the conversion limit
        found = _LONG_INT.search(text)
        where = f"{source}:{_line_of(text, found.start())}" if found else source
        raise KvsimError(f"{where}: invalid {kind}: integer too long ({str(exc).split(':')[0]})") from None
    check_values(data, source)
    return data


def parse_toml(text: str, source: str) -> dict:
    """TOML text as a dict, every number checked (see `check_values`)."""
    try:
        return _parse(tomllib.loads, text, source, "TOML")
    except tomllib.TOMLDecodeError as exc:
        raise KvsimError(f"{source}: invalid TOML: {exc}") from None


def parse_json(text: str, source: str):
    """JSON text, every number checked; NaN and Infinity are refused as the JSON standard does."""
    def constant(name):
        raise json.JSONDecodeError(f"{name} is not a JSON number", text, max(text.find(name), 0))
    try:
        return _parse(lambda t: json.loads(t, parse_constant=constant), text, source, "JSON")
    except json.JSONDecodeError as exc:
        raise KvsimError(f"{source}:{exc.lineno}: invalid JSON: {exc.msg}") from None


def parse_yaml(text: str, source: str):
    """YAML text (one document, no anchors or aliases, whose copies could multiply a small file), every
    number checked; for the YAML that benchmarking tools write (llm-d inference-perf's config.yaml)."""
    import yaml

    class _NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.MarkedYAMLError(problem="anchors and aliases are not read", problem_mark=mark)
            return super().compose_node(parent, index)

    try:
        data = yaml.load(text, Loader=_NoAliases)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise KvsimError(f"{source}: nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise KvsimError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    check_values(data, source)
    return data


def read_json_object(path: Path, what: str) -> dict:
    """A user's JSON file that must hold one object."""
    data = parse_json(read_text(path, what), str(path))
    if not isinstance(data, dict):
        raise KvsimError(f"{path}: expected a JSON object ({what})")
    return data


def iter_lines(path: Path, what: str, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number from 1, text with its newline) of a text file, streamed; each line checked as
    `read_text` checks a file."""
    with open_regular(path, what) as f:
        line = 0
        while True:
            try:
                data = f.readline(limit + 1)
            except OSError as exc:
                raise KvsimError(f"{path}:{line + 1}: cannot read {what} ({exc.strerror})") from None
            if not data:
                return
            line += 1
            if len(data) > limit:
                raise KvsimError(f"{path}:{line}: line longer than {limit >> 20} MiB")
            yield line, decode_text(path, data, what, line)
