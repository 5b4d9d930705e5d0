"""The `[autoscaling]` section: replicas that come and go under an autoscaler, as users configure it.

`policy` picks the autoscaler; its own table holds its settings (names as Kubernetes, KEDA and llm-d
spell them, in snake_case):

- `hpa`: a Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on one metric: a per-pod custom metric
  (`source = "pods"`, through a metrics adapter) or an external one (`"external"`, the sum over
  replicas), `target` per replica, the 10% tolerance, `[autoscaling.behavior]`.
- `keda`: a KEDA ScaledObject with a Prometheus trigger: `threshold` (the HPA's AverageValue or Value
  target), `activation_threshold`, `polling_interval_s`, `cooldown_period_s` (scaling to and from zero
  with `min_replicas = 0`), driving KEDA's HPA.
- `wva`: llm-d's Workload Variant Autoscaler, saturation analyzer (v1): KV-cache and queue thresholds,
  spare-capacity triggers, its 60 s loop, actuated by an HPA on `wva_desired_replicas`.
- `slo_aware`: llm-d's SLO-aware loop (guides/workload-autoscaling, KEDA and predicted latency): the
  P90 TTFT and TPOT over their SLOs, clamped and smoothed, the hysteresis band, its HPA behavior.
- `fixed`: a fixed pool of `replicas` (today's engine: the same results, plus the day's answers).

`[autoscaling.startup]` is what a new replica takes before it serves (named parts, each with its
source: kvsim/perf/startup.py); `[autoscaling.metrics]` how the autoscaler sees the replicas (a
Prometheus scrape every `scrape_interval_s`, seen `delay_s` later). Metrics an autoscaler may read are
`METRICS`: vLLM's per-replica gauges, and the gateway's queue of requests waiting for a ready replica.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from kvsim.scenario import limits as L
from kvsim.scenario.sections import Section

# What the autoscalers can observe: vLLM's /metrics gauges per replica (v0.11.0 names, without the
# "vllm:" prefix), and the gateway's queue (llm-d EPP flow control: llm_d_epp_flow_control_queue_size).
REPLICA_METRICS = ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc")
GATEWAY_METRICS = ("gateway_queue_size",)
METRICS = REPLICA_METRICS + GATEWAY_METRICS
POLICIES = ("hpa", "keda", "wva", "slo_aware", "fixed")
MAX_AUTOSCALE_REPLICAS = 1024

Seconds = Annotated[float, Field(ge=0, le=L.MAX_DURATION_S)]
Period = Annotated[float, Field(gt=0, le=L.MAX_DURATION_S)]
Replicas = Annotated[int, Field(ge=0, le=MAX_AUTOSCALE_REPLICAS)]
Metric = Literal[METRICS]  # type: ignore[valid-type]
Query = Literal["last", "avg_over_time", "max_over_time"]


class ScalingPolicy(Section):
    """One HPA scaling policy (HPAScalingPolicy)."""

    type: Literal["Pods", "Percent"] = Field(description="Pods: a number of replicas; Percent: a share of the current ones.")
    value: Annotated[int, Field(gt=0, le=100_000)] = Field(description="The change the policy allows per period.")
    period_seconds: Annotated[int, Field(gt=0, le=1800)] = Field(description="The window the policy holds over, seconds.")


class ScalingRules(Section):
    """One direction of an HPA's behavior (HPAScalingRules); unset keys take Kubernetes' defaults."""

    stabilization_window_seconds: Optional[Annotated[int, Field(ge=0, le=3600)]] = Field(None, description=(
        "Past recommendations considered: scale up to the lowest, down to the highest in the window. Default: "
        "0 up, 300 down."))
    select_policy: Optional[Literal["Max", "Min", "Disabled"]] = Field(None, description=(
        "Max: the policy allowing the largest change (default); Min: the smallest; Disabled: no scaling this way."))
    policies: Optional[Annotated[list[ScalingPolicy], Field(min_length=1, max_length=10)]] = Field(None, description=(
        "Rate limits. Default up: 100% or 4 Pods per 15 s (Max); down: 100% per 15 s."))


class Behavior(Section):
    """An HPA's `behavior` (autoscaling/v2)."""

    scale_up: ScalingRules = Field(ScalingRules(), description="[autoscaling.behavior.scale_up]")
    scale_down: ScalingRules = Field(ScalingRules(), description="[autoscaling.behavior.scale_down]")


