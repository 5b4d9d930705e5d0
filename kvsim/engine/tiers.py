"""A policy's KV offload tiers, built once: the resolved settings (kvsim.perf.offload), the stats every
replica's connector counts into, and a `make_replica` that gives each replica its connector (vLLM's
native OffloadingConnector or LMCache's)."""

from __future__ import annotations

from typing import Optional

from kvsim.engine.belady_tier import BeladyTier, Future
from kvsim.engine.connector import make_connected_replica
from kvsim.engine.lmcache import LMCacheConnector
from kvsim.engine.offload import OffloadingConnector
from kvsim.engine.offload_stats import OffloadStats
from kvsim.perf.offload import OffloadSettings, offload_settings

CONNECTORS = {"native": OffloadingConnector, "lmcache": LMCacheConnector}


class OffloadTiers:
    """`oracle`: per replica, the admissions a first run recorded (kvsim.engine.belady_tier.Future): the
    native CPU tiers then evict by Belady's MIN (the optimal bound's TTFT). `oracle_ttft`: a first run
    that should be followed by such a re-run."""

    def __init__(self, settings: OffloadSettings, interval: float, record: bool = False,
                 oracle: Optional[list] = None, oracle_ttft: bool = False):
        self.settings, self.oracle = settings, oracle
        self.oracle_ttft = oracle_ttft and oracle is None and settings.backend == "native"
        self.stats = OffloadStats(interval, record or self.oracle_ttft)
        self.connectors: list = []

    def make_replica(self, index: int, settings, backend, interval: float):
        cls = CONNECTORS[self.settings.backend]

        def factory(scheduler):
            connector = cls(self.settings, scheduler, self.stats, index)
            if self.oracle is not None:
                s = self.settings
                connector.cpu = BeladyTier(s.num_blocks, self.oracle[index], lambda: connector.admissions,
                                           s.store_threshold, s.max_tracker_size)
                connector.arrays = True
            self.connectors.append(connector)
            return connector
        return make_connected_replica(index, settings, backend, interval, factory)

    def futures(self) -> list:
        """Per replica, what its admissions used (for an oracle re-run)."""
        per: list = [[] for _ in self.connectors]
        for replica, keys, held in self.stats.refs:
            per[replica].append((keys, held))
        return [Future(refs) for refs in per]


def offload_tiers(scenario, policy, model, gpu, capacity, interval: float,
                  oracle: Optional[list] = None) -> Optional[OffloadTiers]:
    settings = offload_settings(scenario, policy, model, gpu, capacity)
    if settings is None:
        return None
    cfg = scenario.kv_offload
    return OffloadTiers(settings, interval, cfg.optimal_bound and oracle is None, oracle, cfg.optimal_ttft)
