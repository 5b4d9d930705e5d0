"""Triton KV-cache kernels on the CPU interpreter against float64 references (tests/kernel_reference.py).

TRITON_INTERPRET must be set before triton.jit decorates the kernels, so it is set here before any
import; no test module collected before this one may import kvsim.backends.triton_engine's kernel modules
(CI also sets TRITON_INTERPRET=1). Shapes are tiny: the interpreter runs each program in numpy.
On a GPU: KVSIM_TEST_DEVICE=cuda TRITON_INTERPRET=0; every tensor of these tests (and of the float64
references) is then made on that device (`torch.set_default_device` for the module, and the caches
allocated there), as the compiled kernels need.
Every output is poisoned with NaN first, block tables are random permutations, contexts are ragged,
and unused cache slots hold NaN (or NaN scales), so reading or skipping the wrong slot shows.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kvsim.backends.triton_engine import decode_attention, prefill_attention  # noqa: E402
from kvsim.backends.triton_engine.kv_quant import (KV_DTYPES, QMAX, allocate_kv_cache, dequantize_reference,  # noqa: E402
                                             kv_bytes_per_token)
from kvsim.backends.triton_engine.store_kvcache import store_kvcache  # noqa: E402
from kvsim.errors import KvsimError  # noqa: E402
from tests.kernel_reference import attention_reference, rel_err  # noqa: E402

DEVICE = torch.device(os.environ.get("KVSIM_TEST_DEVICE", "cpu"))
NUM_BLOCKS, NUM_KV_HEADS = 32, 2
# Against attention over the dequantized cache every dtype only sees the bf16 output rounding.
TOL_DEQUANT = 1e-2
# Against attention over the unquantized K/V (end to end through store_kvcache), Gaussian K/V and q,
# head_dim 64, 12 draws: bf16 0.003, fp8 0.031-0.038, int8 0.008-0.010, int4 0.13-0.16.
TOL_END_TO_END = {"bfloat16": 1e-2, "float16": 1e-2, "fp8": 6e-2, "int8": 1.5e-2, "int4": 0.21}
# ||dequantized - x|| / ||x|| after store_kvcache, Gaussian x: measured 0.025, 0.006 and 0.11 (exact for bf16/fp16).
TOL_ROUND_TRIP = {"bfloat16": 0.0, "float16": 0.0, "fp8": 0.035, "int8": 0.009, "int4": 0.14}


@pytest.fixture(autouse=True, scope="module")
def on_test_device():
    """Every tensor these tests make (randn, zeros, tensor, arange...) is made on DEVICE."""
    previous = torch.get_default_device()
    torch.set_default_device(DEVICE)
    yield
    torch.set_default_device(previous)


def _seed() -> int:
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    torch.manual_seed(seed)
    return seed


def _block_tables(context_lens: list[int], block_size: int) -> torch.Tensor:
    """Disjoint blocks in scrambled order; unused entries point at block 0 (never read)."""
    need = [-(-c // block_size) for c in context_lens]
    perm = torch.randperm(NUM_BLOCKS)
    table = torch.zeros(len(context_lens), max(need) + 1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = perm[used:used + n]
        used += n
    return table


def _context_slots(block_tables: torch.Tensor, context_lens: list[int], block_size: int) -> torch.Tensor:
    return torch.cat([block_tables[s, torch.arange(c) // block_size].long() * block_size + torch.arange(c) % block_size
                      for s, c in enumerate(context_lens)])


def _random_cache(kv_dtype: str, block_size: int, head_dim: int, live_slots: torch.Tensor, model_dtype=torch.bfloat16):
    """A cache of random valid values in live slots and NaN (or NaN scales) everywhere else."""
    cache = allocate_kv_cache(1, NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim, kv_dtype, DEVICE, model_dtype)[0]
    dead = torch.ones(NUM_BLOCKS * block_size, dtype=torch.bool)
    dead[live_slots] = False
    for t, s in ((cache.k, cache.k_scale), (cache.v, cache.v_scale)):
        if kv_dtype in ("bfloat16", "float16"):
            t.copy_(torch.randn(t.shape))
        elif kv_dtype == "fp8":
            t.copy_((torch.randn(t.shape) * 100).clamp(-448, 448).to(torch.float8_e4m3fn))
        elif kv_dtype == "int8":
            t.copy_(torch.randint(-127, 128, t.shape, dtype=torch.int8))
        else:
            lo, hi = (torch.randint(1, 16, t.shape, dtype=torch.uint8) for _ in range(2))  # nibbles q + 8
            t.copy_(lo | (hi << 4))
        if s is not None:
            s.copy_(torch.rand(s.shape) + 0.5).div_(QMAX[kv_dtype] / 2.5)
            s.view(-1, NUM_KV_HEADS)[dead] = float("nan")
        else:
            t.view(-1, *t.shape[2:])[dead] = float("nan")
    if kv_dtype == "fp8":
        for t in (cache.k, cache.v):
            t.view(torch.uint8).view(-1, *t.shape[2:])[dead] = 0x7F  # e4m3 NaN
    return cache


def _poisoned_like(q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, float("nan"))


# ---- store_kvcache ----

@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_store_kvcache_round_trip(kv_dtype):
    seed = _seed()
    block_size, head_dim, num_tokens = 8, 64, 20
    dtype = torch.float16 if kv_dtype == "float16" else torch.bfloat16
    cache = allocate_kv_cache(1, NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim, kv_dtype, DEVICE, dtype)[0]
    for t in (cache.k, cache.v, cache.k_scale, cache.v_scale):
        if t is not None:
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8))
    before = [t.clone() for t in (cache.k, cache.v, cache.k_scale, cache.v_scale) if t is not None]
    key = torch.randn(num_tokens, NUM_KV_HEADS, head_dim).to(dtype) * 3
    value = torch.randn(num_tokens, NUM_KV_HEADS, head_dim).to(dtype)
    key[3, 1] = 0.0  # an all-zero head: scale 0, no NaN
    slots = torch.randperm(NUM_BLOCKS * block_size)[:num_tokens]
    slots[::4] = -1  # prefix-cache hits: nothing written
    store_kvcache(key, value, cache, slots.to(torch.int32))

    written = slots >= 0
    live = slots[written]
    k64, v64 = dequantize_reference(cache)
    for x, deq in ((key, k64), (value, v64)):
        x, deq = x[written].double(), deq.view(-1, NUM_KV_HEADS, head_dim)[live]
        err = rel_err(deq, x)
        assert err <= TOL_ROUND_TRIP[kv_dtype], f"seed {seed}: round-trip error {err:.4f}"
    # untouched slots keep their old bytes, K/V and scales alike
    dead = torch.ones(NUM_BLOCKS * block_size, dtype=torch.bool)
    dead[live] = False
    for t, old in zip((cache.k, cache.v, cache.k_scale, cache.v_scale), before):
        assert torch.equal(t.view(torch.uint8).reshape(NUM_BLOCKS * block_size, -1)[dead],
                           old.view(torch.uint8).reshape(NUM_BLOCKS * block_size, -1)[dead]), f"seed {seed}"
    if kv_dtype in QMAX:
        _check_quantization(cache, key[written], value[written], live, kv_dtype, seed)


def _check_quantization(cache, key, value, live, kv_dtype, seed):
    """scale = absmax / qmax exactly; each value within half a step; the absmax lands on +-qmax."""
    qmax = QMAX[kv_dtype]
    head_dim = key.shape[-1]
    for x, t, scale in ((key, cache.k, cache.k_scale), (value, cache.v, cache.v_scale)):
        x = x.float()
        scale = scale.view(-1, NUM_KV_HEADS)[live]
        amax = x.abs().amax(-1)
        assert torch.allclose(scale, amax / qmax, rtol=1e-6, atol=0), f"seed {seed}"
        raw = t.view(-1, NUM_KV_HEADS, t.shape[-1])[live]
        if kv_dtype == "int4":
            assert ((raw & 0xF) > 0).all() and ((raw >> 4) > 0).all(), f"seed {seed}: nibble outside q + 8"
            q = torch.stack(((raw & 0xF).int() - 8, (raw >> 4).int() - 8), -1).flatten(-2).double()
        else:
            q = raw.double()
        assert torch.equal(q.abs().amax(-1)[amax > 0], torch.full_like(amax[amax > 0], qmax, dtype=torch.float64))
        assert (q[amax == 0] == 0).all()
        err = (q * scale.double().unsqueeze(-1) - x.double()).abs()
        if kv_dtype == "fp8":
            bound = x.double().abs() * 2.0**-4 + scale.double().unsqueeze(-1) * 2.0**-9
        else:
            bound = scale.double().unsqueeze(-1).expand(-1, -1, head_dim) * 0.5 * (1 + 1e-5)
        assert (err <= bound).all(), f"seed {seed}: worst excess {(err - bound).max().item()}"


# ---- decode ----

@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_paged_decode(kv_dtype, group):
    seed = _seed()
    block_size, head_dim = 16, 64
    context_lens = [1, int(torch.randint(2, 40, ())), 80, int(torch.randint(40, 79, ()))]
    tables = _block_tables(context_lens, block_size)
    dtype = torch.float16 if kv_dtype == "float16" else torch.bfloat16
    cache = _random_cache(kv_dtype, block_size, head_dim, _context_slots(tables, context_lens, block_size), dtype)
    q = torch.randn(len(context_lens), NUM_KV_HEADS * group, head_dim).to(dtype)
    ref = attention_reference(q, *dequantize_reference(cache), tables, context_lens, [1] * len(context_lens), 0.3)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    outs = {}
    for num_splits in (1, 3):
        out = decode_attention.paged_decode_attention(q, cache, tables, lens, 0.3, num_splits, out=_poisoned_like(q))
        outs[num_splits] = out
        err = rel_err(out, ref)
        assert err <= TOL_DEQUANT, f"seed {seed}: num_splits={num_splits} error {err:.4f}"
    assert rel_err(outs[1], outs[3].double()) <= 4e-3, f"seed {seed}: split-K changes the result"


def test_paged_decode_small_tiles_and_pages(monkeypatch):
    """Several tiles per split, pages of 8 tokens, head_dim 32 and 128, split boundaries inside pages."""
    monkeypatch.setattr(decode_attention, "_launch_config", lambda cache: dict(BLOCK_N=16, num_warps=4))
    seed = _seed()
    for kv_dtype, block_size, head_dim in (("bfloat16", 8, 128), ("int4", 8, 32), ("fp8", 16, 64)):
        context_lens = [77, 9, 50]
        tables = _block_tables(context_lens, block_size)
        cache = _random_cache(kv_dtype, block_size, head_dim, _context_slots(tables, context_lens, block_size))
        q = torch.randn(3, NUM_KV_HEADS * 4, head_dim).bfloat16()
        ref = attention_reference(q, *dequantize_reference(cache), tables, context_lens, [1, 1, 1], 0.2)
        lens = torch.tensor(context_lens, dtype=torch.int32)
        for num_splits in (1, 5):
            out = decode_attention.paged_decode_attention(q, cache, tables, lens, 0.2, num_splits, out=_poisoned_like(q))
            assert rel_err(out, ref) <= TOL_DEQUANT, f"seed {seed}: {kv_dtype} splits {num_splits}"


def test_choose_num_splits():
    cpu = torch.device("cpu")  # 8 stand-in SMs: want 16 programs
    assert decode_attention.choose_num_splits(1, 2, 32768, cpu) == 8
    assert decode_attention.choose_num_splits(1, 2, 1024, cpu) == 2  # no split under 512 tokens
    assert decode_attention.choose_num_splits(64, 8, 32768, cpu) == 1
    assert decode_attention.choose_num_splits(1, 1, 10**6, cpu) == 16
    # the step-time model prices the engine's splits (its rule, rounded down to a power of two as the runner does)
    from kvsim.perf.roofline import decode_splits
    for b in (1, 2, 3, 5, 9, 24, 64):
        for kv in ("bfloat16", "fp8"):
            got = decode_attention.choose_num_splits(b, 8, 8192, cpu, kv, power_of_two=True)
            assert got == decode_splits(b, 8, 8192, 8, kv == "fp8") and got & (got - 1) == 0
    assert decode_attention.choose_num_splits(3, 2, 32768, cpu) == 3 and \
        decode_attention.choose_num_splits(3, 2, 32768, cpu, power_of_two=True) == 2


# ---- prefill ----

# (cached prefix, new tokens): a fresh prompt, a prefix-cache hit + chunk, one token, a long prefix.
PREFILL_CASES = [(0, 20), (37, 11), (50, 1), (70, 9)]


def _check_prefill(kv_dtype, group, seed, block_size=16, head_dim=64):
    context_lens = [p + n for p, n in PREFILL_CASES]
    q_lens = [n for _, n in PREFILL_CASES]
    tables = _block_tables(context_lens, block_size)
    cache = _random_cache(kv_dtype, block_size, head_dim, _context_slots(tables, context_lens, block_size))
    q = torch.randn(sum(q_lens), NUM_KV_HEADS * group, head_dim).bfloat16()
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    out = prefill_attention.paged_prefill_attention(q, cache, tables, cu, torch.tensor(context_lens, dtype=torch.int32),
                                                    0.25, max(q_lens), out=_poisoned_like(q))
    ref = attention_reference(q, *dequantize_reference(cache), tables, context_lens, q_lens, 0.25)
    err = rel_err(out, ref)
    assert err <= TOL_DEQUANT, f"seed {seed}: {kv_dtype} group {group} error {err:.4f}"


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_paged_prefill(kv_dtype, group):
    _check_prefill(kv_dtype, group, _seed())


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int4"])
def test_paged_prefill_small_tiles(monkeypatch, kv_dtype):
    """Tiles of 4 tokens x 16 keys: several query tiles per chunk and unmasked runs before the diagonal."""
    monkeypatch.setattr(prefill_attention, "_launch_config",
                        lambda cache, group_p: dict(BLOCK_Q=max(16 // group_p, 1), BLOCK_N=16, num_warps=4))
    for group in (1, 4):
        _check_prefill(kv_dtype, group, _seed(), block_size=8)


# ---- end to end: store, then attend, against the unquantized inputs ----

@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_store_then_attend_matches_unquantized(kv_dtype):
    seed = _seed()
    block_size, head_dim, group = 16, 64, 4
    dtype = torch.float16 if kv_dtype == "float16" else torch.bfloat16
    context_lens = [45, 30]
    tables = _block_tables(context_lens, block_size)
    cache = allocate_kv_cache(1, NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim, kv_dtype, DEVICE, dtype)[0]
    slots = _context_slots(tables, context_lens, block_size)
    key = torch.randn(len(slots), NUM_KV_HEADS, head_dim).to(dtype)
    value = torch.randn(len(slots), NUM_KV_HEADS, head_dim).to(dtype)
    store_kvcache(key, value, cache, slots)
    exact_k = torch.zeros(NUM_BLOCKS * block_size, NUM_KV_HEADS, head_dim, dtype=torch.float64)
    exact_v = exact_k.clone()
    exact_k[slots], exact_v[slots] = key.double(), value.double()
    exact = [t.view(NUM_BLOCKS, block_size, NUM_KV_HEADS, head_dim) for t in (exact_k, exact_v)]

    q = torch.randn(2, NUM_KV_HEADS * group, head_dim).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    out = decode_attention.paged_decode_attention(q, cache, tables, lens, head_dim**-0.5, out=_poisoned_like(q))
    ref = attention_reference(q, *exact, tables, context_lens, [1, 1], head_dim**-0.5)
    err = rel_err(out, ref)
    assert err <= TOL_END_TO_END[kv_dtype], f"seed {seed}: decode error {err:.4f} vs unquantized"


def test_allocate_kv_cache_dtypes_and_errors():
    half = allocate_kv_cache(2, 4, 16, 2, 64, "auto", DEVICE, torch.float16)
    assert len(half) == 2 and half[0].k.dtype == torch.float16 and half[0].k_scale is None
    packed = allocate_kv_cache(1, 4, 16, 2, 64, "int4", DEVICE)[0]
    assert packed.k.shape == (4, 16, 2, 32) and packed.head_dim == 64 and packed.v_scale.shape == (4, 16, 2)
    assert allocate_kv_cache(1, 4, 16, 2, 64, "fp8_e4m3", DEVICE)[0].k.dtype == torch.float8_e4m3fn
    for bad in (dict(kv_dtype="fp4"), dict(block_size=12), dict(head_dim=96)):
        args = dict(num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2, head_dim=64, kv_dtype="int8",
                    device=DEVICE) | bad
        with pytest.raises(KvsimError, match=next(iter(bad)).replace("kv_dtype", "kv_cache_dtype")):
            allocate_kv_cache(**args)


def test_kv_bytes_per_token():
    # Llama-3.1-8B: 8 KV heads x 128: bf16 4 KiB per token per layer, int4 1 KiB + 64 B of scales
    assert kv_bytes_per_token(8, 128, "bfloat16") == 4096
    assert kv_bytes_per_token(8, 128, "fp8") == 2048 + 64
    assert kv_bytes_per_token(8, 128, "int4") == 1024 + 64


def test_quantized_caches_get_twice_the_programs():
    cpu = torch.device("cpu")  # 8 "SMs" off the GPU
    assert decode_attention.choose_num_splits(1, 2, 32768, cpu, "fp8") == 16
    assert decode_attention.choose_num_splits(4, 2, 32768, cpu, "int8") == 4
    assert decode_attention.choose_num_splits(4, 2, 32768, cpu, "bfloat16") == 2
