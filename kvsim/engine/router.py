"""Routers: which replica gets each arriving request (`hardware.router`).

- `least_loaded`: the replica with the fewest unfinished requests (the first on ties).
- `round_robin`: replicas in turn.
- `most_free_blocks`: the replica with the most free KV blocks (a disaggregated decode pool's default).
- `prefix_affinity`: cache-aware routing with the router's own view of where prefixes live, as the
  Gateway API Inference Extension's approximate prefix-cache scorer does (the `prefix-cache-scorer`
  that llm-d's approximate prefix-cache-aware routing deploys): the router hashes each prompt in
  blocks into a chain (a block's identity names everything before it), remembers per replica the
  chains it sent there in an LRU sized to that replica's KV cache, and scores a replica by the
  longest prefix of the prompt it sent there. It follows the longest unless that replica holds more
  than AFFINITY_LOAD_FACTOR x the least loaded one's requests + AFFINITY_LOAD_SLACK (the load
  balancing SGLang's cache-aware router applies), and records the prompt at the replica it picks.
  No replica is asked what it caches: like the production routers, the view is an estimate that
  misses evictions the LRU does not foresee and hits an engine finds beyond it.

  The router names ROUTER_BLOCK_TOKENS-token blocks of the prompt's shareable content
  (`Request.token_ids`) by the prefix cache's chained identities (`prefix_cache.block_hashes`, every
  ROUTER_BLOCK_TOKENS / block_size-th block's: computed once a request, shared with the allocators);
  the view holds up to (KV blocks x block_size / ROUTER_BLOCK_TOKENS) identities per replica and
  drops whole routed prompts, oldest first, keeping what a later prompt refreshed. Prefixes are thus
  matched to 512 tokens, the unit in which Mooncake's trace names shared content (the GIE scorer
  hashes 64-character blocks, about 16 tokens, but matches only the first 256 of them), and a lookup
  is a binary search over one dict per replica. Without prefix caching the router has nothing to
  follow and sends requests to the least loaded replica.
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter

from kvsim.engine.block_manager import identities
from kvsim.engine.prefix_cache import ChainMemo, sequence_chain
from kvsim.sequence import Sequence

# follow the longest prefix unless that replica holds more than FACTOR x the least loaded one's
# requests + SLACK
AFFINITY_LOAD_FACTOR, AFFINITY_LOAD_SLACK = 2, 8
ROUTER_BLOCK_TOKENS = 512
GPU_WEIGHT, CPU_WEIGHT = 1.0, 0.8  # llm-d-kv-cache-manager's default backend weights (gpu, cpu)
_load = attrgetter("scheduler.num_unfinished")


class OneReplica:
    def route(self, seq: Sequence) -> int:
        return 0


class LeastLoaded:
    def __init__(self, replicas: list):
        self.replicas = replicas

    def route(self, seq: Sequence) -> int:
        return min(self.replicas, key=_load).index


class RoundRobin:
    def __init__(self, replicas: list):
        self.replicas, self.last = replicas, 0  # an autoscaled pool's list changes as replicas come and go

    def route(self, seq: Sequence) -> int:
        self.last = (self.last + 1) % len(self.replicas)
        return self.replicas[self.last].index


class MostFreeBlocks:
    """The replica with the most free KV blocks (the fewest unfinished requests, then the first, on
    ties): a decode pool's router, as llm-d's KV-cache utilization scorer ranks vLLM instances by
    the KV usage they report. Blocks a replica's queued requests will take count only once taken."""

    def __init__(self, replicas: list):
        self.replicas = replicas

    def route(self, seq: Sequence) -> int:
        return max(self.replicas, key=_free_blocks).index


def _free_blocks(rep) -> tuple[int, int, int]:
    return rep.allocator.num_free_blocks, -rep.scheduler.num_unfinished, -rep.index


