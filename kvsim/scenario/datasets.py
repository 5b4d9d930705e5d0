"""Request lengths from the datasets users bring, read into a `Trace` (kvsim/scenario/traces.py):
their own CSV logs with a column mapping, ShareGPT-style conversations and `vllm bench` results.

- A CSV log: `[workload.trace.columns]` names the arrival column (optional; its unit s, ms, us, ns
  or datetime, any origin: the first arrival becomes 0), the prompt and the output token columns.
- `sharegpt`: a JSON list of `{"conversations": [{"from", "value"}, ...]}`, streamed one
  conversation at a time (`ijson`: the public ShareGPT file is 640 MB). As `vllm bench serve
  --dataset-name sharegpt` samples it (vLLM v0.11.0, `ShareGPTDataset`): the first turn is the
  prompt, the second the output; conversations with fewer than two turns are skipped, and so are
  pairs whose prompt or output is under 4 tokens, whose prompt is over 1024 or whose total is over
  2048 (`is_valid_sequence`). Tokens are estimated as UTF-8 bytes / `bytes_per_token` (default 4:
  about right for Llama-3-class tokenizers in English and in CJK text alike); file order, not
  shuffled.
- `vllm_bench`: a `vllm bench serve --save-result --save-detailed` JSON: its `input_lens` and
  `output_lens`.
- ShareGPT conversations as multi-turn sessions (`load_sharegpt_conversations`, for
  kvsim/scenario/sessions.py): every (human, gpt) pair of a conversation is a turn.

Datasets without times have `arrival_s` all 0: the scenario's arrivals are then synthetic. Bad
input is one line naming the file and the line (a CSV) or the entry (`conversation 12`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.files import open_regular, read_json_object
from kvsim.scenario.limits import MAX_REQUESTS
from kvsim.scenario.trace_rows import Columns, Trace, azure_ns, parse_len, parse_seconds, read_csv, sorted_trace

_UNIT_SCALE = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def load_csv_columns(path: Path, arrival: Optional[str], unit: str, prompt: str, output: str) -> Trace:
    """Your own CSV log: the columns holding the arrival time (None: lengths only; `unit` s, ms, us,
    ns or datetime), the prompt and the output tokens."""
    path = Path(path)
    key = "workload.trace.columns."
    names = tuple(c for c in (arrival, prompt, output) if c)
    keys = {prompt: key + "prompt_tokens", output: key + "output_tokens"}
    if arrival:
        keys[arrival] = key + "arrival"
    dated = unit == "datetime"
    cols = Columns(path, "q" if dated else "d")

    def row(line, f):
        if not arrival:
            t, f = (0 if dated else 0.0), ["", *f]
        elif dated:
            t = azure_ns(path, line, f[0], arrival)
        else:
            t = parse_seconds(path, line, arrival, f[0], _UNIT_SCALE[unit])
        cols.add(line, t, parse_len(path, line, prompt, f[1]), parse_len(path, line, output, f[2]))

    read_csv(path, names, row, keys)
    cols.nonempty()
    times = np.frombuffer(cols.time, dtype=np.int64 if dated else np.float64)
    arrival = (times - times[0]) / 1e9 if dated else times.copy()
    return sorted_trace(arrival, cols.prompt, cols.output)


# vllm bench serve's ShareGPT filter (benchmarks/datasets.py is_valid_sequence, vLLM v0.11.0)
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048
DEFAULT_BYTES_PER_TOKEN = 4.0


def _json_items(path: Path, what: str):
    """The elements of a top-level JSON list, streamed (ijson), with their index; one-line errors."""
    import ijson

    with open_regular(path, "trace") as f:
        index = -1
        try:
            for index, item in enumerate(ijson.items(f, "item", use_float=True)):
                yield index, item
        except ijson.JSONError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise KvsimError(f"{path}: bad JSON after {what} {index}: {reason[:200]}") from None
        if index < 0:
            raise KvsimError(f"{path}: expected a JSON list of {what}s, found none")


def _turn_tokens(path: Path, index: int, turn, bytes_per_token: float) -> int:
    text = turn.get("value") if isinstance(turn, dict) else None
    if not isinstance(text, str):
        raise KvsimError(f"{path}: conversation {index}: a turn without a string \"value\"")
    return max(1, int(np.ceil(len(text.encode("utf-8", "surrogatepass")) / bytes_per_token)))


def load_sharegpt(path: Path, bytes_per_token: Optional[float] = None) -> Trace:
    """A ShareGPT-style dataset's (prompt, output) lengths, filtered as vllm bench does (module docstring)."""
    path = Path(path)
    bpt = bytes_per_token or DEFAULT_BYTES_PER_TOKEN
    cols = Columns(path)
    for index, conv in _json_items(path, "conversation"):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise KvsimError(f"{path}: conversation {index}: expected an object with a \"conversations\" list")
        if len(turns) < 2:
            continue
        prompt, output = (_turn_tokens(path, index, t, bpt) for t in turns[:2])
        if (prompt < SHAREGPT_MIN_LEN or output < SHAREGPT_MIN_LEN or prompt > SHAREGPT_MAX_PROMPT
                or prompt + output > SHAREGPT_MAX_TOTAL):
            continue
        cols.add(index + 1, 0.0, prompt, output)
    if not cols.prompt:
        raise KvsimError(f"{path}: no conversation has a first two turns within vllm bench's ShareGPT bounds "
                         f"({SHAREGPT_MIN_LEN}-{SHAREGPT_MAX_PROMPT} prompt tokens, at most {SHAREGPT_MAX_TOTAL} in all)")
    return sorted_trace(np.zeros(len(cols.prompt)), cols.prompt, cols.output)


