"""A GPU's link to host memory (PCIe), one FIFO per direction: what KV loads (host to device) and
stores (device to host) cost and when they end.

Each direction serves its transfers one at a time in the order they are issued (vLLM's offloading
worker submits them as cudaMemcpyAsync on one stream per direction), at `gbps` alone and at
`duplex_gbps` / 2 while the other direction is busy too (the H100's DMA engines: ~50 GB/s one way,
83.4 GB/s both ways together; vLLM's KV-offloading blog, 2026-01-08). A transfer costs `latency_s`
plus its bytes at those rates. Every figure is per GPU: a tensor-parallel replica's ranks move their
shards over their own links at once.
"""

from __future__ import annotations


class HostLink:
    """One direction; `other` is the opposite direction (set by `host_links`)."""

    __slots__ = ("rate", "shared_rate", "latency_s", "free_at", "other", "busy_s", "bytes", "count")

    def __init__(self, gbps: float, duplex_gbps: float, latency_s: float):
        self.rate, self.shared_rate, self.latency_s = gbps * 1e9, min(gbps, duplex_gbps / 2) * 1e9, latency_s
        self.free_at = 0.0
        self.other: HostLink = self
        self.busy_s = 0.0
        self.bytes = 0
        self.count = 0

    def transfer(self, ready: float, nbytes: int) -> tuple[float, float]:
        """Issue `nbytes` at `ready`: (start, end). The part that overlaps the other direction's queued
        work runs at the shared rate."""
        start = max(ready, self.free_at)
        t = start + self.latency_s
        overlap_end = self.other.free_at
        if overlap_end > t and self.other is not self:
            room = (overlap_end - t) * self.shared_rate
            end = t + nbytes / self.shared_rate if nbytes <= room else overlap_end + (nbytes - room) / self.rate
        else:
            end = t + nbytes / self.rate
        self.free_at = end
        self.busy_s += end - start
        self.bytes += nbytes
        self.count += 1
        return start, end


def host_links(h2d_gbps: float, d2h_gbps: float, duplex_gbps: float, latency_s: float) -> tuple[HostLink, HostLink]:
    """(host to device, device to host) of one GPU."""
    h2d, d2h = HostLink(h2d_gbps, duplex_gbps, latency_s), HostLink(d2h_gbps, duplex_gbps, latency_s)
    h2d.other, d2h.other = d2h, h2d
    return h2d, d2h
