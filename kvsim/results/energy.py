"""The energy a run draws: an engine observer that adds up each step's joules (kvsim.perf.energy).

`EnergyMeter` hears every engine event, as `Metrics` does (kvsim.engine.interfaces.EngineObserver):
one step, or a fused run of decode steps (its steps' rows and keys in closed form: every context grows
by one a step, or a speculative cohort's run shape gives them). It prices the event's work per GPU
with the scenario's EnergyModel; a replica's GPUs draw their idle power whenever it has no step
running; the host's share and the facility's PUE come on top. `Observers` hands each event to the
metrics first (their sampling boundary steers fused runs) and to the meter after.

summary.json's "energy": GPU joules (busy and idle), the host's, the facility's (x PUE), kWh, and per
output token (J) and per million output tokens (kWh and energy US$), beside the GPU-hour cost of the
same tokens when the GPU has a price.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from kvsim.perf.energy import EnergyModel, StepWork


class EnergyMeter:
    """Joules per replica (module docstring). `gpus`: GPUs a replica (tp x dp); `draft`: the speculative
    drafter's StepWork (None: none), `k` its passes a step."""

    def __init__(self, model: EnergyModel, work: StepWork, gpus: int, draft: StepWork | None = None, k: int = 0):
        self.model, self.work, self.gpus, self.draft, self.k = model, work, gpus, draft, k
        self.busy_s: dict[int, float] = {}
        self.joules: dict[int, float] = {}  # per replica: one GPU's joules while running steps
        self.flops = self.bytes = 0.0  # per GPU, all replicas' steps
        # each event's end, and by then: busy joules, seconds, FLOPs and bytes (one GPU a replica)
        self.ends, self.log = array("d"), array("d")
        self.total_j = self.total_s = 0.0
        self.interval = 0.0

    # ---- EngineObserver ------------------------------------------------------------------------
    def on_reject(self, seq) -> None:
        pass

    def on_held_back(self, step) -> None:
        pass

    def on_step(self, step) -> None:
        flops, nbytes = self.event_work(step.batch, step.num_steps)
        r = step.replica
        self.flops += flops
        self.bytes += nbytes
        self.busy_s[r] = self.busy_s.get(r, 0.0) + step.duration
        joules = self.model.step_joules(step.duration, flops, nbytes)
        self.joules[r] = self.joules.get(r, 0.0) + joules
        self.total_j += joules
        self.total_s += step.duration
        self.ends.append(step.end)
        self.log.extend((self.total_j, self.total_s, self.flops, self.bytes))

    def by(self, t: float) -> tuple:
        """(busy joules, seconds, FLOPs, bytes) of one GPU a replica over the events that ended by `t`
        (events end in order per replica: the log is sorted for one replica, nearly so for several)."""
        i = bisect_right(self.ends, t)
        return tuple(self.log[4 * i - 4:4 * i]) if i else (0.0, 0.0, 0.0, 0.0)

    # ---- work ----------------------------------------------------------------------------------
    def event_work(self, batch, k: int) -> tuple[float, float]:
        """(FLOPs, bytes) per GPU of an event: `batch`, or a run of k decode steps starting with it."""
        nd, spec = batch.num_decode_seqs, batch.num_spec_tokens
        shape = batch.run_shape
        if k > 1 and shape is not None:  # a speculative cohort's run: its steps' totals
            rows, keys = shape.rows(k), shape.keys(k)
        elif k > 1:  # a cohort's run: every context grows by one a step
            rows, keys = k * nd, k * batch.decode_read_tokens + nd * k * (k - 1) / 2
        else:
            rows, keys = batch.num_prefill_tokens + nd + spec, batch.decode_read_tokens
        per_seq = (rows - batch.num_prefill_tokens) / (nd * max(k, 1)) if nd else 1.0  # a verify step's queries a sequence
        pairs = keys * per_seq + batch.prefill_attn_pairs * (k if k > 1 else 1)
        sampled = rows - batch.num_prefill_tokens + batch.num_prefill_seqs
        flops, nbytes = self.work.step(rows, sampled, pairs, keys + batch.prefill_context_tokens, k)
        if self.draft is not None:  # the drafter: a pass over the rows, then k - 1 of one row a sequence
            n, steps = nd + batch.num_prefill_seqs, max(k, 1)
            f2, b2 = self.draft.step(rows + (self.k - 1) * n * steps, self.k * n * steps, pairs + (self.k - 1) * keys,
                                     self.k * keys, self.k * steps)
            flops, nbytes = flops + f2, nbytes + b2
        return flops, nbytes

    # ---- the figures ---------------------------------------------------------------------------------
    def summary(self, duration_s: float, output_tokens: int, num_replicas: int, gpu_usd_per_hour: float | None,
                arrivals: dict | None = None) -> dict:
        """The figures; `arrivals` (Metrics' summary "arrivals"): also the GPU joules per output token over
        the arrival window, what a steady load costs without the drain at the end."""
        m = self.model
        busy_j = sum(self.joules.values()) * self.gpus
        busy_s = sum(self.busy_s.values())
        idle_s = max(0.0, num_replicas * duration_s - busy_s)
        idle_j = idle_s * m.power.idle_w * self.gpus
        gpu_j = busy_j + idle_j
        gpu_count = num_replicas * self.gpus
        host_j = m.host_w * gpu_count * duration_s
        facility_j = (gpu_j + host_j) * m.pue
        kwh = facility_j / 3.6e6
        per_m = 1e6 / output_tokens if output_tokens else None
        out = {"gpu_joules": gpu_j, "gpu_busy_joules": busy_j, "gpu_idle_joules": idle_j, "host_joules": host_j,
               "facility_joules": facility_j, "kwh": kwh,
               "mean_gpu_power_w": gpu_j / (gpu_count * duration_s) if duration_s > 0 else None,
               "busy_hbm_utilization": self.bytes / (busy_s * m.bandwidth) if busy_s > 0 else None,
               "busy_compute_utilization": self.flops / (busy_s * m.peak_flops) if busy_s > 0 else None,
               "gpu_joules_per_output_token": gpu_j / output_tokens if output_tokens else None,
               "joules_per_output_token": facility_j / output_tokens if output_tokens else None,
               "kwh_per_million_output_tokens": kwh * per_m if per_m else None,
               "energy_usd_per_million_output_tokens": kwh * m.usd_per_kwh * per_m if per_m else None,
               "gpu_hour_usd_per_million_output_tokens": (gpu_usd_per_hour * gpu_count * duration_s / 3600 * per_m
                                                          if per_m and gpu_usd_per_hour is not None else None),
               "model": m.describe()}
        if arrivals and arrivals.get("window_s") and arrivals.get("output_tokens_per_s"):
            start, end = arrivals["start_s"], arrivals["end_s"]
            tokens = arrivals["output_tokens_per_s"] * arrivals["window_s"]
            (j1, s1, f1, b1), (j0, s0, f0, b0) = self.by(end), self.by(start)
            out["window"] = {"gpu_joules_per_output_token": (j1 - j0) * self.gpus / tokens,
                             "busy_hbm_utilization": (b1 - b0) / ((s1 - s0) * m.bandwidth) if s1 > s0 else None,
                             "busy_compute_utilization": (f1 - f0) / ((s1 - s0) * m.peak_flops) if s1 > s0 else None,
                             "mean_busy_gpu_power_w": (j1 - j0) / (s1 - s0) if s1 > s0 else None,
                             "output_tokens_per_s": arrivals["output_tokens_per_s"]}
        return out