class HpaConfig(Section):
    """A HorizontalPodAutoscaler on one metric (Kubernetes' algorithm, kvsim/engine/hpa.py)."""

    metric: Metric = Field("num_requests_waiting", description=(
        "The metric: " + ", ".join(METRICS) + " (vLLM's gauges per replica; the gateway's queue)."))
    source: Literal["pods", "external"] = Field("pods", description=(
        "pods: a per-replica custom metric averaged over the pods that report it (Pods metric, AverageValue); "
        "external: one value for the pool (External metric), the sum over replicas."))
    target_type: Literal["AverageValue", "Value"] = Field("AverageValue", description=(
        "external: AverageValue (target per replica: desired = ceil(value / target)) or Value (desired = "
        "ceil(current × value / target)). pods takes AverageValue."))
    target: Annotated[float, Field(gt=0, le=1e9)] = Field(description="The target value (per replica for AverageValue).")
    query: Query = Field("last", description=(
        "What the autoscaler reads of each replica's series: the last scrape, or its avg_over_time / "
        "max_over_time over query_window_s (the adapter's or trigger's PromQL)."))
    query_window_s: Period = Field(60.0, description="avg_over_time / max_over_time: the range, seconds.")
    sync_period_s: Period = Field(15.0, description=(
        "The HPA's loop period, seconds (kube-controller-manager --horizontal-pod-autoscaler-sync-period, 15)."))
    tolerance: Annotated[float, Field(ge=0, le=10)] = Field(0.1, description=(
        "No change while the metric is within 1 ± tolerance of the target (Kubernetes' default 0.1)."))


class KedaConfig(Section):
    """A KEDA ScaledObject with one Prometheus trigger (the query sums the metric over the replicas)."""

    metric: Metric = Field("num_requests_waiting", description="The trigger's metric: " + ", ".join(METRICS) + ".")
    threshold: Annotated[float, Field(gt=0, le=1e9)] = Field(description=(
        "The trigger's threshold: the HPA's target (per replica with metric_type AverageValue)."))
    activation_threshold: Annotated[float, Field(ge=0, le=1e9)] = Field(0.0, description=(
        "Scaling from zero starts when the metric exceeds this; at zero replicas only the gateway's queue reports."))
    metric_type: Literal["AverageValue", "Value"] = Field("AverageValue", description="The HPA metric's target type.")
    query: Query = Field("last", description="last, avg_over_time or max_over_time of each replica's series.")
    query_window_s: Period = Field(60.0, description="avg_over_time / max_over_time: the range, seconds.")
    polling_interval_s: Period = Field(30.0, description="How often KEDA checks activation, seconds (default 30).")
    cooldown_period_s: Seconds = Field(300.0, description=(
        "With min_replicas = 0: seconds after the trigger was last active before scaling to zero (default 300)."))
    sync_period_s: Period = Field(15.0, description="KEDA's HPA's loop period, seconds (15).")
    tolerance: Annotated[float, Field(ge=0, le=10)] = Field(0.1, description="The HPA's tolerance (0.1).")


class WvaConfig(Section):
    """llm-d's Workload Variant Autoscaler, saturation analyzer (one variant)."""

    kv_cache_threshold: Annotated[float, Field(gt=0, le=1)] = Field(0.80, description=(
        "A replica is saturated at this KV-cache usage or more (kvCacheThreshold, 0.80)."))
    queue_length_threshold: Annotated[float, Field(gt=0, le=1e6)] = Field(5.0, description=(
        "A replica is saturated at this many waiting requests or more (queueLengthThreshold, 5)."))
    kv_spare_trigger: Annotated[float, Field(ge=0, le=1)] = Field(0.1, description=(
        "Scale up when the non-saturated replicas' mean spare KV (threshold - usage) is below this (0.1)."))
    queue_spare_trigger: Annotated[float, Field(ge=0, le=1e6)] = Field(3.0, description=(
        "Scale up when their mean spare queue (threshold - waiting) is below this (queueSpareTrigger, 3)."))
    interval_s: Period = Field(60.0, description="The controller's loop, seconds (GLOBAL_OPT_INTERVAL, 60 s).")
    query_window_s: Period = Field(60.0, description=(
        "The peak over this range of each replica's KV usage and queue (max_over_time[1m])."))
    sync_period_s: Period = Field(15.0, description="The HPA reading wva_desired_replicas: its loop period (15 s).")
    tolerance: Annotated[float, Field(ge=0, le=10)] = Field(0.1, description="That HPA's tolerance (0.1).")


