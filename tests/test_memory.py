"""KV sizing: hand-computed bytes per token, the capacity breakdown, fit errors, the memory table."""

import math
from dataclasses import replace

import pytest

from kvsim.errors import KvsimError
from kvsim.perf.memory import (GiB, activation_estimate, bytes_per_block, kv_bytes_per_token, kv_capacity,
                               prefill_flops, prefill_flops_saved)
from kvsim.results.memory_report import memory_table, render_memory, table_lengths
from kvsim.scenario.catalog import GPUS, MODELS
from kvsim.scenario.config import scenario_from_dict

LLAMA8, LLAMA70, QWEN06 = MODELS["Llama-3.1-8B"], MODELS["Llama-3.1-70B"], MODELS["Qwen3-0.6B"]
H100 = GPUS["H100-SXM"]


def make(policies=None, engine=None, hardware=None, workload=None, model="Llama-3.1-8B"):
    return scenario_from_dict({
        "model": {"name": model}, "hardware": hardware or {}, "engine": engine or {},
        "policies": policies or [{"name": "paged"}],
        "workload": {"num_requests": 1, **(workload or {})},
    }, source="scenarios/x.toml")


def test_bytes_per_token_hand_values():
    # 2 (K,V) x 32 layers x 8 kv heads x (128 dims x bytes [+ 4 B float32 scale per token])
    assert kv_bytes_per_token(LLAMA8, "auto") == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(LLAMA8, "bfloat16") == kv_bytes_per_token(LLAMA8, "float16") == 131072
    assert kv_bytes_per_token(LLAMA8, "int8") == 2 * 32 * 8 * (128 + 4) == 67584
    # fp8 as vLLM: per-tensor scales, no bytes in the blocks: exactly half of bf16
    assert kv_bytes_per_token(LLAMA8, "fp8") == kv_bytes_per_token(LLAMA8, "fp8_e4m3") == 65536
    assert kv_bytes_per_token(LLAMA8, "fp8", per_token_scales=True) == 67584
    assert kv_bytes_per_token(LLAMA8, "int4") == 2 * 32 * 8 * (64 + 4) == 34816
    assert kv_bytes_per_token(replace(LLAMA8, dtype="float32"), "auto") == 262144


def test_kv_heads_shard_then_replicate():
    assert kv_bytes_per_token(LLAMA8, "auto", tp=2) == 65536  # 4 kv heads per GPU
    assert kv_bytes_per_token(LLAMA8, "auto", tp=8) == 16384  # 1 per GPU
    assert kv_bytes_per_token(LLAMA8, "auto", tp=16) == 16384  # replicated: still 1 per GPU


def test_bytes_per_block():
    assert bytes_per_block(LLAMA8, "auto", 16) == 16 * 131072
    assert bytes_per_block(LLAMA8, "int4", 32, tp=2) == 32 * 2 * 32 * 4 * 68


def test_unknown_kv_dtype():
    with pytest.raises(KvsimError, match="kv_cache_dtype: unknown 'int3'"):
        kv_bytes_per_token(LLAMA8, "int3")


