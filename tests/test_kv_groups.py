"""vLLM v0.11.0's KV cache groups, computed by hand from each family's config with vLLM's own
arithmetic (kv_cache_interface.py page sizes, kv_cache_utils.py grouping and block counts,
single_type_kv_cache_manager.py freeing): kvsim must give the same blocks, tokens and concurrency."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.perf.kv_groups import (CHUNKED_SPEC, FULL_SPEC, MLA_SPEC, SLIDING_SPEC, KvCacheGroup, kv_cache_layout,
                                  vllm_block_size)
from kvsim.perf.memory import GiB, check_fits, compute_capacity, kv_bytes_per_token, kv_layout
from kvsim.results.memory_report import memory_records, render_memory
from kvsim.scenario.catalog import GPUS, MODELS
from kvsim.scenario.config import scenario_from_dict

KV = 50 * GiB  # memory left for the KV cache on one GPU, the same for every family
cdiv = lambda a, b: -(-a // b)  # noqa: E731


def groups(layout):
    return [(g.spec, g.window, len(g.layers)) for g in layout.groups]


def test_dense_gqa_one_group():
    """Llama-3.1-8B and Mixtral-8x7B (32 layers, 8 KV heads of 128): a page is K and V of 16 tokens,
    16 x 2 x 8 x 128 x 2 B = 64 KiB; every layer in one group; blocks = KV // page // 32."""
    for name in ("Llama-3.1-8B", "Mixtral-8x7B"):
        layout = kv_layout(MODELS[name], "auto", 16)
        assert groups(layout) == [(FULL_SPEC, 0, 32)] and layout.page_bytes == 65536
        nb = KV // 65536 // 32
        assert layout.num_blocks(KV) == nb and layout.tokens(nb) == nb * 16
        assert layout.max_concurrency(nb, 8192, 8192) == nb / 512


def test_qwen3_moe_kv_heads_shard_then_replicate():
    """Qwen3-30B-A3B: 48 layers, 4 KV heads; Qwen3-235B-A22B at tp=8: 94 layers, 4 KV heads over 8 GPUs,
    one each (replicated)."""
    small = kv_layout(MODELS["Qwen3-30B-A3B"], "auto", 16)
    assert groups(small) == [(FULL_SPEC, 0, 48)] and small.page_bytes == 16 * 2 * 4 * 128 * 2
    big = kv_layout(MODELS["Qwen3-235B-A22B"], "auto", 16, tp=8)
    assert big.page_bytes == 16 * 2 * 1 * 128 * 2 and big.num_blocks(KV) == KV // 8192 // 94


@pytest.mark.parametrize("gpu, block", [("H200", 64), ("H100-SXM", 64), ("B200", 128), ("A100-80GB", 16)])
def test_deepseek_mla_latent_page(gpu, block):
    """MLAAttentionSpec: one latent of kv_lora_rank + qk_rope_head_dim = 576 elements per token and
    layer (no factor 2 for K and V, no split over TP); FlashMLA forces 64-token blocks on Hopper,
    CUTLASS MLA 128 on Blackwell."""
    m = MODELS["DeepSeek-V3"]
    assert vllm_block_size(m, gpu, 16) == block
    layout = kv_layout(m, "auto", block, tp=8)
    assert groups(layout) == [(MLA_SPEC, 0, 61)] and layout.page_bytes == block * 576 * 2
    nb = KV // (block * 576 * 2) // 61
    assert layout.num_blocks(KV) == nb and layout.tokens(nb) == nb * block
    assert kv_layout(m, "fp8", block).page_bytes == block * 576
    # 1/57th of multi-head attention's K and V (128 heads x 128 dims each)
    assert kv_bytes_per_token(m, "auto") == 61 * 576 * 2 and 2 * 128 * 128 / 576 == pytest.approx(56.9, abs=0.05)