class SloAwareConfig(Section):
    """llm-d's SLO-aware loop: saturation s = max(P90 TTFT / TTFT SLO, P90 TPOT / TPOT SLO), clamped and
    smoothed, into a replica count with a hysteresis band, through KEDA's HPA."""

    ttft_slo_ms: Optional[Annotated[float, Field(gt=0, le=L.MAX_MS)]] = Field(None, description=(
        "The TTFT SLO the signal divides by, ms. Default: slo.ttft_ms, else 3000 (the guide's)."))
    tpot_slo_ms: Optional[Annotated[float, Field(gt=0, le=L.MAX_MS)]] = Field(None, description=(
        "The TPOT SLO the signal divides by, ms. Default: slo.tpot_ms, else 100 (the guide's)."))
    quantile: Annotated[float, Field(gt=0, le=1)] = Field(0.9, description="The latency quantile (histogram_quantile(0.9)).")
    rate_window_s: Period = Field(60.0, description="The latencies of the last this many seconds (rate(...[1m])).")
    rule_interval_s: Period = Field(15.0, description="The recording rules' evaluation interval, seconds (15).")
    clamp: Annotated[float, Field(gt=0, le=1e3)] = Field(2.0, description="Each sample clamped to this (C = 2.0).")
    smoothing_window_s: Period = Field(45.0, description="avg_over_time of the clamped signal, seconds (45).")
    scale_up_threshold: Annotated[float, Field(gt=0, le=1e3)] = Field(0.55, description="θ_up: scale up above this (0.55).")
    scale_down_boundary: Annotated[float, Field(gt=0, le=1e3)] = Field(0.40, description=(
        "θ_dn: scale down below this (0.40); in between the pool holds."))
    sync_period_s: Period = Field(15.0, description="KEDA's HPA's loop period, seconds (15).")
    tolerance: Annotated[float, Field(ge=0, le=10)] = Field(0.1, description="That HPA's tolerance (0.1).")

    @model_validator(mode="after")
    def _band(self):
        if self.scale_down_boundary > self.scale_up_threshold:
            raise ValueError(f"scale_down_boundary ({self.scale_down_boundary:g}) must not exceed scale_up_threshold "
                             f"({self.scale_up_threshold:g})")
        if self.clamp <= self.scale_up_threshold:
            raise ValueError(f"clamp ({self.clamp:g}) must exceed scale_up_threshold ({self.scale_up_threshold:g})")
        return self


class FixedConfig(Section):
    """A pool that never changes."""

    replicas: Optional[Annotated[int, Field(ge=1, le=L.MAX_REPLICAS)]] = Field(None, description=(
        "The pool's replicas. Default: hardware.num_replicas."))


class StartupConfig(Section):
    """What a new replica takes before it serves, part by part (defaults and sources: kvsim/perf/startup.py)."""

    node_provisioning_s: Optional[Seconds] = Field(None, description=(
        "A GPU node to start first, seconds (0: one is free in the cluster; a cluster autoscaler adding a node "
        "takes minutes)."))
    container_start_s: Optional[Seconds] = Field(None, description=(
        "Pod scheduling, image pull from cache, process and API server start, seconds."))
    storage_gbps: Optional[Annotated[float, Field(gt=0, le=L.MAX_BANDWIDTH_GBPS)]] = Field(None, description=(
        "Weight loading = the checkpoint's bytes ÷ this storage bandwidth (GB/s)."))
    weight_loading_s: Optional[Seconds] = Field(None, description="Override: weight loading, seconds.")
    torch_compile_s: Optional[Seconds] = Field(None, description="torch.compile (from its cache), seconds.")
    cuda_graph_capture_s: Optional[Seconds] = Field(None, description="CUDA graph capture, seconds.")
    engine_init_s: Optional[Seconds] = Field(None, description="Memory profiling and KV cache allocation, seconds.")
    readiness_probe_s: Optional[Seconds] = Field(None, description=(
        "From the server answering to the pod being Ready (a readiness probe's period), seconds."))


class MetricsConfig(Section):
    """How the autoscaler sees the replicas: Prometheus scrapes."""

    scrape_interval_s: Period = Field(15.0, description="Prometheus' scrape interval, seconds (15).")
    delay_s: Seconds = Field(0.0, description=(
        "A scrape is visible to queries this long after it was taken (rule evaluation, adapter caches), seconds."))


