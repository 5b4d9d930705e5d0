"""KV offload tiers sized and checked: the scenario's [kv_offload] resolved once per policy into the
record the engine's connector takes (`OffloadSettings`), or one line naming the key that cannot work.

As vLLM v0.26.0 reads it, `--kv-offloading-size` is the host memory of one engine summed over its
tensor-parallel ranks: the native CPUOffloadingSpec divides `cpu_bytes_to_use` by the bytes of an
offloaded block on every rank (page size x layers x world size x block-size factor), so each rank
holds size / tp of it; LMCache is given `kv_offloading_size / num_kv_ranks` GiB per rank. A tier's
capacity in blocks is therefore floor(size x 2^30 / (bytes of a block on one GPU x tp)), and a
load or store moves a block's bytes on one GPU over that GPU's own PCIe link (the ranks at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvsim.errors import KvsimError
from kvsim.scenario.offload_config import HOST_GIB_PER_GPU

GIB = 1 << 30
# vLLM's KV-offloading blog (2026-01-08) on an H100 (PCIe Gen5, 64 GB/s datasheet each way): the DMA copy
# (cudaMemcpyAsync) it uses reaches about 50 GB/s one way and 83.4 GB/s both ways at once.
H100_PCIE_GBPS, H100_DMA_GBPS, H100_DMA_DUPLEX_GBPS = 64.0, 50.0, 83.4
DISK_DEFAULTS = {"local_nvme": (6.5, 3.5, 100.0), "shared_fs": (2.0, 1.0, 1000.0)}  # read, write GB/s; latency us


@dataclass(frozen=True, slots=True)
class DiskTier:
    kind: str
    num_blocks: int
    read_gbps: float
    write_gbps: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class OffloadSettings:
    """One policy's offload tiers, resolved: sizes in blocks of `block_size` tokens (LMCache: chunks),
    bytes per block on one GPU, links per GPU."""

    backend: str  # "native" or "lmcache"
    gpu_block_size: int
    block_size: int  # tokens per offloaded block (native) or chunk (lmcache)
    num_blocks: int  # CPU tier, per replica
    bytes_per_block: int  # one offloaded block (chunk) on one GPU
    tensor_parallel_size: int
    eviction_policy: str
    store_threshold: int
    max_tracker_size: int
    h2d_gbps: float
    d2h_gbps: float
    duplex_gbps: float
    latency_s: float
    size_gib: float
    disk: Optional[DiskTier] = None

    @property
    def factor(self) -> int:
        return self.block_size // self.gpu_block_size

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> dict:
        out = {"backend": self.backend, "kv_offloading_size_gib": self.size_gib, "block_size": self.block_size,
               "cpu_blocks": self.num_blocks, "cpu_tokens": self.tokens, "bytes_per_block_per_gpu": self.bytes_per_block,
               "eviction_policy": self.eviction_policy, "store_threshold": self.store_threshold,
               "h2d_gbps": self.h2d_gbps, "d2h_gbps": self.d2h_gbps, "duplex_gbps": self.duplex_gbps,
               "latency_us": self.latency_s * 1e6}
        if self.disk is not None:
            d = self.disk
            out["disk"] = {"kind": d.kind, "blocks": d.num_blocks, "tokens": d.num_blocks * self.block_size,
                           "read_gbps": d.read_gbps, "write_gbps": d.write_gbps, "latency_us": d.latency_s * 1e6}
        return out


def offload_settings(scenario, policy, model, gpu, capacity) -> Optional[OffloadSettings]:
    """The policy's tiers (None: it serves without), or a KvsimError naming the key."""
    if not scenario.offloaded(policy):
        return None
    cfg, src = scenario.kv_offload, scenario.source
    tp = scenario.hardware.tensor_parallel_size
    check_model(scenario, model, capacity)
    gpu_block = capacity.block_size
    block = gpu_block if cfg.backend == "native" and cfg.block_size is None else (
        cfg.chunk_size if cfg.backend == "lmcache" else cfg.block_size)
    if cfg.backend == "native" and block % gpu_block:
        raise KvsimError(f"{src}: kv_offload.block_size: {block} tokens is not a multiple of engine.block_size "
                         f"{gpu_block} (vLLM's offloaded blocks are whole GPU blocks)")
    per_token = capacity.bytes_per_block / gpu_block  # one GPU
    block_bytes = int(round(per_token * block))
    host = cfg.host_memory_gib if cfg.host_memory_gib is not None else HOST_GIB_PER_GPU * tp
    if cfg.kv_offloading_size > host:
        raise KvsimError(f"{src}: kv_offload.kv_offloading_size: {cfg.kv_offloading_size:g} GiB is more than the "
                         f"host memory of a replica ({host:g} GiB: kv_offload.host_memory_gib)")
    num_blocks = int(cfg.kv_offloading_size * GIB // (block_bytes * tp))
    if num_blocks < 1:
        raise KvsimError(f"{src}: kv_offload.kv_offloading_size: {cfg.kv_offloading_size:g} GiB holds no "
                         f"{block}-token block of {model.name} ({block_bytes * tp / GIB:.3g} GiB)")
    scale = gpu.pcie_gbps / H100_PCIE_GBPS
    h2d = cfg.h2d_gbps if cfg.h2d_gbps is not None else H100_DMA_GBPS * scale
    return OffloadSettings(
        backend=cfg.backend, gpu_block_size=gpu_block, block_size=block, num_blocks=num_blocks,
        bytes_per_block=block_bytes, tensor_parallel_size=tp,
        eviction_policy=policy.offload_eviction_policy or cfg.eviction_policy,
        store_threshold=cfg.store_threshold, max_tracker_size=cfg.max_tracker_size, h2d_gbps=h2d,
        d2h_gbps=cfg.d2h_gbps if cfg.d2h_gbps is not None else h2d,
        duplex_gbps=cfg.duplex_gbps if cfg.duplex_gbps is not None else H100_DMA_DUPLEX_GBPS * scale,
        latency_s=cfg.latency_us * 1e-6, size_gib=cfg.kv_offloading_size,
        disk=_disk(cfg.disk, block_bytes, tp, src) if cfg.disk is not None else None)


def _disk(cfg, block_bytes: int, tp: int, src: str) -> DiskTier:
    read, write, latency = DISK_DEFAULTS[cfg.kind]
    blocks = int(cfg.size_gib * GIB // (block_bytes * tp))
    if blocks < 1:
        raise KvsimError(f"{src}: kv_offload.disk.size_gib: {cfg.size_gib:g} GiB holds no offloaded block")
    return DiskTier(cfg.kind, blocks, cfg.read_gbps or read, cfg.write_gbps or write,
                    (cfg.latency_us if cfg.latency_us is not None else latency) * 1e-6)


def check_model(scenario, model, capacity) -> None:
    """Layouts the connectors of the release cannot offload: one line naming the key."""
    if capacity.windows:
        raise KvsimError(f"{scenario.source}: kv_offload: {model.name} keeps a sliding window in some layers "
                         "(vLLM's hybrid KV cache); vLLM offloads it only with --disable-hybrid-kv-cache-manager "
                         "(LMCache's connector: one KV cache group), which kvsim does not simulate")
    if scenario.backend.name != "analytic":
        raise KvsimError(f"{scenario.source}: backend.name: KV offload is simulated on the analytic backend only, "
                         f"not {scenario.backend.name!r}")


def tier_record(settings: OffloadSettings, lens) -> dict:
    """`kvsim memory`'s figures of the tiers of one replica: blocks, tokens, GiB and the sequences of each
    length in `lens` they hold (whole offloaded blocks of the prompt)."""
    tiers = {"cpu": settings.num_blocks}
    if settings.disk is not None:
        tiers["disk"] = settings.disk.num_blocks
    per = settings.bytes_per_block * settings.tensor_parallel_size
    return {name: {"blocks": blocks, "tokens": blocks * settings.block_size, "gib": blocks * per / GIB,
                   "sequences": {str(n): blocks // max(1, n // settings.block_size) for n in lens}}
            for name, blocks in tiers.items()}
