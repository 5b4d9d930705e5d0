"""llm-d inference-perf result folders: what ran, what it measured, and the same figures from a simulation.

inference-perf (github.com/kubernetes-sigs/inference-perf) writes, per run, its resolved configuration
(`config.yaml`) and one `stage_<i>_lifecycle_metrics.json` per load stage: the stage's requested and
achieved rate and, over its successful requests, the distributions (mean and percentiles, numpy's linear
interpolation) of `time_to_first_token`, `time_per_output_token`, `inter_token_latency` and
`request_latency` (E2E), with `prompt_len` and `output_len` (both counted by re-tokenizing the text).

`read_run(folder)` reads such a folder (or the experiment folder above its `results/`) into an
`InferencePerfRun`. The resolved `config.yaml` is what ran: a request file may hold keys its release did
not know, which it ignored (the runs in ../shared/groundtruth asked for `num_unique_system_prompts`,
`num_users_per_system_prompt` and `enable_multi_turn_chat`; their inference-perf, of late 2025, resolved
10 groups of 10 single-turn prompts). Workloads read: `shared_prefix` data (its SharedPrefixDataGenerator:
`num_groups` random system prompts of `system_prompt_len` token ids, each followed by
`num_prompts_per_group` random questions of `question_len`, every prompt decoded to text and shuffled
once; request n of a stage sends prompt n mod the pool, so a prompt comes back every pool-size requests),
`constant` or `poisson` load stages (`ConstantLoadTimer`: rate x duration exponential gaps rescaled to
sum to the duration, a Poisson process given its count; `PoissonLoadTimer`: a Poisson count each second),
streaming completions, `ignore_eos` (every request generates its `output_len`). Multi-turn chat and
other data or load types are refused in one line.

Token counts: the prompt's tokens are what the tokenizer makes of the decoded text (a few percent more
than the ids drawn), so the pool's lengths come from the measured `prompt_len` (its mean and spread),
the shared system prompt scaled by the same ratio plus the BOS token.

What inference-perf's figures mean (`StreamTiming`): TTFT is the first streamed line's arrival after the
request was sent, E2E the end of the response (after the client tokenized it), and TPOT the time from
the first to the last line over (lines - 1), ITL the gaps between lines. Before its SSE parser (2026)
every line of the stream counted, the blank line after each `data:` event too, so a request of N tokens
had 2N + 2 lines: its TPOT is (E2E - TTFT) / (2N + 1), about half the time per token, and half its ITLs
are the microseconds between an event and its blank line. Later releases count content chunks (one a
token). `stream_timing` tells which from the figures themselves ((E2E - TTFT) / TPOT of the stage means
is 2N + 1 or N - 1) and `predicted_figures` states a simulation's figures the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.files import parse_json, parse_yaml, read_text

METRICS = {"ttft": "time_to_first_token", "tpot": "time_per_output_token", "itl": "inter_token_latency",
           "e2e": "request_latency"}
STATS = ("mean", "p50", "p90", "p99")
_KEY = {"p50": "median"}
_STAGE_FILE = re.compile(r"stage_(\d{1,4})_lifecycle_metrics\.json")
MAX_STAGES = 1000


@dataclass(slots=True, frozen=True)
class StreamTiming:
    """How a run's TPOT and ITL count a request's stream: `lines_per_token` lines a token (2: every SSE
    line, 1: content chunks) and `extra_lines` after the last token ([DONE] and its blank line)."""

    lines_per_token: int
    extra_lines: int

    def tpot_divisor(self, output_tokens: int) -> int:
        """(E2E - TTFT) over this is a request's TPOT as the tool reports it."""
        return self.lines_per_token * output_tokens + self.extra_lines - 1

    def zero_gaps(self, output_tokens: int) -> float:
        """The share of a request's line gaps that are not a wait for a token (an event's blank line)."""
        return 1.0 - (output_tokens - 1) / self.tpot_divisor(output_tokens)


