"""Streamed metrics of one policy's simulation: per-request rows, a time series, and the summary.

Nothing here keeps per-request objects, so a run of a million requests stays small: latencies live
in `array('d')` (8 bytes a value), the token-level inter-token latency (ITL) distribution in a fixed
log-spaced histogram, and the time series keeps one row per replica per `timeseries_interval_s`.
`Metrics` is the engine's observer (kvsim.engine.interfaces.EngineObserver): `on_reject(seq)`, then
per engine event `on_held_back(step)` (when requests wait) and `on_step(step)` with the replica's `StepRecord` (token
gaps, finished requests, the state after the step); `summary` gives the dict that goes into
`summary.json` under the policy's name. requests.csv holds times with
12 significant digits (0.1 µs on a day-long run): shortest-repr floats cost 3 s a million rows.

SLO figures (`summary["slo"]`, judged by kvsim.results.verdict): a request is good when it meets
every per-request bound of the SLO (TTFT, TPOT, E2E); goodput and attainment count good requests.
The figure at the SLO's percentile P is the nearest-rank value over every request received, a
rejected one counting as infinitely late: the smallest x such that at least P% of the requests had
a value <= x (None when more than 100 - P % were rejected). Token-level ITL is read from its
histogram at P. `summary["arrivals"]` says whether the engine kept up: the backlog is the requests
that had arrived but were not yet scheduled when the last one arrived.
"""

from __future__ import annotations

import csv
import io
import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsim.results.cells import csv_cell
from kvsim.results.distributions import LogHistogram, nearest_rank, stats_of
from kvsim.sequence import Sequence

if TYPE_CHECKING:
    from kvsim.engine.records import StepRecord
    from kvsim.scenario.config import SloConfig

REQUEST_COLUMNS = (
    "policy", "request_id", "status", "reject_reason", "arrival_s", "first_scheduled_s", "first_token_s",
    "finish_s", "ttft_s", "mean_itl_s", "e2e_s", "prompt_tokens", "output_tokens", "prefix_hit_tokens",
    "preemptions", "preempted_s",
)
TIMESERIES_COLUMNS = (
    "policy", "replica", "time_s", "running", "waiting", "swapped", "kv_blocks_used", "kv_blocks_cached",
    "kv_blocks_free", "reserved_unused_tokens", "external_fragmentation", "batch_tokens",
)
SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
ITL_BUFFER = 1 << 16
TIME = "%.12g"  # requests.csv's float format


@dataclass(slots=True)
class _ReplicaSeries:
    """Time-series state of one replica: the open bucket's last sample and the KV-usage integral."""

    index: int = 0  # which replica
    bucket: int = -1
    bucket_end: float = -math.inf  # a little before the open bucket's end (see Metrics.sample)
    last: tuple = ()  # (t, running, waiting, swapped, used, cached, free, reserved_unused, ext_frag) of the open bucket
    batch_max: int = 0
    running: int = 0
    waiting: int = 0
    first_t: float = -1.0
    last_t: float = -1.0
    used_seconds: float = 0.0  # integral of blocks_used over time (block-seconds)
    last_used: int = 0
    peak_used: int = 0
    peak_external_fragmentation: float = 0.0