def test_gpt_oss_two_groups():
    """gpt-oss-20b: 12 sliding-window (128) + 12 full layers, 8 KV heads of 64: page 16 x 2 x 8 x 64 x
    2 B = 32 KiB; group_size = min(12, 12) = 12, so 2 groups and a pool block of 12 pages."""
    layout = kv_layout(MODELS["gpt-oss-20b"], "auto", 16)
    assert groups(layout) == [(SLIDING_SPEC, 128, 12), (FULL_SPEC, 0, 12)] and layout.page_bytes == 32768
    nb = KV // 32768 // 12
    assert layout.num_blocks(KV) == nb and layout.tokens(nb) == nb // 2 * 16  # vLLM's "GPU KV cache size"
    # decoding at 8,192 tokens: 512 full blocks + the sliding window's 127 keys and the new one: 8 blocks
    assert layout.blocks_held(8192) == 512 + 8 and layout.blocks_held(8193) == 513 + 9
    # what vLLM reserves per request at max_model_len 8,192, max_num_batched_tokens 8,192:
    # full 512; sliding cdiv(min(128 - 1 + 8192, 8192), 16) + 1 = 513
    assert layout.max_blocks(8192, 8192) == 1025
    assert layout.max_concurrency(nb, 8192, 8192) == nb / 1025
    assert groups(kv_layout(MODELS["gpt-oss-120b"], "auto", 16)) == [(SLIDING_SPEC, 128, 18), (FULL_SPEC, 0, 18)]


def test_gpt_oss_window_capped_estimate_undercounts_by_49_percent():
    """An estimator capping sliding layers at the window counts 12 x (8192 + 128) token-layers for an
    8k request; vLLM reserves whole pages and keeps the full layers whole: 1025 blocks of 12 x 16."""
    layout = kv_layout(MODELS["gpt-oss-20b"], "auto", 16)
    estimate = 12 * (8192 + 128)
    vllm = layout.max_blocks(8192, 8192) * 12 * 16
    assert 1 - estimate / vllm == pytest.approx(0.49, abs=0.005)


def test_gemma3_padded_groups():
    """gemma-3-27b: 10 full + 52 sliding (1024) layers, 16 KV heads of 128 (page 128 KiB): group_size
    10, the sliding layers cut into cdiv(52, 10) = 6 groups (layers[i::6]), the last ones padded: 7
    groups, 8 padding layers; a pool block is 10 pages."""
    layout = kv_layout(MODELS["gemma-3-27b"], "auto", 16)
    assert groups(layout) == [(SLIDING_SPEC, 1024, 9)] * 4 + [(SLIDING_SPEC, 1024, 8)] * 2 + [(FULL_SPEC, 0, 10)]
    assert layout.group_size == 10 and layout.padding_layers == 8 and layout.page_bytes == 131072
    assert layout.groups[0].layers[:2] == (0, 7)  # sliding layers 0, 1, 2, 3, 4, 6, 7, ...: every 6th of them
    nb = KV // 131072 // 10
    assert layout.num_blocks(KV) == nb and layout.tokens(nb) == nb // 7 * 16
    # decoding 32,768 tokens: 2,048 full blocks and 64 in each sliding group (1,023 keys and the new one)
    assert layout.blocks_held(32768) == 2048 + 6 * 64
    naive = kv_layout(MODELS["gemma-3-27b"], "auto", 16, naive=True)
    assert naive.num_blocks(KV) == KV // 131072 // 62 and naive.blocks_held(32768) == 2048


def test_gemma2_and_mistral_v01_sliding():
    g2 = kv_layout(MODELS["gemma-2-9b"], "auto", 16)
    assert groups(g2) == [(SLIDING_SPEC, 4096, 21), (FULL_SPEC, 0, 21)] and g2.page_bytes == 16 * 2 * 8 * 256 * 2
    assert g2.blocks_held(8192) == 512 + 256
    mistral = kv_layout(MODELS["Mistral-7B-v0.1"], "auto", 16)
    assert groups(mistral) == [(SLIDING_SPEC, 4096, 32)] and not mistral.hybrid
    # every layer sliding: one group, vLLM's SlidingWindowManager frees what left the 4,096-token window
    assert mistral.blocks_held(32768) == 256 and mistral.max_blocks(32768, 8192) == cdiv(4095 + 8192, 16) + 1