class AutoscalingConfig(Section):
    """Replicas that come and go: an autoscaler, its bounds, startup delay and metrics pipeline."""

    policy: Literal[POLICIES] = Field(description=(  # type: ignore[valid-type]
        "The autoscaler: hpa, keda, wva (llm-d Workload Variant Autoscaler), slo_aware (llm-d's SLO-aware "
        "loop) or fixed (a fixed pool)."))
    min_replicas: Replicas = Field(1, description="The fewest replicas (0: KEDA's scale to zero).")
    max_replicas: Annotated[int, Field(ge=1, le=MAX_AUTOSCALE_REPLICAS)] = Field(10, description="The most replicas.")
    initial_replicas: Optional[Annotated[int, Field(ge=1, le=MAX_AUTOSCALE_REPLICAS)]] = Field(None, description=(
        "Replicas ready at t = 0. Default: min_replicas (at least 1)."))
    window_s: Period = Field(900.0, description=(
        "The answers' window, seconds: SLO attainment per window, and the lower bound's fewest replicas per window."))
    attainment_target: Optional[Annotated[float, Field(gt=0, le=1)]] = Field(None, description=(
        "The share of requests meeting every per-request SLO bound that counts as meeting the SLO. Default: "
        "slo.percentile / 100."))
    startup: StartupConfig = Field(StartupConfig(), description="[autoscaling.startup]")
    metrics: MetricsConfig = Field(MetricsConfig(), description="[autoscaling.metrics]")
    behavior: Optional[Behavior] = Field(None, description=(
        "The HPA behavior (hpa, keda, wva, slo_aware). Default: Kubernetes' (hpa, keda), the WVA sample HPA's "
        "(wva), the llm-d guide's (slo_aware)."))
    hpa: Optional[HpaConfig] = Field(None, description="[autoscaling.hpa], for policy = \"hpa\".")
    keda: Optional[KedaConfig] = Field(None, description="[autoscaling.keda], for policy = \"keda\".")
    wva: Optional[WvaConfig] = Field(None, description="[autoscaling.wva], for policy = \"wva\" (default: its defaults).")
    slo_aware: Optional[SloAwareConfig] = Field(None, description=(
        "[autoscaling.slo_aware], for policy = \"slo_aware\" (default: the guide's)."))
    fixed: Optional[FixedConfig] = Field(None, description="[autoscaling.fixed], for policy = \"fixed\".")

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must not exceed max_replicas ({self.max_replicas})")
        initial = self.initial_replicas
        if initial is not None and not max(self.min_replicas, 1) <= initial <= self.max_replicas:
            raise ValueError(f"initial_replicas ({initial}) must lie in [max(min_replicas, 1), max_replicas] = "
                             f"[{max(self.min_replicas, 1)}, {self.max_replicas}]")
        others = [p for p in POLICIES if p != self.policy and getattr(self, p) is not None]
        if others:
            raise ValueError(f"[autoscaling.{others[0]}] is set but policy is {self.policy!r}")
        if self.policy in ("hpa", "keda") and getattr(self, self.policy) is None:
            raise ValueError(f"policy {self.policy!r} needs [autoscaling.{self.policy}] with its metric and "
                             f"{'target' if self.policy == 'hpa' else 'threshold'}")
        if self.behavior is not None and self.policy == "fixed":
            raise ValueError("behavior: a fixed pool does not scale")
        self._observable()
        return self

    def _observable(self) -> None:
        """What the autoscaler reads must be reported: a pod metric by the replicas, and at zero
        replicas only the gateway reports."""
        hpa = self.hpa
        if hpa is not None and hpa.source == "pods":
            if hpa.metric in GATEWAY_METRICS:
                raise ValueError(f"hpa.metric {hpa.metric!r} is the gateway's, not a replica's: no pod reports it "
                                 "(use source = \"external\")")
            if hpa.target_type != "AverageValue":
                raise ValueError("hpa.target_type: a pods metric's target is an AverageValue")
        if self.min_replicas > 0:
            return
        if self.policy != "keda":
            raise ValueError(f"min_replicas = 0 (scale to zero) is KEDA's: policy {self.policy!r} needs at least 1")
        if self.keda.metric not in GATEWAY_METRICS:
            raise ValueError(f"keda.metric {self.keda.metric!r} is reported by replicas: with min_replicas = 0 none "
                             f"runs to report it and the pool never wakes; scale from zero on "
                             f"{', '.join(GATEWAY_METRICS)}")


def check_autoscaled(scenario) -> None:
    """What an autoscaled scenario cannot also be (raised as the scenario's validation error)."""
    auto, wl = scenario.autoscaling, scenario.workload
    if scenario.disaggregation is not None:
        raise ValueError("autoscaling: a disaggregated deployment's pools are not autoscaled (drop one section)")
    if scenario.kv_offload is not None:
        raise ValueError("autoscaling: KV offload tiers on an autoscaled pool are not simulated (drop one section)")
    if wl.max_concurrency is not None or wl.sessions is not None or wl.arrival.process == "immediate":
        raise ValueError("autoscaling: replicas are autoscaled under open-loop arrivals (no max_concurrency, "
                         "sessions or immediate arrivals)")
    if auto.policy != "fixed" and scenario.hardware.data_parallel_size != 1:
        raise ValueError("hardware.data_parallel_size: an autoscaled replica is one engine (data_parallel_size = 1)")
    if auto.policy != "fixed" and scenario.hardware.num_replicas != 1:
        raise ValueError("hardware.num_replicas: the autoscaler sets the replica count (use "
                         "autoscaling.initial_replicas, min_replicas and max_replicas)")