PER_LINE = StreamTiming(2, 2)  # inference-perf before its SSE parser: each data line and blank line
PER_CHUNK = StreamTiming(1, 0)  # content chunks: one a token


@dataclass(slots=True)
class Stage:
    """One load stage: its rate and duration as configured, and what it measured (seconds)."""

    index: int
    rate: float
    duration_s: float
    achieved_rate: float
    count: int
    failures: int
    measured: dict  # (metric, stat) -> seconds; metric in METRICS, stat in STATS
    prompt_len: dict  # mean, p25, p75, min, max of the prompt tokens (re-tokenized)
    output_len_mean: float

    @property
    def num_requests(self) -> int:
        return int(self.rate * self.duration_s)


@dataclass(slots=True)
class InferencePerfRun:
    """What one inference-perf run sent and measured (`read_run`)."""

    folder: Path
    load_type: str
    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    ignore_eos: bool
    streaming: bool
    stages: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def timing(self) -> StreamTiming:
        return stream_timing(self.stages, self.output_len)

    def workload(self, stage: Stage, seed: int = 0) -> dict:
        """kvsim's [workload] for one stage (a scenario's table, as TOML would give it)."""
        prefix_len, question = pool_lengths(self, stage)
        return {"seed": seed, "num_requests": stage.num_requests,
                "arrival": {"process": "poisson", "rate": stage.rate},
                "prompt_len": question, "output_len": {"dist": "fixed", "value": self.output_len},
                "prefix": {"num_groups": self.num_groups, "prefix_len": prefix_len,
                           "prompts_per_group": self.prompts_per_group}}


def pool_lengths(run: InferencePerfRun, stage: Stage) -> tuple[int, dict]:
    """(system prompt tokens with BOS, the questions' length distribution) from the measured prompt
    lengths: the ids drawn re-tokenize to `ratio` times as many tokens, the system prompt's as many."""
    p = stage.prompt_len
    drawn = run.system_prompt_len + run.question_len
    ratio = (p["mean"] - 1) / drawn if drawn else 1.0
    prefix = max(1, 1 + round(run.system_prompt_len * ratio))
    mean_q = max(1.0, p["mean"] - prefix)
    spread = (p["p75"] - p["p25"]) / 1.349 / mean_q  # the normal's sigma from the quartiles, relative
    lo, hi = max(1, int(p["min"]) - prefix), max(1, int(p["max"]) - prefix)
    if spread <= 0.01 or hi <= lo:
        return prefix, {"dist": "fixed", "value": max(1, round(mean_q))}
    return prefix, {"dist": "lognormal", "mean": mean_q, "sigma": min(spread, 3.0), "min": lo, "max": hi}


def stream_timing(stages: list, output_tokens: int) -> Optional[StreamTiming]:
    """PER_LINE or PER_CHUNK, whichever the stage means say ((E2E - TTFT) / TPOT within 3% of its
    divisor in every stage), or None (neither: TPOT and ITL are not compared)."""
    for timing in (PER_LINE, PER_CHUNK):
        want = timing.tpot_divisor(output_tokens)
        ok = [s for s in stages if ("tpot", "mean") in s.measured and s.measured["tpot", "mean"] > 0]
        if ok and all(abs((s.measured["e2e", "mean"] - s.measured["ttft", "mean"]) / s.measured["tpot", "mean"]
                          / want - 1) < 0.03 for s in ok):
            return timing
    return None


def _results_folder(folder: Path) -> Path:
    folder = Path(folder)
    if (folder / "results" / "config.yaml").is_file():
        return folder / "results"
    if (folder / "config.yaml").is_file():
        return folder
    raise KvsimError(f"{folder}: not an inference-perf result folder (no config.yaml, nor results/config.yaml)")


