"""`kvsim memory`: the per-GPU KV capacity breakdown, bytes and sequences that fit per length and
policy, and the FLOPs a shared prefix saves, as data rows, as plain records (`memory_records`, behind
`kvsim.memory` and the dashboard) and as rich tables for the terminal."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvsim.errors import KvsimError
from kvsim.perf.memory import (KV_ELEM_BYTES, GiB, KvCapacity, check_capacity, compute_capacity,
                               kv_bytes_per_token, max_model_len, prefill_flops, prefill_flops_saved)
from kvsim.scenario.catalog import GpuSpec, ModelSpec
from kvsim.scenario.limits import MAX_TOKENS

SEQ_LENS = (1024, 4096, 16384, 32768, 131072)  # lengths of the `kvsim memory` table


@dataclass(slots=True, frozen=True)
class MemoryRow:
    """One sequence length under one policy: what a sequence reserves and how many fit."""

    policy: str
    allocator: str
    kv_cache_dtype: str
    seq_len: int
    bytes_per_seq: int
    num_seqs: int


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
    tp, max_len = scenario.hardware.tensor_parallel_size, max_model_len(scenario, model)
    _check_lists(kv_dtypes, seq_lens)
    lens = table_lengths(max_len) if seq_lens is None else sorted({min(n, max_len) for n in seq_lens})
    rows = []
    for policy in scenario.policies:
        for dtype in kv_dtypes or (policy.kv_cache_dtype,):
            pol = replace_dtype(policy, dtype)
            cap = compute_capacity(scenario, pol, model, gpu)
            per_token = kv_bytes_per_token(model, dtype, tp, pol.kv_cache_scales == "per_token")
            for n in lens:
                slots = reserved_tokens(pol, n, cap.block_size, max_len)
                rows.append(MemoryRow(policy.name, policy.allocator, dtype, n, math.ceil(slots * per_token),
                                      cap.max_tokens // slots))
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
    policy and length (`seq_lens`, default the table's), and what a shared prefix saves."""
    tp = scenario.hardware.tensor_parallel_size
    capacity = [{"kv_cache_dtype": dtype, "policies": [p.name for p in pols], **asdict(cap),
                 "kv_in_blocks": cap.num_blocks * cap.bytes_per_block,
                 "bytes_per_token": kv_bytes_per_token(model, dtype, tp), "problem": problem}
                for dtype, pols, cap, problem in capacities(scenario, model, gpu, kv_dtypes)]
    saved = prefix_savings(scenario, model)
    return {
        "model": model.name, "gpu": gpu.name, "tensor_parallel_size": tp,
        "max_model_len": max_model_len(scenario, model),
        "capacity": capacity,
        "bytes_per_token": [{"kv_cache_dtype": d, "bytes_per_token": kv_bytes_per_token(model, d, tp)}
                            for d in ("auto", *KV_ELEM_BYTES)],
        "sequences": [asdict(r) for r in memory_table(scenario, model, gpu, kv_dtypes, seq_lens)],
        "prefix": None if saved is None else dict(zip(("prefix_len", "prompt_len", "flops_saved", "flops_full"),
                                                      saved)),
    }


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f} GiB" if x >= 0 else f"none ({-x / GiB:,.2f} GiB short)"


def _bytes(x: float) -> str:
    return f"{x / 2**20:,.1f} MiB" if x < GiB else _gib(x)


def render_memory(scenario, model: ModelSpec, gpu: GpuSpec, kv_dtypes=None) -> list:
    """rich Tables for `kvsim memory`: the per-GPU breakdown per kv dtype, then bytes and fits per length."""
    from rich.markup import escape
    from rich.table import Table

    tp = scenario.hardware.tensor_parallel_size
    head = Table(title=f"KV capacity per GPU: {model.name} on {gpu.name}, tp={tp}")
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
    if notes:
        head.caption = "\n".join(notes)

    rows = memory_table(scenario, model, gpu, kv_dtypes)
    lens = table_lengths(max_model_len(scenario, model))
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
    saved = prefix_savings(scenario, model)
    if saved:
        p_len, total, flops, full = saved
        seqs.caption = (f"FLOPs saved by caching the {p_len}-token shared prefix: {flops / 1e12:,.2f} TFLOP per hit "
                        f"({flops / full:.0%} of a {total}-token prompt's prefill)")
    return [head, seqs]
