"""summary.json's `kv_offload` section: what a policy's offload tiers did (kvsim.engine.offload_stats),
per tier and over time, with the release it mirrors.

Hit rates are shares of the prompt tokens of every admission (a request re-admitted after a preemption
counts again): `gpu` the GPU prefix cache's, `cpu` and `disk` the tokens loaded from each tier past
them. `links` gives each direction's busy share of the replicas' time (per GPU: the ranks move at once).
"""

from __future__ import annotations

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
    return out


def _moves(count: int, blocks: int, nbytes: int, seconds: float) -> dict:
    return {"count": count, "blocks": blocks, "bytes": nbytes, "transfer_s": seconds,
            "mean_transfer_s": seconds / count if count else None}


def _timeseries(s) -> dict:
    keys = sorted(s.buckets)
    out = {"interval_s": s.interval, "time_s": [k * s.interval for k in keys]}
    for i, name in enumerate(BUCKET_FIELDS):
        out[name] = [s.buckets[k][i] for k in keys]
    return out