class Metrics:
    """Collects one policy's results as the simulation runs; see the module docstring."""

    def __init__(self, policy: str, slo: SloConfig, timeseries_interval_s: float, requests_file=None,
                 request_overhead_s: float = 0.0):
        """`requests_file`: a text file (opened with newline="") that gets one requests.csv row per request.
        `request_overhead_s`: the API server's time (HTTP, tokenize, detokenize, stream) added to every
        request's TTFT and E2E; the engine never sees it, so its step times and ITLs are unchanged."""
        self.policy = policy
        self.request_overhead_s = request_overhead_s
        self.slo = slo
        self._ttft_ms, self._tpot_ms, self._e2e_ms = (math.inf if v is None else v
                                                      for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))
        self.interval = timeseries_interval_s
        self.requests_file = requests_file
        self.requests_csv = csv.writer(requests_file) if requests_file is not None else None
        self._csv_policy = csv_cell(policy)  # a name a spreadsheet would run as a formula starts with '
        cell = io.StringIO()
        csv.writer(cell).writerow((self._csv_policy,))  # quoted as the csv module would; a '%' is not a format
        self._finished_row = (cell.getvalue().rstrip("\r\n").replace("%", "%%") + ",%d,finished,,"
                              + ",".join([TIME] * 5)
                              + ",%s," + TIME + ",%d,%d,%d,%d," + TIME + "\r\n")
        self.ttft = array("d")
        self.e2e = array("d")
        self.tpot = array("d")  # per-request mean ITL, requests with >= 2 output tokens only
        self.first_scheduled = array("d")  # of finished requests, for the backlog at the last arrival
        self._preempted_s = array("d")  # per finished request, for the report's "why it missed"
        self._missed = array("b")  # per finished request: 1 when it misses a per-request SLO bound
        self.itl = LogHistogram()
        self._itl_runs: list = []  # (gap, count, gap, count) records not yet binned, flat
        self._itl_gaps: list[float] = []  # single gaps not yet binned
        self.num_finished = 0
        self.num_good = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.first_arrival, self.last_arrival = math.inf, -math.inf
        self._finish_times = array("d")  # per finished request, for figures over the arrival window
        self._finish_tokens = array("q")  # its prompt + output tokens
        self._finish_outputs = array("q")
        self.prefix_hit_tokens = 0
        self.preemptions = 0
        self._replicas: dict[int, _ReplicaSeries] = {}
        self._rows: list[tuple] = []
        self._running_now = 0  # summed over replicas, from each one's latest sample
        self._waiting_now = 0
        self.peak_running = 0
        self.peak_waiting = 0
        # Replica-seconds that waiting requests were held back, by the limit that held them
        # (Scheduler.admission_limit: kv_cache, max_num_seqs, token_budget).
        self.admission_blocked_s: dict[str, float] = {}

    # ---- the engine's observer (kvsim.engine.interfaces.EngineObserver)

    def on_held_back(self, step: StepRecord) -> None:
        """A step is planned while requests wait: held back for its duration by what stopped admission."""
        self.held_back(step.admission_limit, step.duration)

    def on_step(self, step: StepRecord) -> None:
        """A step ran: its token gaps, its finished requests, the replica's state (and inside a fused
        run, the state at the last step of each sampling interval it crossed)."""
        if step.itl_gaps:
            self.record_itls(step.itl_gaps)
        size = step.cohort_size
        if size:  # record_run_itl, written out: every engine event has one
            runs = self._itl_runs
            runs += (step.cohort_first_gap, size, step.cohort_later_gap, size * (step.num_steps - 1))
            if len(runs) >= ITL_BUFFER:
                self._flush_itl()
        for seq in step.finished:
            self.on_finish(seq)
        r = self._replicas.get(step.replica) or self.series(step.replica)
        peak = step.peak_used
        if peak >= 0:
            for sample, batch_tokens in step.marks:
                self._record_sample(r, sample, batch_tokens, 0.0)
            if peak > r.peak_used:  # note_used
                r.peak_used = peak
        self._record_sample(r, step.sample, step.batch_tokens, step.used_block_s)
        step.sample_boundary = r.bucket_end

    # ---- requests

    def on_finish(self, seq: Sequence) -> None:
        arrival = seq.request.arrival_time
        ttft = seq.first_token_time - arrival + self.request_overhead_s
        e2e = seq.finish_time - arrival + self.request_overhead_s
        n_out = seq.num_output_tokens
        tpot = (seq.finish_time - seq.first_token_time) / (n_out - 1) if n_out > 1 else None
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        if arrival > self.last_arrival:  # arrivals come in order: the first sets both
            self.last_arrival = arrival
            if arrival < self.first_arrival:
                self.first_arrival = arrival
        elif arrival < self.first_arrival:
            self.first_arrival = arrival
        self._finish_times.append(seq.finish_time)
        self._finish_tokens.append(seq.request.prompt_len + n_out)
        self._finish_outputs.append(n_out)
        if tpot is not None:
            self.tpot.append(tpot)
        self.first_scheduled.append(seq.first_scheduled_time)
        self.num_finished += 1
        self._preempted_s.append(seq.preempted_s)
        if ttft * 1e3 <= self._ttft_ms and e2e * 1e3 <= self._e2e_ms and (tpot is None or tpot * 1e3 <= self._tpot_ms):
            self.num_good += 1  # meets every per-request bound (an absent one is infinite); one token has no TPOT to miss
            self._missed.append(0)
        else:
            self._missed.append(1)
        self.prompt_tokens += seq.request.prompt_len
        self.output_tokens += n_out
        self.prefix_hit_tokens += seq.num_cached_tokens
        self.preemptions += seq.num_preemptions
        if self.requests_file is not None:  # a finished request has every time set
            r = seq.request
            self.requests_file.write(self._finished_row % (
                r.request_id, arrival, seq.first_scheduled_time, seq.first_token_time, seq.finish_time, ttft,
                "" if tpot is None else TIME % tpot, e2e, r.prompt_len, n_out, seq.num_cached_tokens,
                seq.num_preemptions, seq.preempted_s))

    def _arrived(self, t: float) -> None:
        if t < self.first_arrival:
            self.first_arrival = t
        if t > self.last_arrival:
            self.last_arrival = t

    def on_reject(self, seq: Sequence) -> None:
        self._arrived(seq.request.arrival_time)
        reason = seq.reject_reason or "unknown"
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
        self.preemptions += seq.num_preemptions
        self._write_rejected_row(seq)

    def _write_rejected_row(self, seq: Sequence) -> None:
        if self.requests_csv is None:
            return
        r = seq.request
        self.requests_csv.writerow((
            self._csv_policy, r.request_id, "rejected", seq.reject_reason, TIME % r.arrival_time,
            "" if seq.first_scheduled_time < 0 else TIME % seq.first_scheduled_time,
            "" if seq.first_token_time < 0 else TIME % seq.first_token_time,
            "" if seq.finish_time < 0 else TIME % seq.finish_time, "", "", "",
            r.prompt_len, seq.num_output_tokens, seq.num_cached_tokens, seq.num_preemptions, TIME % seq.preempted_s))

    def _itlstats_of(self) -> dict:
        self._flush_itl()
        return self.itl.stats()

    def record_itl(self, gap_s: float, count: int = 1) -> None:
        """`count` inter-token gaps of `gap_s` seconds (buffered, binned in bulk)."""
        self.record_run_itl(gap_s, count, 0.0, 0)

    def record_run_itl(self, first_gap_s: float, num_seqs: int, later_gap_s: float, later_count: int) -> None:
        """A decode run's gaps: num_seqs of first_gap_s (its first step), later_count of later_gap_s."""
        runs = self._itl_runs
        runs += (first_gap_s, num_seqs, later_gap_s, later_count)
        if len(runs) >= ITL_BUFFER:
            self._flush_itl()

    def record_itls(self, gaps: list[float]) -> None:
        """One inter-token gap each."""
        self._itl_gaps += gaps
        if len(self._itl_gaps) >= ITL_BUFFER:
            self._flush_itl()

    def _flush_itl(self) -> None:
        if self._itl_runs:
            runs = np.array(self._itl_runs, dtype=np.float64).reshape(-1, 2)  # (gap, count) rows
            self.itl.add_many(runs[:, 0], runs[:, 1].astype(np.int64))
            self._itl_runs.clear()
        if self._itl_gaps:
            self.itl.add_many(self._itl_gaps)
            self._itl_gaps.clear()

    def held_back(self, limit: str, seconds: float) -> None:
        """Waiting requests were held back by `limit` for an engine event of `seconds`."""
        blocked = self.admission_blocked_s
        blocked[limit] = blocked.get(limit, 0.0) + seconds

    # ---- time series (called every engine step: keep it cheap)

    def series(self, replica: int) -> _ReplicaSeries:
        """The replica's time series, which `sample` takes."""
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _ReplicaSeries(replica)
        return r

    def sample(self, t: float, r: _ReplicaSeries, running: int, waiting: int, swapped: int, blocks_used: int,
               blocks_cached: int, blocks_free: int, reserved_unused_tokens: int, batch_tokens: int,
               external_fragmentation: float = 0.0, used_block_s: float = -1.0) -> None:
        """The replica's state after an engine step ending at t (`r`: `series(replica)`).
        `used_block_s`: the KV block-seconds since the previous sample, when the engine knows them
        exactly (a fused run); by default the previous sample's use held until t."""
        self._record_sample(r, (t, running, waiting, swapped, blocks_used, blocks_cached, blocks_free,
                                reserved_unused_tokens, external_fragmentation), batch_tokens, used_block_s)

    def _record_sample(self, r: _ReplicaSeries, sample: tuple, batch_tokens: int, used_block_s: float) -> None:
        """`sample` laid out as kvsim.engine.records.SAMPLE_FIELDS (kept as the open bucket's last)."""
        t, running, waiting, _, blocks_used, _, _, _, external_fragmentation = sample
        if t >= r.bucket_end:
            self._next_bucket(r, t, batch_tokens)
        elif batch_tokens > r.batch_max:
            r.batch_max = batch_tokens
        r.used_seconds += r.last_used * (t - r.last_t) if used_block_s < 0 else used_block_s
        r.last = sample
        if external_fragmentation > r.peak_external_fragmentation:
            r.peak_external_fragmentation = external_fragmentation
        r.last_t, r.last_used = t, blocks_used
        if blocks_used > r.peak_used:
            r.peak_used = blocks_used
        if running != r.running:  # the replicas' sums and their peaks move only when a count does
            self._running_now += running - r.running
            r.running = running
            if self._running_now > self.peak_running:
                self.peak_running = self._running_now
        if waiting != r.waiting:
            self._waiting_now += waiting - r.waiting
            r.waiting = waiting
            if self._waiting_now > self.peak_waiting:
                self.peak_waiting = self._waiting_now

    def note_used(self, r: _ReplicaSeries, blocks_used: int) -> None:
        """A sample's KV use that no row shows (inside a fused run): it counts for the peak."""
        if blocks_used > r.peak_used:
            r.peak_used = blocks_used

    def _next_bucket(self, r: _ReplicaSeries, t: float, batch_tokens: int) -> None:
        """Close the open row if t is in a later bucket. `bucket_end` sits 1e-12 (relative) before
        the true end, so float rounding never lets a later bucket through: t between the two lands
        here and finds its bucket by floor division, as rows are keyed."""
        bucket = int(t // self.interval)
        if bucket == r.bucket:
            if batch_tokens > r.batch_max:
                r.batch_max = batch_tokens
            return
        if r.last:
            self._rows.append(self._row(r))
        else:
            r.first_t = r.last_t = t
        r.bucket = bucket
        r.bucket_end = (bucket + 1) * self.interval * (1 - 1e-12)
        r.batch_max = batch_tokens

    def _row(self, r: _ReplicaSeries) -> tuple:
        last = r.last  # (t, counts..., external fragmentation)
        return (self.policy, r.index, round(last[0], 6), *last[1:8], round(last[8], 6), r.batch_max)

    def timeseries_rows(self) -> list[tuple]:
        """Rows for timeseries.csv (columns `TIMESERIES_COLUMNS`), by time then replica."""
        open_rows = [self._row(r) for r in self._replicas.values() if r.last]
        return sorted(self._rows + open_rows, key=lambda row: (row[2], row[1]))

    def latencies(self) -> dict[str, np.ndarray]:
        """The finished requests' TTFT, mean ITL and E2E, named as requests.csv's columns (mean_itl_s:
        requests with two or more output tokens only); and, a value per finished request in finishing
        order, where its time went (queued_s, prefill_s: first scheduled to first token, decode_s,
        preempted_s: part of those two) and whether it missed a per-request SLO bound (missed)."""
        ttft, e2e = np.frombuffer(self.ttft, dtype=np.float64), np.frombuffer(self.e2e, dtype=np.float64)
        arrival = np.frombuffer(self._finish_times, dtype=np.float64) - e2e
        queued = np.frombuffer(self.first_scheduled, dtype=np.float64) - arrival
        return {"ttft_s": ttft, "mean_itl_s": np.frombuffer(self.tpot, dtype=np.float64), "e2e_s": e2e,
                "queued_s": queued, "prefill_s": ttft - queued, "decode_s": e2e - ttft,
                "preempted_s": np.frombuffer(self._preempted_s, dtype=np.float64),
                "missed": np.frombuffer(self._missed, dtype=np.int8).astype(bool)}

    # ---- summary

    def _slo_summary(self, rejected: int) -> dict:
        """Each SLO figure at the SLO's percentile (ms; rejected requests infinitely late) beside its bound."""
        slo, q = self.slo, self.slo.percentile
        self._flush_itl()
        itl = self.itl.percentile(q)
        figures = {
            "ttft_ms": nearest_rank(np.frombuffer(self.ttft, dtype=np.float64), rejected, q),
            "tpot_ms": nearest_rank(np.frombuffer(self.tpot, dtype=np.float64), rejected, q),
            "itl_ms": itl,
            "e2e_ms": nearest_rank(np.frombuffer(self.e2e, dtype=np.float64), rejected, q),
        }
        received = self.num_finished + rejected
        return {"percentile": q,
                "bounds": {k: getattr(slo, k) for k in SLO_KEYS},
                "at_percentile": {k: None if v is None else v * 1e3 for k, v in figures.items()},
                "served_fraction": self.num_finished / received if received else None}

    def _kv_summary(self, num_blocks: int, block_size: int, bytes_per_block: int, num_replicas: int = 1,
                    replicas=None) -> dict:
        """Fractions are of one replica's blocks: the peak is the largest one replica reached; the
        mean is time-weighted over each replica's samples (a value holds until the next sample) and
        averaged over replicas by time. `replicas`: the ones counted (default all; a disaggregated
        deployment's decode pool)."""
        reps = [r for i, r in sorted(self._replicas.items()) if r.last and (replicas is None or i in replicas)]
        per_replica = num_blocks // num_replicas
        peak = max((r.peak_used for r in reps), default=0)
        span = sum(r.last_t - r.first_t for r in reps)
        used_seconds = sum(r.used_seconds for r in reps)
        if span > 0:
            mean_frac = used_seconds / span / per_replica
        elif reps:  # one instant per replica: the plain mean of the samples
            mean_frac = sum(r.last[4] for r in reps) / len(reps) / per_replica
        else:
            mean_frac = None
        return {"num_blocks": num_blocks, "num_blocks_per_replica": per_replica, "block_size": block_size,
                "bytes_per_block": bytes_per_block,
                "peak_used_blocks": peak, "peak_used_fraction": peak / per_replica if per_replica else None,
                "mean_used_fraction": mean_frac if per_replica else None,
                "peak_external_fragmentation": max((r.peak_external_fragmentation for r in reps), default=0.0)}

    def _arrivals_summary(self, received: int) -> dict:
        """The arrival window (first to last arrival), the rate offered over it, the throughput over it
        (requests finished by the last arrival), and the backlog then: finished requests first scheduled
        after the last arrival. The whole run's throughput also counts the drain at the end."""
        start, end = self.first_arrival, self.last_arrival
        width = end - start if received else 0.0
        backlog = int(np.count_nonzero(np.frombuffer(self.first_scheduled, dtype=np.float64) > end))
        out = {"start_s": start if received else None, "end_s": end if received else None,
               "window_s": width if received else None, "offered_rps": None, "requests_per_s": None,
               "output_tokens_per_s": None, "total_tokens_per_s": None,
               "backlog_at_last_arrival": backlog, "backlog_fraction": backlog / received if received else None}
        if width > 0:
            done = np.frombuffer(self._finish_times, dtype=np.float64) <= end
            out.update(offered_rps=(received - 1) / width, requests_per_s=int(done.sum()) / width,
                       output_tokens_per_s=int(np.frombuffer(self._finish_outputs, dtype=np.int64)[done].sum()) / width,
                       total_tokens_per_s=int(np.frombuffer(self._finish_tokens, dtype=np.int64)[done].sum()) / width)
        return out

    def summary(self, *, duration_s: float, num_blocks: int, block_size: int, bytes_per_block: int,
                extra: dict | None = None, num_replicas: int = 1, kv_replicas=None) -> dict:
        """The policy's figures as plain JSON values; undefined ones (no finished request) are None."""
        rejected = sum(self.rejected_by_reason.values())
        received = self.num_finished + rejected
        per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)
        out = {
            "requests": {"received": received, "finished": self.num_finished, "rejected": rejected,
                         "rejected_by_reason": dict(sorted(self.rejected_by_reason.items()))},
            "ttft_s": stats_of(np.frombuffer(self.ttft, dtype=np.float64)),
            "e2e_s": stats_of(np.frombuffer(self.e2e, dtype=np.float64)),
            "tpot_s": stats_of(np.frombuffer(self.tpot, dtype=np.float64)),
            "itl_s": self._itlstats_of(),
            "throughput": {"requests_per_s": per_s(self.num_finished),
                           "output_tokens_per_s": per_s(self.output_tokens),
                           "total_tokens_per_s": per_s(self.prompt_tokens + self.output_tokens)},
            "goodput_rps": per_s(self.num_good),
            "slo_attainment": self.num_good / received if received else None,
            "slo": self._slo_summary(rejected),
            "arrivals": self._arrivals_summary(received),
            "peak_running": self.peak_running,
            "peak_waiting": self.peak_waiting,
            "admission_blocked_s": dict(sorted(self.admission_blocked_s.items())),
            "kv": self._kv_summary(num_blocks, block_size, bytes_per_block, num_replicas, kv_replicas),
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else None,
            "duration_s": duration_s,
        }
        out.update(extra or {})
        return out
