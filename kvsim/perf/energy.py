"""Energy: a power model per GPU preset, the work a step does, and what a run's joules cost.

A GPU holding a model draws `idle_w` doing nothing. While the engine runs a step it draws

    P = idle_w + active_w + memory_w * u_mem + compute_w * u_comp       (at most the power limit)

with u_mem = the step's HBM bytes / (its seconds x datasheet bandwidth) and u_comp = its FLOPs / (its
seconds x datasheet dense peak), per GPU. `active_w` is what running kernels at all costs (clocks up,
the SMs' and memory controllers' baseline); the two terms on top follow how much of the memory system
and of the tensor cores the step keeps busy. A step that waits for the host (a small batch, a CPU-bound
engine) has low utilisation and draws little beyond active_w for its whole duration: the static power
ML.ENERGY calls wasted. Energy is linear in the work, so a fused run of decode steps costs its total
bytes and FLOPs in closed form; the limit is applied to a run's mean power (an estimate within a run
whose steps straddle it).

Where the numbers come from (each preset's `sources`):
- idle and board power: NVIDIA datasheets (H100 SXM and H200: 700 W; A100 SXM 400 W; B200 1000 W;
  L40S 350 W; AMD MI300X 750 W); idle draw of a GPU with a model loaded, nvidia-smi, public reports;
- active and compute watts (H100: 337 W and 871 W): least squares on ML.ENERGY Leaderboard v3.0's
  average GPU power of Llama-3.1-8B on one H100 (vLLM 0.11.1, LMArena chat, max_num_seqs 16-128 under
  the power limit: 513 W at 16 rising to 690 W from 192 on), with u_mem and u_comp as kvsim's own steps
  give them (benchmarks/energy_mlenergy.py, which also holds out the 70B-on-4-GPUs curve); memory watts
  (110 W) fixed, not fitted (every point streams the weights at a similar utilisation, so the data
  cannot tell memory from baseline): HBM3 at ~4 pJ/bit x 3.35 TB/s, an estimate. The compute term
  carries whatever grows with the batch besides HBM traffic, so it reads high; with u_comp small in
  decode it matters little there, and prefill-heavy steps reach the limit, as H100s do;
- other presets: the H100's fit scaled by their board power over the H100's (an estimate);
- the host: an 8-GPU HGX H100 node measured at 8.4 kW peak with its GPUs near full power (Latif et
  al., IEEE Access 13, 2025): 8.4 kW less 8 x 700 W = 350 W a GPU.

`EnergyModel` is that resolved for a scenario's [energy] section (limits checked: a power above the
GPU's board power is one line naming the key); `StepWork` counts a step's bytes and FLOPs per GPU
from the model's shapes (the roofline's accounting).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.perf.memory import kv_bytes_per_token
from kvsim.perf.roofline import activation_bytes_per_token
from kvsim.perf.weights import weights_per_gpu
from kvsim.scenario.models import ModelSpec

_H100_FIT = "fitted to ML.ENERGY Leaderboard v3.0, Llama-3.1-8B on one H100 (benchmarks/energy_mlenergy.py)"
_SCALED = "the H100's fit scaled by board power (an estimate)"
_HOST = "8-GPU HGX H100 node, 8.4 kW measured peak less 8 x 700 W (Latif et al., IEEE Access 13, 2025)"


@dataclass(frozen=True, slots=True)
class GpuPower:
    """A GPU preset's power model (module docstring), in watts."""

    idle_w: float
    tdp_w: float  # board power: the most a step may draw (the default power limit)
    active_w: float
    memory_w: float
    compute_w: float
    host_w: float  # the server around each GPU, while serving
    sources: str


def _scaled(tdp: float, idle: float, src: str) -> GpuPower:
    k = tdp / 700.0
    h = GPU_POWER["H100-SXM"]
    return GpuPower(idle, tdp, h.active_w * k, h.memory_w * k, h.compute_w * k, h.host_w,
                    f"board power {tdp:g} W ({src}); idle {idle:g} W; active/memory/compute: {_SCALED}; host: {_HOST}")


GPU_POWER: dict[str, GpuPower] = {
    "H100-SXM": GpuPower(70.0, 700.0, 337.0, 110.0, 871.0, 350.0,
                         f"board power 700 W (NVIDIA H100 SXM datasheet); idle 70 W (nvidia-smi, model loaded); "
                         f"active/memory/compute: {_H100_FIT}; host: {_HOST}"),
}
GPU_POWER.update({
    "H200": _scaled(700.0, 75.0, "NVIDIA H200 SXM datasheet"),
    "A100-80GB": _scaled(400.0, 55.0, "NVIDIA A100 SXM datasheet"),
    "B200": _scaled(1000.0, 140.0, "NVIDIA HGX B200 datasheet"),
    "L40S": _scaled(350.0, 35.0, "NVIDIA L40S datasheet"),
    "MI300X": _scaled(750.0, 110.0, "AMD Instinct MI300X datasheet"),
})


