"""A policy's KV offload tiers, built once: the resolved settings (kvsim.perf.offload), the stats every
replica's connector counts into, and a `make_replica` that gives each replica its connector (vLLM's
native OffloadingConnector or LMCache's)."""

from __future__ import annotations

from typing import Optional

from kvsim.engine.connector import make_connected_replica
from kvsim.engine.lmcache import LMCacheConnector
from kvsim.engine.offload import OffloadingConnector
from kvsim.engine.offload_stats import OffloadStats
from kvsim.perf.offload import OffloadSettings, offload_settings

CONNECTORS = {"native": OffloadingConnector, "lmcache": LMCacheConnector}


class OffloadTiers:
    def __init__(self, settings: OffloadSettings, interval: float, record: bool = False):
        self.settings = settings
        self.stats = OffloadStats(interval, record)
        self.connectors: list = []

    def make_replica(self, index: int, settings, backend, interval: float):
        cls = CONNECTORS[self.settings.backend]

        def factory(scheduler):
            connector = cls(self.settings, scheduler, self.stats, index)
            self.connectors.append(connector)
            return connector
        return make_connected_replica(index, settings, backend, interval, factory)


def offload_tiers(scenario, policy, model, gpu, capacity, interval: float) -> Optional[OffloadTiers]:
    settings = offload_settings(scenario, policy, model, gpu, capacity)
    return None if settings is None else OffloadTiers(settings, interval, scenario.kv_offload.optimal_bound)