def test_llama4_chunked_local_falls_back_to_full():
    """vLLM v0.11.0 turns the hybrid manager off for chunked-local attention (its latency regression;
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0): every layer keeps the whole context."""
    m = MODELS["Llama-4-Scout"]
    layout = kv_layout(m, "auto", 16, tp=4)  # 8 KV heads over 4 GPUs: 2 each
    assert groups(layout) == [(FULL_SPEC, 0, 48)] and layout.page_bytes == 16 * 2 * 2 * 128 * 2
    on = kv_cache_layout(m, layout.page_bytes, 16, hybrid=True)  # with the variable set: 36 chunked + 12 full
    assert groups(on) == [(CHUNKED_SPEC, 8192, 12)] * 3 + [(FULL_SPEC, 0, 12)]
    assert on.max_blocks(131072, 8192) == 8192 + 3 * cdiv(8192 + 8192, 16)
    assert on.blocks_held(20000) == 1250 + 3 * (1250 - 16384 // 16)  # the chunk started at 16,384


def reference_held(spec: str, window: int, block: int, chunks: list[int]) -> list[int]:
    """vLLM's manager step by step: free the skipped blocks of the computed tokens, then allocate up to
    cdiv(tokens, block); the blocks held after each step."""
    held, computed, out = [], 0, []
    for new in chunks:
        if spec == SLIDING_SPEC:
            skip = max(computed - window + 1, 0) // block
        elif spec == CHUNKED_SPEC:
            skip = computed // window * window // block
        else:
            skip = 0
        held = [False if i < skip else h for i, h in enumerate(held)]
        held += [True] * (cdiv(computed + new, block) - len(held))
        computed += new
        out.append(sum(held))
    return out


@settings(max_examples=200, deadline=None)
@given(spec=st.sampled_from([SLIDING_SPEC, CHUNKED_SPEC, FULL_SPEC]), window=st.integers(1, 300),
       block=st.sampled_from([1, 4, 16]), chunks=st.lists(st.integers(1, 200), min_size=1, max_size=30))
def test_blocks_held_matches_the_managers_step_by_step(spec, window, block, chunks):
    group = KvCacheGroup(spec, (0,), block, 1, window if spec != FULL_SPEC else 0)
    total, got = 0, []
    for new in chunks:
        total += new
        got.append(group.blocks_held(total, new))
    assert got == reference_held(spec, window, block, chunks)
    if spec == SLIDING_SPEC:  # a decoding sequence never holds more than ceil((window - 1) / block) + 1
        assert group.blocks_held(total + 1, 1) <= cdiv(window - 1, block) + 1


# ---- the capacity breakdown, the report and the command -------------------------------------
def make(model, gpu="H100-SXM", tp=1, engine=None, policies=None):
    return scenario_from_dict({
        "model": {"name": model}, "hardware": {"gpu": gpu, "tensor_parallel_size": tp}, "engine": engine or {},
        "policies": policies or [{"name": "paged"}], "workload": {"num_requests": 1},
    }, source="scenarios/x.toml")


def test_memory_records_gpt_oss_by_hand():
    sc = make("gpt-oss-20b", engine={"max_model_len": 131072})
    m, h100 = MODELS["gpt-oss-20b"], GPUS["H100-SXM"]
    cap = compute_capacity(sc, sc.policies[0], m, h100)
    nb, naive_nb = int(cap.kv // 32768 // 12), int(cap.kv // 32768 // 24)
    assert cap.num_blocks == nb and cap.bytes_per_block == 12 * 32768 and cap.max_tokens == nb // 2 * 16
    rec = memory_records(sc, m, h100)["policies"][0]
    assert rec["kv_bytes_per_token"] is None  # no one number: the sliding layers hold at most their window
    assert rec["kv_bytes_per_token_naive"] == 24 * 2 * 8 * 64 * 2
    assert rec["max_sequences"]["8192"] == nb // 1025  # vLLM's maximum concurrency at 8k (8,192-token chunks)
    assert rec["max_sequences_decoding"]["8192"] == nb // 520
    assert rec["max_sequences_naive"]["8192"] == naive_nb // 512
    assert rec["max_sequences"]["131072"] == nb // (8192 + 521)  # sliding: cdiv(127 + 8192, 16) + 1
    assert [g["spec"] for g in rec["kv_cache_groups"]] == [SLIDING_SPEC, FULL_SPEC]
    assert rec["kv_cache_groups"][0]["blocks_held"]["8192"] == 8 and rec["kv_tokens_naive"] == naive_nb * 16


def test_memory_records_dense_model_unchanged():
    sc = make("Llama-3.1-8B")
    rec = memory_records(sc, MODELS["Llama-3.1-8B"], GPUS["H100-SXM"])["policies"][0]
    assert rec["kv_bytes_per_token"] == rec["kv_bytes_per_token_naive"] == 131072
    assert rec["max_sequences"] == rec["max_sequences_decoding"] == rec["max_sequences_naive"]
    assert rec["max_sequences"]["8192"] == rec["num_blocks"] // 512


def test_render_shows_groups_and_naive_rows():
    sc = make("gemma-3-27b", engine={"max_model_len": 32768})
    head, grp, seqs = render_memory(sc, MODELS["gemma-3-27b"], GPUS["H100-SXM"])
    assert grp.row_count == 7 and "8 padding" in str(head.columns[1]._cells[-1])
    assert seqs.row_count == 3  # the policy, its "fit decoding" and its "fit, no window" rows


def test_run_simulates_sliding_window_models_and_refuses_swap_for_them():
    sc = make("gpt-oss-20b", engine={"max_model_len": 131072})
    m, h100 = MODELS["gpt-oss-20b"], GPUS["H100-SXM"]
    check_fits(sc, m, h100, sc.policies)  # the hybrid allocator simulates vLLM's two groups
    swap = make("gpt-oss-20b", engine={"max_model_len": 131072, "preemption_mode": "swap"})
    with pytest.raises(KvsimError, match=r"^scenarios/x\.toml: engine\.preemption_mode: swap is not simulated for "
                                         r"gpt-oss-20b's sliding-window KV cache groups") as err:
        check_fits(swap, m, h100, swap.policies)
    assert "\n" not in str(err.value)
    check_fits(swap, m, h100, swap.policies, simulate=False)  # kvsim memory sizes it
    short = make("Mistral-7B-v0.1", engine={"max_model_len": 4096, "preemption_mode": "swap"})
    check_fits(short, MODELS["Mistral-7B-v0.1"], h100, short.policies)  # the window covers every sequence


def test_mla_runs_at_vllms_block_size_and_llama4_as_full():
    h200 = GPUS["H200"]
    sc = make("DeepSeek-V3", "H200", 8, engine={"max_model_len": 32768})
    with pytest.raises(KvsimError, match="with block_size 64 on H200: set engine.block_size = 64"):
        check_fits(sc, MODELS["DeepSeek-V3"], h200, sc.policies)
    ok = make("DeepSeek-V3", "H200", 8, engine={"max_model_len": 32768, "block_size": 64})
    check_fits(ok, MODELS["DeepSeek-V3"], h200, ok.policies)
    cap = compute_capacity(ok, ok.policies[0], MODELS["DeepSeek-V3"], h200)
    assert cap.bytes_per_block == 61 * 64 * 576 * 2 and cap.num_blocks == int(cap.kv // (64 * 576 * 2) // 61)
    scout = make("Llama-4-Scout", tp=4, engine={"max_model_len": 131072})
    check_fits(scout, MODELS["Llama-4-Scout"], GPUS["H100-SXM"], scout.policies)


def test_memory_json_command(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "gpt-oss-20b"\n[engine]\nmax_model_len = 32768\n'
                    '[[policies]]\nname = "paged"\n[workload]\nnum_requests = 1\n')
    assert main(["memory", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pol = out["policies"][0]
    assert out["model"] == "gpt-oss-20b" and set(pol["max_sequences"]) == {"1024", "4096", "8192", "16384", "32768"}
    assert pol["max_sequences_naive"]["32768"] < pol["max_sequences_decoding"]["32768"]
    assert math.isclose(pol["kv_bytes_per_token_naive"], 49152)


def test_deploy_and_the_simulation_take_sliding_window_models():
    from kvsim.perf.memory import kv_capacity
    from kvsim.planning.deploy import layouts

    sc = make("gpt-oss-20b", engine={"max_model_len": 131072})
    ok, skipped = layouts(sc, ["paged"], ["H100-SXM"], [1])
    assert ok and not skipped
    cap = kv_capacity(sc, sc.policies[0], MODELS["gpt-oss-20b"], GPUS["H100-SXM"])
    assert cap.windows == (128, 0) and cap.num_blocks > 0


def test_windows_longer_than_max_model_len_count_as_one_group():
    """gpt-oss at max_model_len 128: no sliding layer ever frees a block, so vLLM's two groups hold
    what one group of all 24 layers would; kvsim counts (and simulates) it so."""
    from kvsim.perf.memory import policy_layout

    m, h100 = MODELS["gpt-oss-20b"], GPUS["H100-SXM"]
    sc = make("gpt-oss-20b", engine={"max_model_len": 128})
    layout = policy_layout(sc, sc.policies[0], m, h100)
    assert groups(layout) == [(FULL_SPEC, 0, 24)]
    check_fits(sc, m, h100, sc.policies)
    vllm = kv_layout(m, "auto", 16)  # two groups: 2 x cdiv(128, 16) blocks of 12 pages a sequence, the same bytes
    assert vllm.blocks_held(128) * vllm.block_bytes == layout.blocks_held(128) * layout.block_bytes
