"""KV-transfer links of a disaggregated deployment: presets with their sources.

A link moves a request's prompt KV from the prefill instance that computed it to the decode
instance that continues it. vLLM's NixlConnector has every tensor-parallel rank of the decode
instance read its own share of the KV straight from a prefill rank's GPU memory (GPUDirect RDMA
between nodes, CUDA IPC over NVLink within a node), so the figures are per GPU and per direction:
each GPU has its own NIC (DGX/HGX H100 and A100: one ConnectX per GPU) or its own NVLink ports.

- `bandwidth_gbps`: GB/s one GPU moves in one direction.
- `latency_us`: one transfer's first byte (an RDMA read is a round trip through the fabric).
- `overhead_us`: what one transfer costs besides its bytes: the connector posting the read of the
  request's block descriptors and its completion notice.

The presets name the fabric's line rate (the datasheet's), so a measured, lower figure belongs in
`disaggregation.link.bandwidth_gbps`; Mooncake's transfer engine, for one, measured 87 GB/s over
4 x 200 Gb/s RoCE (87% of line rate) and 190 GB/s over 8 x 400 Gb/s (47%)
(github.com/kvcache-ai/Mooncake README, 40 GB transfers).
"""

from __future__ import annotations

from dataclasses import dataclass

# The connector's own cost per transfer: NIXL's posting of a request's READ, measured at 6.7 ms on
# average by NIXL's telemetry in vLLM's NixlConnector (vllm-project/vllm#50913, before that issue's
# change moved posting to its own thread); it depends on the host, so the presets all take it.
NIXL_POST_US = 6700.0
RDMA_LATENCY_US = 5.0  # an RDMA READ's round trip through one switch (perftest's ib_read_lat: a few us)
NVLINK_LATENCY_US = 2.0


@dataclass(frozen=True, slots=True)
class LinkSpec:
    name: str
    bandwidth_gbps: float  # GB/s per GPU, one direction
    latency_us: float
    overhead_us: float
    source: str

    def transfer_s(self, link_bytes: float) -> float:
        """Seconds one transfer takes when its busiest GPU link carries `link_bytes`."""
        return (self.overhead_us + self.latency_us) * 1e-6 + link_bytes / (self.bandwidth_gbps * 1e9)


def _rdma(name: str, gbit: float, source: str) -> LinkSpec:
    return LinkSpec(name, gbit / 8, RDMA_LATENCY_US, NIXL_POST_US, source)


LINKS: dict[str, LinkSpec] = {spec.name: spec for spec in (
    LinkSpec("nvlink4", 450.0, NVLINK_LATENCY_US, NIXL_POST_US,
             "NVLink 4 within an HGX H100/H200 node: 900 GB/s per GPU both ways (NVIDIA H100 datasheet)"),
    LinkSpec("nvlink3", 300.0, NVLINK_LATENCY_US, NIXL_POST_US,
             "NVLink 3 within an HGX A100 node: 600 GB/s per GPU both ways (NVIDIA A100 datasheet)"),
    _rdma("infiniband-ndr", 400, "InfiniBand NDR, one 400 Gb/s ConnectX-7 per GPU (NVIDIA DGX H100 user guide)"),
    _rdma("infiniband-hdr", 200, "InfiniBand HDR, one 200 Gb/s ConnectX-6 per GPU (NVIDIA DGX A100 user guide)"),
    _rdma("roce-400g", 400, "RoCE v2 over 400 GbE, one NIC per GPU"),
    _rdma("roce-200g", 200, "RoCE v2 over 200 GbE, one NIC per GPU"),
    _rdma("ethernet-100g", 100, "RoCE v2 over 100 GbE, one NIC per GPU"),
    _rdma("mooncake-a800", 100, "Mooncake's testbed: 800 Gb/s of RDMA per node of 8 A800 GPUs (Qin et al., "
                                "Mooncake, FAST 2025, section 8.1)"),
)}
DEFAULT_LINK = "infiniband-ndr"