class Observers:
    """Hands each engine event to `primary` (the metrics: their `interval` and sampling boundary steer
    fused runs) and then to each of `others`."""

    def __init__(self, primary, *others):
        self.primary, self.others = primary, others
        self.interval = primary.interval

    def on_reject(self, seq) -> None:
        self.primary.on_reject(seq)
        for o in self.others:
            o.on_reject(seq)

    def on_held_back(self, step) -> None:
        self.primary.on_held_back(step)
        for o in self.others:
            o.on_held_back(step)

    def on_step(self, step) -> None:
        self.primary.on_step(step)
        for o in self.others:
            o.on_step(step)

    def __getattr__(self, name):  # the metrics' own methods (a closed loop's, the disaggregated observer's)
        return getattr(self.primary, name)


def energy_line(policy: str, summary: dict) -> list[str]:
    """The report's line on a policy's energy (none without an [energy] section)."""
    e = summary.get("energy")
    if not e or e.get("joules_per_output_token") is None:
        return []
    gpu_usd = e.get("gpu_hour_usd_per_million_output_tokens")
    return [f"  {policy}: {e['joules_per_output_token']:.3g} J per output token ({e['gpu_joules_per_output_token']:.3g} "
            f"at the GPUs, mean {e['mean_gpu_power_w']:.0f} W a GPU), {e['kwh_per_million_output_tokens']:.3g} kWh and "
            f"${e['energy_usd_per_million_output_tokens']:.3g} of energy per million output tokens"
            + (f" beside ${gpu_usd:.3g} of GPU-hours" if gpu_usd is not None else "") + " (estimated: kvsim.perf.energy)"]