class PrefixAffinity:
    """`cpu_capacity_blocks` > 0: the replicas offload KV to a CPU tier of that many router blocks, and
    the router keeps a view of it too, scoring tiers as llm-d's precise prefix-cache scorer does
    (llm-d-kv-cache-manager's LongestPrefixScorer): a replica's score is the sum, over the longest prefix
    of the prompt it holds in any tier, of each block's weight in the best tier holding it (GPU
    GPU_WEIGHT, CPU CPU_WEIGHT)."""

    def __init__(self, replicas: list, capacity_blocks: int, enable_prefix_caching: bool, block_size: int = 16,
                 cpu_capacity_blocks: int = 0):
        self.replicas = replicas
        self.view = PrefixView(len(replicas), capacity_blocks, block_size) if enable_prefix_caching else None
        self.cpu_view = PrefixView(len(replicas), cpu_capacity_blocks, block_size) \
            if enable_prefix_caching and cpu_capacity_blocks > 0 else None

    def route(self, seq: Sequence) -> int:
        replicas = self.replicas
        least = min(replicas, key=_load)
        if self.view is None or seq.request.token_ids is None:
            return least.index
        chain = self.view.chain(seq)
        matched = self.view.match(chain)
        if self.cpu_view is not None:
            matched = [g * GPU_WEIGHT + max(0, c - g) * CPU_WEIGHT for g, c in zip(matched, self.cpu_view.match(chain))]
        best = max(replicas, key=lambda r: (matched[r.index], -_load(r)))
        target = best if _load(best) <= AFFINITY_LOAD_FACTOR * _load(least) + AFFINITY_LOAD_SLACK else least
        self.view.add(target.index, chain)
        if self.cpu_view is not None:
            self.cpu_view.add(target.index, chain)
        return target.index


class PrefixView:
    """The router's estimate of the prompt prefixes each replica caches: per replica, a dict from the
    identity of a router block (its whole prefix) to the stamp of the routing that last sent it
    there, and the routed chains in stamp order. A chain is added whole with one stamp, so a block's
    stamp is never older than a deeper block's of the same chain; dropping the oldest chain's blocks
    that kept its stamp thus leaves every replica's set closed under prefixes, and the longest
    cached prefix of a chain is found by binary search."""

    def __init__(self, num_replicas: int, capacity_blocks: int, block_size: int = 16):
        self.capacity = max(1, capacity_blocks)  # router blocks a replica's view holds
        self.seen: list[dict[int, int]] = [{} for _ in range(num_replicas)]
        self.routed: list[deque] = [deque() for _ in range(num_replicas)]
        self.stamp = 0
        self.stride = max(1, ROUTER_BLOCK_TOKENS // block_size)  # KV blocks a router block
        self.chains = ChainMemo(block_size, identities)  # the allocators' chains (kept on the sequence)

    def chain(self, seq: Sequence) -> list:
        """The identities of the prompt's full router blocks of shareable content: the allocators'
        block identities (each names its whole prefix) at every `stride`-th depth."""
        return sequence_chain(seq, self.chains)[self.stride - 1::self.stride].tolist()

    def add_replica(self) -> None:
        """A new replica (the next index) with an empty view: an autoscaled pool grew."""
        self.seen.append({})
        self.routed.append(deque())

    def match(self, chain: list) -> list[int]:
        """Per replica, how many leading blocks of `chain` it was sent (and has not dropped)."""
        return [_longest_prefix(seen, chain) for seen in self.seen]

    def add(self, replica: int, chain: list) -> None:
        if not chain:
            return
        self.stamp += 1
        seen, routed = self.seen[replica], self.routed[replica]
        seen.update(dict.fromkeys(chain, self.stamp))
        routed.append((self.stamp, chain))
        while len(seen) > self.capacity and len(routed) > 1:
            stamp, old = routed.popleft()
            for identity in old:
                if seen.get(identity) == stamp:  # not sent again since
                    del seen[identity]


def _longest_prefix(seen: dict, chain: list) -> int:
    """The largest m with chain[:m] all in `seen` (a set closed under prefixes)."""
    n = len(chain)
    if not n or chain[0] not in seen:
        return 0
    if chain[-1] in seen:
        return n
    lo, hi = 1, n - 1  # chain[lo - 1] is in, chain[hi] is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in seen:
            lo = mid
        else:
            hi = mid - 1
    return lo


ROUTERS = {"least_loaded": LeastLoaded, "round_robin": RoundRobin, "prefix_affinity": PrefixAffinity,
           "most_free_blocks": MostFreeBlocks}


def make_router(settings, replicas: list, num_blocks: int, cpu_tokens: int = 0, fixed: bool = True):
    """The scenario's router over `replicas` (each with `index` and `scheduler`), whose KV caches
    hold `num_blocks` blocks each (and offload to CPU tiers of `cpu_tokens` tokens each); `fixed`: the
    list never changes (an autoscaled pool's does)."""
    if fixed and len(replicas) == 1:
        return OneReplica()
    if settings.router == "prefix_affinity":
        capacity = num_blocks * settings.block_size // ROUTER_BLOCK_TOKENS
        return PrefixAffinity(replicas, capacity, settings.enable_prefix_caching, settings.block_size,
                              cpu_tokens // ROUTER_BLOCK_TOKENS)
    return ROUTERS[settings.router](replicas)