@dataclass(frozen=True, slots=True)
class EnergyModel:
    """A scenario's energy accounting resolved: the GPU's power model with the [energy] overrides, the
    host's share, PUE and price."""

    power: GpuPower
    max_w: float  # the power limit in force
    host_w: float
    pue: float
    usd_per_kwh: float
    peak_flops: float  # per GPU, FLOP/s (datasheet, dense, the model's GEMM dtype)
    bandwidth: float  # per GPU, bytes/s (datasheet)

    def step_joules(self, seconds: float, flops: float, nbytes: float) -> float:
        """One GPU's joules for `seconds` of steps doing `flops` and moving `nbytes` (per GPU)."""
        if seconds <= 0:
            return 0.0
        p = self.power
        joules = (p.idle_w + p.active_w) * seconds + p.memory_w * nbytes / self.bandwidth \
            + p.compute_w * flops / self.peak_flops
        return min(joules, self.max_w * seconds)

    def describe(self) -> dict:
        p = self.power
        return {"gpu_idle_w": p.idle_w, "gpu_max_w": self.max_w, "gpu_active_w": p.active_w,
                "gpu_memory_w": p.memory_w, "gpu_compute_w": p.compute_w, "host_w_per_gpu": self.host_w,
                "pue": self.pue, "usd_per_kwh": self.usd_per_kwh, "sources": p.sources}


def energy_model(scenario, gpu, model: ModelSpec) -> EnergyModel | None:
    """The scenario's EnergyModel (None without an [energy] section); one line for a power above the GPU's
    board power or an idle draw at or above the limit."""
    cfg = scenario.energy
    if cfg is None:
        return None
    preset = GPU_POWER.get(gpu.name) or _scaled(700.0, 70.0, "no preset: an H100's board power")
    src = scenario.source
    if cfg.gpu_max_w is not None and cfg.gpu_max_w > preset.tdp_w:
        raise KvsimError(f"{src}: energy.gpu_max_w: {cfg.gpu_max_w:g} W is above the {gpu.name}'s board power "
                         f"({preset.tdp_w:g} W)")
    idle = cfg.gpu_idle_w if cfg.gpu_idle_w is not None else preset.idle_w
    limit = cfg.gpu_max_w if cfg.gpu_max_w is not None else preset.tdp_w
    if idle >= limit:
        key = "energy.gpu_idle_w" if cfg.gpu_idle_w is not None else "energy.gpu_max_w"
        raise KvsimError(f"{src}: {key}: an idle draw of {idle:g} W leaves nothing under the {limit:g} W limit")
    power = GpuPower(idle, preset.tdp_w, preset.active_w, preset.memory_w, preset.compute_w, preset.host_w,
                     preset.sources + (f"; {cfg.source}" if cfg.source else ""))
    peak = (gpu.fp8_tflops if model.gemm_dtype == "fp8" else gpu.bf16_tflops) * 1e12
    return EnergyModel(power, limit, cfg.host_w_per_gpu if cfg.host_w_per_gpu is not None else preset.host_w,
                       cfg.pue, cfg.usd_per_kwh, peak, gpu.hbm_bandwidth_gbps * 1e9)


class StepWork:
    """Bytes and FLOPs per GPU of a step's parts, from the model's shapes (one replica of `tp` GPUs):
    every token row through the layers (weights streamed once a step), sampled rows through lm_head,
    attention over the keys read (decode) or the query-key pairs (prefill), the KV read and written."""

    __slots__ = ("weights", "flops_per_row", "flops_per_logit", "attn_flops_per_pair", "kv_per_key",
                 "act_per_row", "tp")

    def __init__(self, model: ModelSpec, tp: int, kv_cache_dtype: str, draft: ModelSpec | None = None):
        w = weights_per_gpu(model, tp)
        self.tp = tp
        self.weights = w.total - w.embed + (w.embed if model.tie_word_embeddings else 0.0)  # the embedding is a gather
        lm_head = 2.0 * model.lm_head_params
        self.flops_per_row = (model.params_per_token_flops - lm_head) / tp
        self.flops_per_logit = lm_head / tp
        self.attn_flops_per_pair = model.attention_flops(1) / tp
        self.kv_per_key = kv_bytes_per_token(model, kv_cache_dtype, tp)
        self.act_per_row = activation_bytes_per_token(model, kv_cache_dtype, tp)

    def step(self, rows: float, sampled: float, pairs: float, keys: float, steps: int = 1) -> tuple[float, float]:
        """(FLOPs, bytes) per GPU of `steps` steps computing `rows` token rows and `sampled` logits rows
        in all, `pairs` query-key pairs and reading `keys` KV tokens in all."""
        flops = rows * self.flops_per_row + sampled * self.flops_per_logit + pairs * self.attn_flops_per_pair
        nbytes = steps * self.weights + keys * self.kv_per_key + rows * self.act_per_row
        return flops, nbytes