def _get(data, path: str, source: str, kind=None, default=None):
    value = data
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            if default is not None:
                return default
            raise KvsimError(f"{source}: {path}: missing")
        value = value[key]
    if kind is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
        raise KvsimError(f"{source}: {path}: expected {getattr(kind, '__name__', kind)}, got {str(value)[:40]!r}")
    return value


def _count(data, path: str, source: str, low: int = 1, high: int = 1 << 20, default=None) -> int:
    value = _get(data, path, source, int, default)
    if not low <= value <= high:
        raise KvsimError(f"{source}: {path}: must be between {low:,} and {high:,}, got {value:,}")
    return value


def read_config(results: Path) -> dict:
    """The resolved config.yaml's workload, one line for what kvsim cannot replay."""
    path = results / "config.yaml"
    src = str(path)
    data = parse_yaml(read_text(path, "inference-perf config"), src)
    if not isinstance(data, dict):
        raise KvsimError(f"{src}: expected a mapping (inference-perf's resolved configuration)")
    kind = _get(data, "data.type", src, str)
    if kind != "shared_prefix":
        raise KvsimError(f"{src}: data.type: {kind!r} data is not read (shared_prefix is)")
    sp = _get(data, "data.shared_prefix", src, dict)
    if sp.get("enable_multi_turn_chat"):
        raise KvsimError(f"{src}: data.shared_prefix.enable_multi_turn_chat: multi-turn chat is not read")
    load = _get(data, "load.type", src, str)
    if load not in ("constant", "poisson"):
        raise KvsimError(f"{src}: load.type: {load!r} load is not read (constant and poisson are)")
    stages = _get(data, "load.stages", src, list)
    if not stages or len(stages) > MAX_STAGES:
        raise KvsimError(f"{src}: load.stages: expected 1 to {MAX_STAGES} stages")
    for i, st in enumerate(stages):
        rate, dur = _get(st, "rate", f"{src}: load.stages[{i}]"), _get(st, "duration", f"{src}: load.stages[{i}]")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e6 for v in (rate, dur)):
            raise KvsimError(f"{src}: load.stages[{i}]: rate and duration must be positive numbers")
    streaming = _get(data, "api.streaming", src, bool, False)
    if not streaming:
        raise KvsimError(f"{src}: api.streaming: a run without streaming measures no TTFT or TPOT")
    groups = _count(sp, "num_unique_system_prompts", src, default=10)  # the later releases' alias
    return {"num_groups": _count(sp, "num_groups", src, default=groups),
            "prompts_per_group": _count(sp, "num_prompts_per_group", src,
                                        default=_count(sp, "num_users_per_system_prompt", src, default=10)),
            "system_prompt_len": _count(sp, "system_prompt_len", src, 0),
            "question_len": _count(sp, "question_len", src, 1), "output_len": _count(sp, "output_len", src),
            "ignore_eos": _get(data, "server.ignore_eos", src, bool, False), "streaming": streaming,
            "load_type": load, "stages": [(float(s["rate"]), float(s["duration"])) for s in stages]}