class Conversations:
    """A ShareGPT-style dataset's conversations as sessions: per conversation, its (human, gpt)
    turn pairs' tokens, in file order (`turns(i)` and `lengths(i)` cycle over them)."""

    __slots__ = ("prompt", "output", "start")

    def __init__(self, prompt: list, output: list, start: list):
        self.prompt, self.output, self.start = prompt, output, start  # flat turns; start[i]: conversation i's first

    def __len__(self) -> int:
        return len(self.start) - 1

    def turns(self, i: int) -> int:
        i %= len(self)
        return self.start[i + 1] - self.start[i]

    def lengths(self, i: int) -> tuple[list, list]:
        i %= len(self)
        a, b = self.start[i], self.start[i + 1]
        return self.prompt[a:b], self.output[a:b]

    @property
    def mean_turns(self) -> float:
        return len(self.prompt) / len(self)


def load_sharegpt_conversations(path: Path, bytes_per_token: Optional[float] = None) -> Conversations:
    """Every conversation with at least one (prompt, reply) pair: turns taken two by two in order
    (a trailing prompt without a reply is dropped), tokens estimated as `load_sharegpt` does. No
    length filter: a turn whose conversation outgrows max_model_len is rejected by the engine and
    ends its session."""
    path = Path(path)
    bpt = bytes_per_token or DEFAULT_BYTES_PER_TOKEN
    prompt, output, start = [], [], [0]
    for index, conv in _json_items(path, "conversation"):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise KvsimError(f"{path}: conversation {index}: expected an object with a \"conversations\" list")
        pairs = len(turns) // 2
        if not pairs:
            continue
        tokens = [_turn_tokens(path, index, t, bpt) for t in turns[:2 * pairs]]
        prompt += tokens[0::2]
        output += tokens[1::2]
        start.append(len(prompt))
        if len(prompt) > MAX_REQUESTS:
            raise KvsimError(f"{path}: more than {MAX_REQUESTS:,} turns")
    if len(start) < 2:
        raise KvsimError(f"{path}: no conversation has a prompt and a reply")
    return Conversations(prompt, output, start)


def load_vllm_bench(path: Path) -> Trace:
    """The request lengths of a `vllm bench serve --save-result --save-detailed` JSON."""
    path = Path(path)
    doc = read_json_object(path, "trace")
    lens = {}
    for key in ("input_lens", "output_lens"):
        values = doc.get(key)
        if not isinstance(values, list) or not values:
            raise KvsimError(f"{path}: {key}: missing or empty (save the result with vllm bench serve "
                             "--save-result --save-detailed)")
        lens[key] = [parse_len(path, 1, f"{key}[{i}]", v) for i, v in enumerate(values)]
    if len(lens["input_lens"]) != len(lens["output_lens"]):
        raise KvsimError(f"{path}: input_lens has {len(lens['input_lens'])} requests, output_lens "
                         f"{len(lens['output_lens'])}")
    n = len(lens["input_lens"])
    if n > MAX_REQUESTS:
        raise KvsimError(f"{path}: trace has more than {MAX_REQUESTS:,} requests")
    return sorted_trace(np.zeros(n), lens["input_lens"], lens["output_lens"])
