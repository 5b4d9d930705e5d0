"""summary.json's `kv_offload` section: what a policy's offload tiers did (kvsim.engine.offload_stats),
per tier and over time, with the release it mirrors.

Hit rates are shares of the prompt tokens of every admission (a request re-admitted after a preemption
counts again): `gpu` the GPU prefix cache's, `cpu` and `disk` the tokens loaded from each tier past
them. `links` gives each direction's busy share of the replicas' time (per GPU: the ranks move at once).
"""

from __future__ import annotations

import numpy as np

from kvsim.engine.belady import belady_hits
from kvsim.engine.offload_stats import BUCKET_FIELDS

RELEASE = {"native": "vLLM v0.26.0 OffloadingConnector (CPUOffloadingSpec; TieringOffloadingSpec with a disk tier)",
           "lmcache": "LMCache's LMCacheConnectorV1 (local CPU and local disk backends) on vLLM v0.26.0"}


def _share(part: float, whole: float):
    return part / whole if whole else None


def offload_summary(tiers, duration_s: float, summary: dict) -> dict:
    s, settings = tiers.stats, tiers.settings
    replicas = max(1, len(tiers.connectors))
    prompt = s.prompt_tokens
    out = {"connector": RELEASE[settings.backend], **settings.describe(),
           "admissions": s.admissions,
           "hit_rate": {"gpu": _share(s.gpu_hit_tokens, prompt), "cpu": _share(s.cpu_hit_tokens, prompt),
                        "disk": _share(s.disk_hit_tokens, prompt) if settings.disk else None},
           "tokens": {"prompt": prompt, "gpu_hits": s.gpu_hit_tokens, "cpu_hits": s.cpu_hit_tokens,
                      "disk_hits": s.disk_hit_tokens},
           "loads": _moves(s.loads, s.loaded_blocks, s.loaded_bytes, s.load_s),
           "stores": _moves(s.stores, s.stored_blocks, s.stored_bytes, s.store_s),
           "evictions": {"cpu": sum(c.cpu.evictions for c in tiers.connectors)},
           "deferred_admissions": s.deferred, "store_failures": s.store_failures,
           "sync_s": s.sync_s}
    if settings.disk:
        out["promotions"] = _moves(s.promotions, s.promoted_blocks, s.promoted_bytes, s.promote_s)
        out["disk_writes"] = {"blocks": s.cascaded_blocks, "bytes": s.cascaded_bytes}
        out["evictions"]["disk"] = sum(c.disk.evictions for c in tiers.connectors)
    span = duration_s * replicas
    out["links"] = {"h2d_busy_fraction": _share(sum(c.h2d.busy_s for c in tiers.connectors), span),
                    "d2h_busy_fraction": _share(sum(c.d2h.busy_s for c in tiers.connectors), span)}
    out["timeseries"] = _timeseries(s)
    if s.record:
        out["optimal"] = optimal(s, settings)
    return out


def optimal(stats, settings) -> dict:
    """Belady's hits (kvsim.engine.belady) on each replica's admissions, with the CPU tier's capacity (and
    the CPU and disk tiers' together), as shares of the prompt tokens; beside the run's."""
    out = {"cpu_hit_rate": None, "simulated_cpu_hit_rate": _share(stats.cpu_hit_tokens, stats.prompt_tokens)}
    if not stats.refs:
        return out
    keys = np.concatenate([k for _, k, _ in stats.refs])
    ids = np.unique(keys, return_inverse=True)[1]
    counted = np.ones(len(ids), dtype=bool)
    replica = np.empty(len(ids), dtype=np.int64)
    at = 0
    for rep, k, held in stats.refs:
        counted[at:at + held] = False
        replica[at:at + len(k)] = rep
        at += len(k)
    tiers = {"cpu": settings.num_blocks}
    if settings.disk:
        tiers["cpu_and_disk"] = settings.num_blocks + settings.disk.num_blocks
        out["simulated_cpu_and_disk_hit_rate"] = _share(stats.cpu_hit_tokens + stats.disk_hit_tokens,
                                                        stats.prompt_tokens)
    for name, capacity in tiers.items():
        hits = sum(belady_hits(ids[replica == r], counted[replica == r], capacity) for r in np.unique(replica))
        out[f"{name}_hit_rate"] = _share(hits * settings.block_size, stats.prompt_tokens)
    return out


def oracle_ttft(run, oracle, oracle_summary: dict) -> dict:
    """The optimal bound's TTFT: the run's (`run`: its Metrics) beside the re-run's whose CPU tiers evicted
    by Belady's MIN on the run's recorded lookups (kvsim.engine.belady_tier)."""
    def figures(metrics) -> dict:
        ttft = np.frombuffer(metrics.ttft, dtype=np.float64) * 1e3
        if not len(ttft):
            return {"mean": None, "p50": None, "p90": None, "p99": None}
        return {"mean": float(ttft.mean()), **{f"p{q}": float(np.percentile(ttft, q)) for q in (50, 90, 99)}}
    hit = (oracle_summary.get("kv_offload") or {}).get("hit_rate") or {}
    return {"ttft_ms": figures(oracle), "simulated_ttft_ms": figures(run), "oracle_cpu_hit_rate": hit.get("cpu"),
            "oracle": "the policy re-run with its CPU tiers evicting by Belady's MIN on this run's lookups"}


def _moves(count: int, blocks: int, nbytes: int, seconds: float) -> dict:
    return {"count": count, "blocks": blocks, "bytes": nbytes, "transfer_s": seconds,
            "mean_transfer_s": seconds / count if count else None}


def _timeseries(s) -> dict:
    keys = sorted(s.buckets)
    out = {"interval_s": s.interval, "time_s": [k * s.interval for k in keys]}
    for i, name in enumerate(BUCKET_FIELDS):
        out[name] = [s.buckets[k][i] for k in keys]
    return out
