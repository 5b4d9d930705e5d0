"""The scenario's `[kv_offload]` section: KV-cache offload tiers behind a KV connector, as vLLM v0.26.0
serves them (`--kv-offloading-backend native|lmcache --kv-offloading-size GiB`, the OffloadingConnector's
`kv_connector_extra_config`, its TieringOffloadingSpec's secondary tier) and LMCache's vLLM connector
(LMCacheConnectorV1: CPU and local disk, 256-token chunks). kvsim.perf.offload checks it against the
model and the GPUs and resolves it into the engine's record.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kvsim.scenario import limits as L

Bandwidth = Annotated[float, Field(ge=L.MIN_BANDWIDTH_GBPS, le=L.MAX_BANDWIDTH_GBPS)]
Micros = Annotated[float, Field(ge=0, le=L.MAX_MS * 1e3)]
Size = Annotated[float, Field(gt=0, le=L.MAX_GIB)]

# Default host DRAM per GPU, GiB: a DGX H100 (2 TiB for 8 GPUs) or GCP a3-highgpu-8g (1,872 GB for 8).
HOST_GIB_PER_GPU = 232.0


def _not_bool(value):
    return repr(value) if isinstance(value, bool) else value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class DiskTierConfig(_Section):
    """A disk tier behind the CPU tier: vLLM's TieringOffloadingSpec secondary tier (writes cascade from
    the CPU tier, hits are promoted to it before a load) or LMCache's local disk backend."""

    kind: Literal["local_nvme", "shared_fs"] = Field("local_nvme", description=(
        "local_nvme: the node's NVMe drive (defaults: 6.5 GB/s read, 3.5 GB/s write, 100 us); shared_fs: a "
        "shared file system such as Lustre or CephFS seen by one client (defaults: 2 GB/s read, 1 GB/s write, "
        "1,000 us). Replicas do not share a disk tier's blocks in kvsim."))
    size_gib: Size = Field(description="GiB of the disk tier per replica (LMCache: max_local_disk_size).")
    read_gbps: Optional[Bandwidth] = Field(None, description="GB/s the tier reads (promotions, LMCache loads).")
    write_gbps: Optional[Bandwidth] = Field(None, description="GB/s the tier writes (cascaded stores).")
    latency_us: Optional[Micros] = Field(None, description="Microseconds to each transfer's first byte.")


class KvOffloadConfig(_Section):
    """KV offload tiers ([kv_offload]); policies use them unless `kv_offload = false`."""

    backend: Literal["native", "lmcache"] = Field("native", description=(
        "native: vLLM's OffloadingConnector (asynchronous loads and stores over PCIe, LRU or ARC, reuse gating); "
        "lmcache: LMCache's connector (CPU and disk in 256-token chunks, loads and stores inside the step). "
        "vLLM: --kv-offloading-backend."))
    kv_offloading_size: Size = Field(description=(
        "GiB of host memory for offloaded KV per replica, summed over its tensor-parallel ranks, as vLLM reads "
        "--kv-offloading-size (each rank holds its share: cpu_bytes_to_use / world size; LMCache: "
        "max_local_cpu_size per rank)."))
    block_size: Optional[Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=L.MAX_TOKENS)]] = Field(None, description=(
        "native: tokens per offloaded block, a multiple of engine.block_size (kv_connector_extra_config "
        "block_size). Default: engine.block_size."))
    eviction_policy: Literal["lru", "arc"] = Field("lru", description=(
        "native: the CPU tier's eviction policy (kv_connector_extra_config eviction_policy)."))
    store_threshold: Annotated[int, BeforeValidator(_not_bool), Field(ge=0, le=1000)] = Field(0, description=(
        "native: a block is stored only once looked up this many times (reuse gating; values below 2 store "
        "every block, as vLLM)."))
    max_tracker_size: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=100_000_000)] = Field(64_000, description=(
        "native: keys the reuse-gating tracker remembers (LRU)."))
    chunk_size: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=L.MAX_TOKENS)] = Field(256, description=(
        "lmcache: tokens per chunk (LMCACHE_CHUNK_SIZE); the tail of a prompt short of a chunk is not saved."))
    h2d_gbps: Optional[Bandwidth] = Field(None, description=(
        "GB/s one GPU loads from host memory. Default: 50 GB/s on an H100 (the DMA copy vLLM uses, measured in "
        "vLLM's KV-offloading blog), scaled by the GPU's hardware.pcie_gbps for others."))
    d2h_gbps: Optional[Bandwidth] = Field(None, description="GB/s one GPU stores to host memory. Default: as h2d_gbps.")
    duplex_gbps: Optional[Bandwidth] = Field(None, description=(
        "GB/s of both directions together while both run (default: 83.4 on an H100, the blog's figure, scaled)."))
    latency_us: Micros = Field(10.0, description="Microseconds each transfer costs besides its bytes (launch).")
    host_memory_gib: Optional[Size] = Field(None, description=(
        f"Host DRAM per replica that the tiers may not exceed. Default: {HOST_GIB_PER_GPU:g} GiB per GPU "
        "(a DGX H100's 2 TiB over 8 GPUs)."))
    disk: Optional[DiskTierConfig] = Field(None, description="A disk tier behind the CPU tier ([kv_offload.disk]).")
    optimal_bound: bool = Field(True, description=(
        "Report beside the run's hit rates the hit rate an offline-optimal eviction (Belady's) would reach on "
        "the same lookups and capacities (summary.json kv_offload.optimal)."))
    optimal_ttft: bool = Field(False, description=(
        "native: also re-run each offloaded policy with an oracle CPU tier that evicts by Belady's MIN (the block "
        "the first run's lookups use farthest ahead) and report the TTFT it gives beside the run's "
        "(summary.json kv_offload.optimal.ttft_ms): what a better eviction could still gain in latency. "
        "About doubles the policy's simulation time."))
