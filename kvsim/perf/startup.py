"""What a new replica takes before it serves: a startup delay made of named parts, each with its source.

A replica added at t serves from t + the sum of its parts (`StartupDelay.total_s`); until then it is
billed and holds its GPUs but the router does not see it. The parts, in the order a pod goes through
them, and their defaults (every one can be set in `[autoscaling.startup]`):

| part | default | source |
| --- | --- | --- |
| node_provisioning | 0 s | a GPU node is free in the cluster (the HPA scales pods; a cluster autoscaler adding a node takes minutes: set it) |
| container_start | 30 s | vllm-project/vllm#20264: the first response came 59 s after start while the engine's own init took 34 s and weight loading under 1 s; "a loss of ~30 s which isn't logged" (scheduling, image from cache, Python and API server start) |
| weight_loading | checkpoint bytes ÷ 1.3 GB/s | vllm-project/vllm#44881: 21.82 GiB of weights loaded in ~18 s (1.3 GB/s) from a serverless pod's model volume |
| torch_compile | 7.5 s | vllm-project/vllm#20264: "torch.compile takes 7.51 s in total" loading from its compile cache (cold: 19 s for Llama-3-8B, vllm-project/vllm#11005; ~85 s for Llama-70B-FP8 at TP 8, vllm-project/vllm#19824) |
| cuda_graph_capture | 17 s | vllm-project/vllm#20264: "Graph capturing finished in 17 secs" (10-15 s for Llama-3-8B, vllm-project/vllm#11005; ~60 s for Llama-70B at TP 8, vllm-project/vllm#19824) |
| engine_init | 10 s | vllm-project/vllm#20264: "init engine (profile, create kv cache, warmup model) took 34.11 seconds", less its compile and graph capture |
| readiness_probe | 10 s | Kubernetes probes' default periodSeconds: the pod turns Ready at the first probe after the server answers (at worst one period) |

With the defaults, a Qwen3-32B replica at TP 2 (65 GB in bfloat16) is ready after ~125 s; llm-d's
SLO-aware autoscaling guide measured ~100 s pod-ready on H100 with a torch.compile cache volume and a
fast startupProbe, and ~135 s (2 min 15 s) without (llm-d/llm-d guides/workload-autoscaling/
README.slo-aware.md). These are reported beside each other in benchmarks/results/autoscale.md, not
fitted: set the parts from your own pods' logs (vLLM logs each of them).

A replica's pod is Pending (no metrics, not Ready) through node provisioning and container start,
then Running without metrics until it is Ready (vLLM serves /metrics once its engine is up): the
HPA's replica calculator treats the two differently (kvsim/engine/hpa.py).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STORAGE_GBPS = 1.3
# (part, default seconds, source) of every part but weight loading, which bytes / bandwidth gives
PARTS = (
    ("node_provisioning", 0.0, "a GPU node already free in the cluster"),
    ("container_start", 30.0, "vllm-project/vllm#20264 (~30 s unlogged before the engine starts)"),
    ("weight_loading", None, "checkpoint bytes / storage bandwidth (1.3 GB/s: vllm-project/vllm#44881)"),
    ("torch_compile", 7.5, "vllm-project/vllm#20264 (7.51 s from the compile cache)"),
    ("cuda_graph_capture", 17.0, "vllm-project/vllm#20264 (17 s)"),
    ("engine_init", 10.0, "vllm-project/vllm#20264 (34.11 s engine init less compile and capture)"),
    ("readiness_probe", 10.0, "Kubernetes probe periodSeconds default (10 s)"),
)
PENDING_PARTS = ("node_provisioning", "container_start")  # the pod is Pending through these


@dataclass(frozen=True, slots=True)
class StartupDelay:
    """A new replica's startup, part by part: (name, seconds, source)."""

    parts: tuple[tuple[str, float, str], ...]

    @property
    def total_s(self) -> float:
        return sum(s for _, s, _ in self.parts)

    @property
    def pending_s(self) -> float:
        """Seconds the pod is Pending (before its container runs)."""
        return sum(s for name, s, _ in self.parts if name in PENDING_PARTS)

    def describe(self) -> dict:
        return {"total_s": self.total_s, "parts": [{"name": n, "seconds": s, "source": src} for n, s, src in self.parts]}


def startup_delay(cfg, checkpoint_bytes: float) -> StartupDelay:
    """The startup of a replica whose checkpoint is `checkpoint_bytes`, from `[autoscaling.startup]`
    (kvsim.scenario.autoscaling.StartupConfig; unset parts take the defaults above)."""
    parts = []
    for name, default, source in PARTS:
        if name == "weight_loading":
            given = cfg.weight_loading_s
            gbps = cfg.storage_gbps or DEFAULT_STORAGE_GBPS
            seconds = given if given is not None else checkpoint_bytes / (gbps * 1e9)
            where = "set in the scenario" if given is not None else (
                f"{checkpoint_bytes / 1e9:.1f} GB / {gbps:g} GB/s" + ("" if cfg.storage_gbps else f" ({source})"))
            parts.append((name, seconds, where))
            continue
        given = getattr(cfg, f"{name}_s")
        parts.append((name, default if given is None else given, source if given is None else "set in the scenario"))
    return StartupDelay(tuple(parts))