def _stat(dist, stat: str, src: str) -> float:
    value = dist.get(_KEY.get(stat, stat)) if isinstance(dist, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise KvsimError(f"{src}: {stat}: expected a non-negative number of seconds, got {str(value)[:40]!r}")
    return float(value)


def read_stage(path: Path, index: int, rate: float, duration: float) -> Stage:
    src = str(path)
    data = parse_json(read_text(path, "inference-perf stage metrics"), src)
    if not isinstance(data, dict):
        raise KvsimError(f"{src}: expected a JSON object (inference-perf lifecycle metrics)")
    ok = _get(data, "successes", src, dict)
    latency = _get(ok, "latency", src + ": successes", dict)
    measured = {}
    for short, name in METRICS.items():
        dist = latency.get(name)
        if dist is None:
            continue
        for stat in STATS:
            measured[short, stat] = _stat(dist, stat, f"{src}: successes.latency.{name}")
    if ("ttft", "mean") not in measured or ("e2e", "mean") not in measured:
        raise KvsimError(f"{src}: successes.latency: no time_to_first_token or request_latency")
    plen = _get(ok, "prompt_len", src + ": successes", dict)
    prompt = {k: _stat(plen, k, f"{src}: successes.prompt_len") for k in ("mean", "p25", "p75", "min", "max")}
    load = data.get("load_summary") or {}
    achieved = load.get("achieved_rate", rate)
    failures = (data.get("failures") or {}).get("count", 0)
    return Stage(index, rate, duration, float(achieved) if isinstance(achieved, (int, float)) else rate,
                 _count(ok, "count", src, 0, 1 << 30), int(failures) if isinstance(failures, int) else 0,
                 measured, prompt, _stat(_get(ok, "output_len", src, dict), "mean", f"{src}: output_len"))


def read_run(folder: Path) -> InferencePerfRun:
    """An inference-perf result folder (or the folder above its results/): the workload it resolved and
    each stage's measured figures, one line for anything missing or not replayable."""
    results = _results_folder(folder)
    cfg = read_config(results)
    found = {}
    for p in results.iterdir():
        m = _STAGE_FILE.fullmatch(p.name)
        if m:
            found[int(m.group(1))] = p
    if not found:
        raise KvsimError(f"{results}: no stage_<i>_lifecycle_metrics.json "
                         "(run with report.request_lifecycle.per_stage)")
    run = InferencePerfRun(Path(folder), cfg["load_type"], cfg["num_groups"], cfg["prompts_per_group"],
                           cfg["system_prompt_len"], cfg["question_len"], cfg["output_len"], cfg["ignore_eos"],
                           cfg["streaming"])
    for i, path in sorted(found.items()):
        if i >= len(cfg["stages"]):
            raise KvsimError(f"{path}: stage {i}, but config.yaml has {len(cfg['stages'])} load stages")
        run.stages.append(read_stage(path, i, *cfg["stages"][i]))
    if not run.ignore_eos:
        run.notes.append("server.ignore_eos is false: outputs are taken at their requested length, an upper bound")
    return run


def predicted_figures(latencies: dict, token_gaps, output_tokens: int, timing: Optional[StreamTiming]) -> dict:
    """A simulation's figures as inference-perf reports them: (metric, stat) -> seconds. `latencies` holds
    the finished requests' ttft_s and e2e_s (kvsim.results.metrics.Metrics.latencies), `token_gaps` the
    token-level ITL distribution (its `percentile(q)`, q in [0, 100]). TPOT and ITL follow `timing`
    (none: not stated); ITL percentiles at or below the share of zero gaps are left out (a client's
    parse time, which no engine model holds)."""
    ttft, e2e = latencies["ttft_s"], latencies["e2e_s"]
    out = {}
    for stat in STATS:
        for metric, values in (("ttft", ttft), ("e2e", e2e)):
            out[metric, stat] = _summarize(values, stat)
    if timing is None or output_tokens < 2:
        return out
    tpot = (e2e - ttft) / timing.tpot_divisor(output_tokens)
    zero = timing.zero_gaps(output_tokens)
    for stat in STATS:
        out["tpot", stat] = _summarize(tpot, stat)
        if stat == "mean":
            out["itl", stat] = out["tpot", stat]
            continue
        q = float(stat[1:]) / 100
        if q > zero + 0.01:
            value = token_gaps.percentile(100 * (q - zero) / (1 - zero))
            if value is not None:
                out["itl", stat] = float(value)
    return out


def _summarize(values, stat: str) -> float:
    """numpy's mean or linear-interpolated percentile, as inference-perf summarizes."""
    return float(np.mean(values)) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def relative_errors(predicted: dict, measured: dict) -> dict:
    """(metric, stat) -> predicted / measured - 1, over the figures both hold."""
    return {k: predicted[k] / measured[k] - 1 for k in predicted if k in measured and measured[k] > 0
            and math.isfinite(predicted[k])}
