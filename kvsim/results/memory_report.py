"""`kvsim memory`: the per-GPU KV capacity breakdown, bytes and sequences that fit per length and
policy, vLLM's KV cache groups beside the naive "every layer keeps the whole context" figures, and
the FLOPs a shared prefix saves, as data rows, as plain records (`memory_records`, behind
`kvsim.memory`, the dashboard and `kvsim memory --json`) and as rich tables for the terminal.

Sequences that fit a paged cache (vLLM v0.11.0): `num_seqs` is vLLM's own "maximum concurrency"
with max_model_len at that length, each request reserving what it may hold at its peak (a
sliding-window group keeps the window plus a max_num_batched_tokens prefill chunk);
`num_seqs_decoding` counts sequences past their prefill, whose windowed groups have handed back
what left the window; `num_seqs_naive` assumes every layer keeps the whole context.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvsim.errors import KvsimError
from kvsim.perf.kv_groups import CHUNKED_SPEC, SLIDING_SPEC, KvCacheLayout
from kvsim.perf.offload import offload_settings, tier_record
from kvsim.perf.memory import (KV_ELEM_BYTES, GiB, KvCapacity, check_capacity, compute_capacity, engine_limits,
                               kv_bytes_per_token, max_model_len, mha_bytes_per_token, policy_layout,
                               prefill_flops, prefill_flops_saved)
from kvsim.scenario.catalog import GpuSpec, ModelSpec
from kvsim.scenario.layout import hardware_layout, replica_gpus
from kvsim.scenario.limits import MAX_TOKENS

SEQ_LENS = (1024, 4096, 8192, 16384, 32768, 131072)  # lengths of the `kvsim memory` table


@dataclass(slots=True, frozen=True)
class MemoryRow:
    """One sequence length under one policy: what a sequence reserves and how many fit."""

    policy: str
    allocator: str
    kv_cache_dtype: str
    seq_len: int
    bytes_per_seq: int
    num_seqs: int
    num_seqs_decoding: int = 0  # paged: sequences past their prefill (windowed groups hold only the window)
    num_seqs_naive: int = 0  # every layer keeping the whole context


def table_lengths(max_len: int) -> list[int]:
    return sorted({min(n, max_len) for n in SEQ_LENS})


def reserved_tokens(policy, seq_len: int, block_size: int, max_len: int) -> int:
    """KV slots a sequence of `seq_len` tokens holds: whole blocks when paged; a slab when contiguous."""
    if policy.allocator == "paged":
        return math.ceil(seq_len / block_size) * block_size
    return max_len if policy.contiguous_reserve == "max_model_len" else seq_len


def _check_lists(kv_dtypes, seq_lens) -> None:
    if isinstance(kv_dtypes, str) or isinstance(seq_lens, str):
        raise KvsimError("kv_dtypes and seq_lens: expected lists, got a string")
    for n in seq_lens or ():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS:
            raise KvsimError(f"seq_lens: each must be an integer in [1, {MAX_TOKENS:,}], got {n!r}")


def memory_table(scenario, model: ModelSpec, gpu: GpuSpec, kv_dtypes=None, seq_lens=None) -> list[MemoryRow]:
    """Rows for every policy (crossed with `kv_dtypes` if given, else its own dtype) and sequence length
    (`seq_lens` capped at max_model_len, default the table's lengths)."""
    max_len = max_model_len(scenario, model)
    _check_lists(kv_dtypes, seq_lens)
    lens = table_lengths(max_len) if seq_lens is None else sorted({min(n, max_len) for n in seq_lens})
    rows = []
    for policy in scenario.policies:
        for dtype in kv_dtypes or (policy.kv_cache_dtype,):
            pol = replace_dtype(policy, dtype)
            rows += _policy_rows(scenario, pol, model, gpu, lens, max_len)
    return rows


def _policy_rows(scenario, pol, model: ModelSpec, gpu: GpuSpec, lens, max_len: int) -> list[MemoryRow]:
    cap = compute_capacity(scenario, pol, model, gpu)
    layout, naive = policy_layout(scenario, pol, model, gpu), policy_layout(scenario, pol, model, gpu, naive=True)
    chunk = engine_limits(scenario, pol, model, gpu).max_num_batched_tokens
    naive_blocks = naive.num_blocks(cap.kv)
    rows = []
    for n in lens:
        naive_seqs = naive_blocks // naive.blocks_held(n, n)
        if pol.allocator == "paged":
            reserved, held = layout.max_blocks(n, chunk), layout.blocks_held(n)
            rows.append(MemoryRow(pol.name, pol.allocator, pol.kv_cache_dtype, n, reserved * cap.bytes_per_block,
                                  cap.num_blocks // reserved, cap.num_blocks // held, naive_seqs))
        else:  # a slab of every layer, as kvsim's contiguous allocator holds it
            slots = reserved_tokens(pol, n, cap.block_size, max_len)
            per_token = naive.block_bytes / naive.block_size
            seqs = naive_blocks * naive.block_size // slots
            rows.append(MemoryRow(pol.name, pol.allocator, pol.kv_cache_dtype, n, math.ceil(slots * per_token),
                                  seqs, seqs, naive_seqs))
    return rows


def replace_dtype(policy, kv_cache_dtype: str):
    return policy if policy.kv_cache_dtype == kv_cache_dtype else policy.model_copy(
        update={"kv_cache_dtype": kv_cache_dtype})


def typical_prompt_len(workload) -> int | None:
    """A representative prompt length of a synthetic workload; None for trace lengths."""
    d = workload.prompt_len
    if d.dist == "fixed":
        return d.value
    if d.dist == "uniform":
        return (d.min + d.max) // 2
    return round(d.mean) if d.dist == "lognormal" else None


def prefix_savings(scenario, model: ModelSpec) -> tuple[int, int, float, float] | None:
    """(prefix_len, prompt_len, FLOPs saved per hit, FLOPs of the full prefill) for the scenario's
    shared prefix, or None without one."""
    prefix = scenario.workload.prefix
    if prefix is None:
        return None
    total = max(prefix.prefix_len, typical_prompt_len(scenario.workload) or prefix.prefix_len)
    return (prefix.prefix_len, total, prefill_flops_saved(model, prefix.prefix_len, total),
            prefill_flops(model, total))


def capacities(scenario, model: ModelSpec, gpu: GpuSpec,
               kv_dtypes=None) -> list[tuple[str, list, KvCapacity, str | None]]:
    """(kv dtype, policies, per-GPU breakdown, why it cannot serve or None) per kv dtype in use (or
    each of `kv_dtypes`) and activation reserve: a policy's step budget (its own
    max_num_batched_tokens, chunked prefill or not) sizes the activations, so two policies of one
    dtype share a column only when their breakdowns are the same."""
    groups: dict[tuple, tuple[str, list, KvCapacity]] = {}
    for p in scenario.policies:
        for d in kv_dtypes or (p.kv_cache_dtype,):
            cap = compute_capacity(scenario, replace_dtype(p, d), model, gpu)
            key = (d, tuple(sorted(asdict(cap).items())))
            if key in groups:
                groups[key][1].append(p)
            else:
                groups[key] = (d, [p], cap)
    out = []
    for dtype, pols, cap in groups.values():
        pol = replace_dtype(pols[0], dtype)
        try:
            check_capacity(scenario, pol, model, gpu, cap)
            problem = None
        except KvsimError as exc:
            problem = str(exc)
        out.append((dtype, pols, cap, problem))
    return out


def memory_records(scenario, model: ModelSpec, gpu: GpuSpec, kv_dtypes=None, seq_lens=None) -> dict:
    """Everything `kvsim memory` prints, as plain JSON values (bytes, counts, FLOPs): the per-GPU
    breakdown per kv dtype, bytes per token of every kv dtype, the bytes and sequences that fit per
    policy and length (`seq_lens`, default the table's), each policy's KV cache groups beside the
    naive every-layer-full figures (`policies`), and what a shared prefix saves."""
    tp = scenario.hardware.tensor_parallel_size
    capacity = [{"kv_cache_dtype": dtype, "policies": [p.name for p in pols], **asdict(cap),
                 "kv_in_blocks": cap.num_blocks * cap.bytes_per_block,
                 "bytes_per_token": kv_bytes_per_token(model, dtype, tp), "problem": problem}
                for dtype, pols, cap, problem in capacities(scenario, model, gpu, kv_dtypes)]
    saved = prefix_savings(scenario, model)
    rows = memory_table(scenario, model, gpu, kv_dtypes, seq_lens)
    return {
        "model": model.name, "gpu": gpu.name, "tensor_parallel_size": tp,
        "max_model_len": max_model_len(scenario, model),
        "capacity": capacity,
        "bytes_per_token": [{"kv_cache_dtype": d, "bytes_per_token": kv_bytes_per_token(model, d, tp)}
                            for d in ("auto", *KV_ELEM_BYTES)],
        "sequences": [asdict(r) for r in rows],
        "policies": policy_records(scenario, model, gpu, rows, kv_dtypes),
        "prefix": None if saved is None else dict(zip(("prefix_len", "prompt_len", "flops_saved", "flops_full"),
                                                      saved)),
    }


def policy_records(scenario, model: ModelSpec, gpu: GpuSpec, rows: list[MemoryRow], kv_dtypes=None) -> list[dict]:
    """Per policy (and kv dtype): vLLM's KV cache groups, blocks, tokens, bytes per token where one
    number says it, and sequences that fit keyed by length ("8192": n), with the naive counterparts."""
    out = []
    for policy in scenario.policies:
        for dtype in kv_dtypes or (policy.kv_cache_dtype,):
            pol = replace_dtype(policy, dtype)
            mine = [r for r in rows if r.policy == pol.name and r.kv_cache_dtype == dtype]
            out.append(_policy_record(scenario, pol, model, gpu, mine))
    return out


def _policy_record(scenario, pol, model: ModelSpec, gpu: GpuSpec, rows: list[MemoryRow]) -> dict:
    tp = scenario.hardware.tensor_parallel_size
    cap = compute_capacity(scenario, pol, model, gpu)
    layout, naive = policy_layout(scenario, pol, model, gpu), policy_layout(scenario, pol, model, gpu, naive=True)
    chunk = engine_limits(scenario, pol, model, gpu).max_num_batched_tokens
    naive_blocks = naive.num_blocks(cap.kv)
    per_token = kv_bytes_per_token(model, pol.kv_cache_dtype, tp, pol.kv_cache_scales == "per_token")
    key = {r.seq_len: str(r.seq_len) for r in rows}
    return {
        "policy": pol.name, "allocator": pol.allocator, "kv_cache_dtype": pol.kv_cache_dtype,
        "block_size": layout.block_size, "hybrid_kv_cache_manager": layout.hybrid,
        "kv_cache_groups": [group_record(g, [r.seq_len for r in rows], chunk) for g in layout.groups],
        "layers_per_group": layout.group_size, "padding_layers": layout.padding_layers,
        "bytes_per_block": layout.block_bytes, "num_blocks": cap.num_blocks, "kv_tokens": cap.max_tokens,
        **(mha_record(model, pol, cap, [r.seq_len for r in rows], tp) if model.mla else {}),
        "kv_bytes_per_token": None if windowed(layout, max_model_len(scenario, model)) else per_token,
        "bytes_per_seq": {key[r.seq_len]: r.bytes_per_seq for r in rows},
        "max_sequences": {key[r.seq_len]: r.num_seqs for r in rows},
        "max_sequences_decoding": {key[r.seq_len]: r.num_seqs_decoding for r in rows},
        "num_blocks_naive": naive_blocks, "kv_tokens_naive": naive.tokens(naive_blocks),
        "kv_bytes_per_token_naive": per_token,
        "bytes_per_seq_naive": {key[r.seq_len]: naive.blocks_held(r.seq_len, r.seq_len) * naive.block_bytes
                                for r in rows},
        "max_sequences_naive": {key[r.seq_len]: r.num_seqs_naive for r in rows},
        "kv_offload": _offload_record(scenario, pol, model, gpu, cap, [r.seq_len for r in rows]),
    }


def _offload_record(scenario, pol, model: ModelSpec, gpu: GpuSpec, cap, lens) -> dict | None:
    """The policy's offload tiers per replica (kvsim.perf.offload), or None."""
    if not scenario.offloaded(pol) or cap.num_blocks < 1:
        return None
    return tier_record(offload_settings(scenario, pol, model, gpu, cap), lens)


def group_record(group, lens, max_num_batched_tokens: int) -> dict:
    """One KV cache group as plain values: its spec, layers, page and the blocks a sequence of each
    length holds while decoding and has reserved for it (max_model_len at that length)."""
    return {"spec": group.spec, "window": group.window or None, "layers": list(group.layers),
            "block_size": group.block_size, "page_bytes": group.page_bytes,
            "blocks_held": {str(n): group.blocks_held(n) for n in lens},
            "blocks_reserved": {str(n): group.max_blocks(n, max_num_batched_tokens) for n in lens}}


def windowed(layout: KvCacheLayout, max_len: int) -> bool:
    """Whether some group's window frees blocks before max_len: bytes per token are then no one number."""
    return any(g.spec in (SLIDING_SPEC, CHUNKED_SPEC) and g.window < max_len for g in layout.groups)


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f} GiB" if x >= 0 else f"none ({-x / GiB:,.2f} GiB short)"


def _bytes(x: float) -> str:
    return f"{x / 2**20:,.1f} MiB" if x < GiB else _gib(x)


def mha_record(model: ModelSpec, pol, cap, lens, tp: int) -> dict:
    """An MLA model's cache beside what multi-head attention would store (kv_bytes_per_token_mha,
    max_sequences_mha keyed by length, the same KV memory in blocks of the same size)."""
    per_token = mha_bytes_per_token(model, pol.kv_cache_dtype, tp)
    tokens = int(cap.kv // (per_token * cap.block_size)) * cap.block_size
    return {"kv_bytes_per_token_mha": per_token,
            "max_sequences_mha": {str(n): tokens // (-(-n // cap.block_size) * cap.block_size) for n in lens}}


def render_memory(scenario, model: ModelSpec, gpu: GpuSpec, kv_dtypes=None) -> list:
    """rich Tables for `kvsim memory`: the per-GPU breakdown per kv dtype, vLLM's KV cache groups (for
    a model whose layers do not all keep the whole context in one group), then bytes and fits per length."""
    from rich.markup import escape
    from rich.table import Table

    tp = scenario.hardware.tensor_parallel_size
    hw = scenario.hardware
    per_replica = replica_gpus(hw.tensor_parallel_size, hw.data_parallel_size)
    head = Table(title=f"KV capacity per GPU: {model.name} on {gpu.name}, {hardware_layout(hw)} "
                       f"({per_replica} GPU{'s' if per_replica > 1 else ''} a replica"
                       + (", a KV cache each" if hw.data_parallel_size > 1 else "") + ")")
    head.add_column("")
    caps, notes = [], []
    for dtype, pols, cap, problem in capacities(scenario, model, gpu, kv_dtypes):
        head.add_column(f"{dtype} ({', '.join(p.name for p in pols)})", justify="right")
        caps.append(cap)
        if problem:
            notes.append(escape(problem))
    for i, (label, _) in enumerate(caps[0].rows()):
        head.add_row(label, *(_gib(c.rows()[i][1]) for c in caps))
    head.add_row("bytes per block", *(f"{c.bytes_per_block:,}" for c in caps))
    head.add_row("blocks", *(f"{c.num_blocks:,}" for c in caps))
    head.add_row("max tokens", *(f"{c.max_tokens:,}" for c in caps))
    grouped = grouped_policy(scenario, model, gpu)  # the first policy whose layers are not one full group
    layout = policy_layout(scenario, grouped or scenario.policies[0], model, gpu)
    special = grouped is not None
    if special:
        head.add_row("KV cache groups", *(_groups_text(policy_layout(scenario, pols[0], model, gpu))
                                          for _, pols, _, _ in capacities(scenario, model, gpu, kv_dtypes)))
    if model.mla:  # the latent against what the heads' own keys and values would take
        for label, pick in (("bytes per token (MLA)", kv_bytes_per_token), ("... with MHA", mha_bytes_per_token)):
            head.add_row(label, *(f"{pick(model, d, tp):,.0f}" for d, _, _, _ in capacities(scenario, model, gpu,
                                                                                         kv_dtypes)))
    if notes:
        head.caption = "\n".join(notes)
    out = [head]
    if special:
        out.append(_groups_table(scenario, model, gpu, grouped, layout))

    rows = memory_table(scenario, model, gpu, kv_dtypes)
    lens = table_lengths(max_model_len(scenario, model))
    naive_differs = any(r.num_seqs_naive != r.num_seqs for r in rows if r.allocator == "paged")
    seqs = Table(title="Bytes per sequence (sequences that fit)")
    seqs.add_column("policy")
    seqs.add_column("allocator")
    seqs.add_column("kv dtype")
    for n in lens:
        seqs.add_column(f"{n:,} tok", justify="right")
    for i in range(0, len(rows), len(lens)):
        r = rows[i:i + len(lens)]
        seqs.add_row(escape(r[0].policy), r[0].allocator, r[0].kv_cache_dtype,
                     *(f"{_bytes(x.bytes_per_seq)} ({x.num_seqs:,})" for x in r))
        if naive_differs and r[0].allocator == "paged":
            seqs.add_row("", "fit decoding", "", *(f"{x.num_seqs_decoding:,}" for x in r))
            seqs.add_row("", "fit, no window", "", *(f"{x.num_seqs_naive:,}" for x in r))
    notes = []
    if naive_differs:
        notes.append("sequences that fit: vLLM's maximum concurrency, each request holding what it may reach at its "
                     "peak (a windowed group: its window plus a prefill chunk); fit decoding: sequences past their "
                     "prefill, whose sliding-window layers have handed back what left the window; fit, no window: "
                     "if every layer kept the whole context (no sliding window), for comparison")
    tiers = [(p, _offload_record(scenario, p, model, gpu, compute_capacity(scenario, p, model, gpu), lens))
             for p in scenario.policies]
    if any(t for _, t in tiers):
        off = Table(title="KV offload tiers per replica (tokens, GiB; sequences of each length they hold)")
        for col in ("policy", "tier", "tokens", "GiB", *(f"{n:,} tok" for n in lens)):
            off.add_column(col, justify="left" if col in ("policy", "tier") else "right")
        for pol, t in tiers:
            for name, rec in (t or {}).items():
                off.add_row(escape(pol.name), name, f"{rec['tokens']:,}", f"{rec['gib']:,.1f}",
                            *(f"{rec['sequences'][str(n)]:,}" for n in lens))
        out.append(off)
    saved = prefix_savings(scenario, model)
    if saved:
        p_len, total, flops, full = saved
        notes.append(f"FLOPs saved by caching the {p_len}-token shared prefix: {flops / 1e12:,.2f} TFLOP per hit "
                     f"({flops / full:.0%} of a {total}-token prompt's prefill)")
    if notes:
        seqs.caption = "\n".join(notes)
    return [*out, seqs]


def grouped_policy(scenario, model: ModelSpec, gpu: GpuSpec):
    """The first policy whose KV cache is not one group of full-attention layers (vLLM's hybrid manager or
    a windowed group: what the groups table shows), or None."""
    for policy in scenario.policies:
        layout = policy_layout(scenario, policy, model, gpu)
        if len(layout.groups) > 1 or layout.groups[0].spec != "FullAttentionSpec":
            return policy
    return None


def _groups_text(layout: KvCacheLayout) -> str:
    text = f"{len(layout.groups)} × {layout.group_size} layers"
    return text + (f" ({layout.padding_layers} padding)" if layout.padding_layers else "")


def _groups_table(scenario, model: ModelSpec, gpu: GpuSpec, pol, layout: KvCacheLayout):
    """vLLM's KV cache groups of `pol` (`grouped_policy`): per group its layers, page and the blocks a
    sequence of each length holds while decoding (and has reserved for it)."""
    from rich.table import Table

    chunk = engine_limits(scenario, pol, model, gpu).max_num_batched_tokens
    lens = table_lengths(max_model_len(scenario, model))
    mode = "hybrid manager" if layout.hybrid else "one block table"
    t = Table(title=f"vLLM v0.11.0 KV cache groups ({mode}; {pol.name}, block_size {layout.block_size}): "
                    f"blocks held while decoding (reserved per request)")
    for col in ("group", "spec", "window", "layers", "page"):
        t.add_column(col, justify="right" if col in ("window", "page") else "left")
    for n in lens:
        t.add_column(f"{n:,} tok", justify="right")
    for i, g in enumerate(layout.groups):
        t.add_row(str(i), g.spec, f"{g.window:,}" if g.window else "", _layers_text(g.layers), f"{g.page_bytes:,} B",
                  *(f"{g.blocks_held(n):,} ({g.max_blocks(n, chunk):,})" for n in lens))
    t.caption = (f"a pool block is {layout.group_size} pages ({_bytes(layout.block_bytes)}); "
                 f"every layer full would hold {', '.join(f'{-(-n // layout.block_size):,}' for n in lens)} blocks "
                 f"of {layout.num_layers} pages")
    return t


def _layers_text(layers) -> str:
    if len(layers) <= 4:
        return ", ".join(map(str, layers))
    return f"{len(layers)}: {layers[0]}, {layers[1]}, ..., {layers[-1]}"