def test_capacity_by_hand_and_adds_up():
    sc = make(engine={"activation_reserve_gib": 2.0, "fixed_reserve_gib": 1.0})
    cap = kv_capacity(sc, sc.policies[0], LLAMA8, H100)
    budget = 85_017_493_504 * 0.9  # what torch.cuda.mem_get_info reports on an H100, not nvidia-smi's 81,559 MiB
    kv = budget - 8_030_261_248 * 2 - 3 * GiB
    assert cap.budget == pytest.approx(budget)
    assert cap.kv == pytest.approx(kv)
    # 85,017,493,504 x 0.9 - 16,060,522,496 - 3,221,225,472 = 57,234,996,185.6 B over 2 MiB blocks
    assert cap.num_blocks == int(kv // (16 * 131072)) == 27_291
    assert cap.max_tokens == cap.num_blocks * 16
    assert cap.budget == pytest.approx(cap.weights + cap.activations + cap.reserve + cap.kv)
    rows = dict(cap.rows())
    assert rows["KV cache"] == cap.kv and rows["weights"] == cap.weights


def test_activation_estimate_mlp_bound():
    # Llama-8B, 8192 tokens, 256 seqs: gate_up + silu_and_mul out = 8192 x 3 x 14336 x 2 B beat the
    # sampler (256 x 128256 x 10 B); plus hidden + residual = 2 x 8192 x 4096 x 2 B
    assert activation_estimate(LLAMA8, 8192, 256) == 8192 * 3 * 14336 * 2 + 2 * 8192 * 4096 * 2
    # tp=4 shards the MLP (8192 x 3 x 3584 x 2 B = 176 MB) below the sampler's 256 rows
    # (256 x 128256 x 10 B = 328 MB: bf16 logits, fp32 copy, fp32 probabilities); hidden not sharded
    assert activation_estimate(LLAMA8, 8192, 256, tp=4) == 256 * 128256 * 10 + 2 * 8192 * 4096 * 2


def test_activation_estimate_logits_bound():
    # Qwen3-0.6B, 512 tokens, 512 seqs: the sampler, 512 x 151936 x 10 B, beats MLP (9.4 MB) and qkv (4.2 MB)
    assert activation_estimate(QWEN06, 512, 512) == 512 * 151936 * 10 + 2 * 512 * 1024 * 2


def test_activation_estimate_matches_vllms_log_for_llama_8b_on_h100():
    """vLLM V1 on one H100, Llama-3.1-8B, its defaults there (8192 tokens, 1024 sequences), logs
    "PyTorch activation peak memory takes 1.21GiB" (1.24 in another run): the sampler's 1024 rows."""
    sc = make()
    assert activation_estimate(LLAMA8, 8192, 1024) / GiB == pytest.approx(1.35, abs=0.01)
    cap = kv_capacity(sc, sc.policies[0], LLAMA8, H100)
    assert cap.activations == activation_estimate(LLAMA8, 8192, 1024)
    assert cap.reserve == 0.35 * GiB  # "non_torch_memory takes 0.35GiB"
    # vLLM logs "GPU KV cache size: 447,088 tokens" = 27,943 blocks of 16
    assert cap.num_blocks == pytest.approx(447_088 / 16, rel=0.002)


def test_activation_estimate_at_the_policys_effective_budget():
    sc = make(engine={"max_model_len": 16384}, policies=[
        {"name": "chunked"}, {"name": "small", "max_num_batched_tokens": 2048},
        {"name": "whole", "enable_chunked_prefill": False}])
    acts = [kv_capacity(sc, p, LLAMA8, H100).activations for p in sc.policies]
    assert acts == [activation_estimate(LLAMA8, 8192, 1024), activation_estimate(LLAMA8, 2048, 1024),
                    activation_estimate(LLAMA8, 16384, 1024)]  # unchunked: a whole max_model_len prompt


def test_int8_capacity_about_twice_bf16():
    sc = make(policies=[{"name": "bf16"}, {"name": "int8", "kv_cache_dtype": "int8"}])
    bf16, int8 = (kv_capacity(sc, p, LLAMA8, H100) for p in sc.policies)
    assert int8.kv == bf16.kv
    assert int8.num_blocks / bf16.num_blocks == pytest.approx(256 / 132, rel=1e-3)  # ≈ 1.94


def test_70b_on_one_h100_does_not_fit():
    sc = make(model="Llama-3.1-70B")
    with pytest.raises(KvsimError) as err:
        kv_capacity(sc, sc.policies[0], LLAMA70, H100)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == ("scenarios/x.toml: model Llama-3.1-70B (131.4 GiB of weights per GPU at TP 1) does not fit on "
                   "H100-SXM (79.2 GiB × 0.90 = 71.3 GiB): raise hardware.tensor_parallel_size or pick a larger GPU")


def test_70b_at_tp4_fits():
    sc = make(model="Llama-3.1-70B", hardware={"tensor_parallel_size": 4})
    cap = kv_capacity(sc, sc.policies[0], LLAMA70, H100)
    norms = 80 * 2 * 8192 + 8192  # RMSNorm weights: whole on every rank, as vLLM keeps them
    assert cap.weights == (LLAMA70.num_params - norms) * 2 / 4 + norms * 2
    assert cap.bytes_per_block == 16 * 2 * 80 * 2 * 128 * 2  # 2 kv heads per GPU
    assert cap.max_tokens >= 131072


def test_no_room_for_kv_after_activations():
    sc = make(engine={"activation_reserve_gib": 60.0})
    with pytest.raises(KvsimError, match=r"leaves no room for the KV cache.*60\.0 GiB activations"):
        kv_capacity(sc, sc.policies[0], LLAMA8, H100)


def test_max_model_len_must_fit():
    sc = make(model="Llama-3.1-70B", hardware={"tensor_parallel_size": 2})
    with pytest.raises(KvsimError, match=r"policy paged: the KV cache holds \d+ tokens.*max_model_len 131072"):
        kv_capacity(sc, sc.policies[0], LLAMA70, H100)
    sc = make(model="Llama-3.1-70B", hardware={"tensor_parallel_size": 2}, engine={"max_model_len": 16384})
    assert kv_capacity(sc, sc.policies[0], LLAMA70, H100).max_tokens >= 16384


def test_table_lengths_capped():
    assert table_lengths(131072) == [1024, 4096, 8192, 16384, 32768, 131072]  # 8k: the lengths
    assert table_lengths(20000) == [1024, 4096, 8192, 16384, 20000]


def test_memory_table_paged_vs_contiguous():
    sc = make(engine={"max_model_len": 20000, "activation_reserve_gib": 1.0}, policies=[
        {"name": "paged"},
        {"name": "slab", "allocator": "contiguous", "enable_prefix_caching": False},
        {"name": "exact", "allocator": "contiguous", "enable_prefix_caching": False,
         "contiguous_reserve": "known_output", "kv_cache_dtype": "int4"},
    ])
    rows = {(r.policy, r.seq_len): r for r in memory_table(sc, LLAMA8, H100)}
    max_tokens = kv_capacity(sc, sc.policies[0], LLAMA8, H100).max_tokens
    paged = rows["paged", 20000]
    assert paged.bytes_per_seq == math.ceil(20000 / 16) * 16 * 131072  # 1250 whole blocks
    assert paged.num_seqs == max_tokens // 20000
    assert rows["paged", 1024].num_seqs == max_tokens // 1024
    for n in (1024, 20000):  # the contiguous slab is max_model_len whatever the length
        assert rows["slab", n].bytes_per_seq == 20000 * 131072
        assert rows["slab", n].num_seqs == max_tokens // 20000
    assert rows["exact", 4096].bytes_per_seq == 4096 * 34816
    assert rows["exact", 4096].kv_cache_dtype == "int4"


def test_memory_table_crosses_dtypes():
    sc = make(engine={"max_model_len": 32768})
    rows = memory_table(sc, LLAMA8, H100, kv_dtypes=("auto", "int8"))
    by = {(r.kv_cache_dtype, r.seq_len): r for r in rows}
    assert by["int8", 32768].bytes_per_seq == 32768 * 67584
    assert by["int8", 4096].num_seqs > by["auto", 4096].num_seqs


def test_prefill_flops_saved_by_hand():
    # 1024 cached of 2048: their projections (2 x 6,979,321,856 layer matmul params each; lm_head runs only
    # for the last prompt token, which is never cached) plus the attention among them: 1024*1025/2 pairs
    # at 4 x 32 layers x 32 heads x 128 dims FLOPs per pair.
    expected = 2 * 6_979_321_856 * 1024 + 4 * 32 * 32 * 128 * (1024 * 1025 // 2)
    assert prefill_flops_saved(LLAMA8, 1024, 2048) == pytest.approx(expected, rel=1e-12)
    assert prefill_flops_saved(LLAMA8, 0, 2048) == 0
    assert prefill_flops_saved(LLAMA8, 1024, 2048) < prefill_flops(LLAMA8, 2048)
    with pytest.raises(ValueError):
        prefill_flops_saved(LLAMA8, 3000, 2048)


def test_render_memory_tables():
    sc = make(workload={"prefix": {"prefix_len": 1024}, "prompt_len": {"dist": "fixed", "value": 2048}},
              policies=[{"name": "paged"}, {"name": "q", "kv_cache_dtype": "int8"}])
    head, seqs = render_memory(sc, LLAMA8, H100)
    assert [c.header for c in head.columns][1:] == ["auto (paged)", "int8 (q)"]
    assert head.row_count == 10 and seqs.row_count == 2
    assert "1024-token shared prefix" in seqs.caption and "2048-token prompt" in seqs.caption


@pytest.mark.parametrize("gpu, tokens, seqs", [("H100-SXM", 8192, 1024), ("H200", 8192, 1024), ("B200", 8192, 1024),
                                              ("MI300X", 8192, 1024), ("A100-80GB", 2048, 256), ("L40S", 2048, 256)])
def test_engine_defaults_as_vllm_serve_sets_them(gpu, tokens, seqs):
    from kvsim.scenario.defaults import engine_limits
    sc = make(hardware={"gpu": gpu}, engine={"max_model_len": 4096},
              policies=[{"name": "p"}, {"name": "tiny", "max_num_batched_tokens": 512}, {"name": "whole", "enable_chunked_prefill": False}])
    p, tiny, whole = (engine_limits(sc, pol, LLAMA8, GPUS[gpu]) for pol in sc.policies)
    assert (p.max_num_batched_tokens, p.max_num_seqs, p.step_budget, p.enable_chunked_prefill) == (tokens, seqs, tokens, True)
    assert (tiny.max_num_batched_tokens, tiny.max_num_seqs) == (512, min(seqs, 512))  # capped at the budget, as vLLM
    assert whole.step_budget == max(tokens, 4096) and not whole.enable_chunked_prefill
    set_ = make(hardware={"gpu": gpu}, engine={"max_num_seqs": 7, "max_num_batched_tokens": 300})
    mine = engine_limits(set_, set_.policies[0], LLAMA8, GPUS[gpu])
    assert (mine.max_num_seqs, mine.max_num_batched_tokens) == (7, 300)  # a scenario's own values stay
