"""Model specs of mixture-of-experts, latent-attention, sliding-window and chunked-local models: the
published config.json files read as the presets say, parameters and checkpoint bytes by hand, weights
per GPU as vLLM shards them, and the one-line refusals of what kvsim does not model."""

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from kvsim.errors import KvsimError
from kvsim.perf.weights import weights_per_gpu
from kvsim.scenario.catalog import MODELS, load_hf_config
from kvsim.scenario.models import CHUNKED, FULL, SLIDING, MoeSpec

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
PAIRS = [("Mistral-7B-v0.1", "Mistral-7B-v0.1"), ("Mixtral-8x7B-v0.1", "Mixtral-8x7B"),
         ("Qwen3-30B-A3B", "Qwen3-30B-A3B"), ("Qwen3-235B-A22B", "Qwen3-235B-A22B"), ("DeepSeek-V3", "DeepSeek-V3"),
         ("gpt-oss-20b", "gpt-oss-20b"), ("gpt-oss-120b", "gpt-oss-120b"),
         ("Llama-4-Scout-17B-16E-Instruct", "Llama-4-Scout"), ("gemma-2-9b", "gemma-2-9b"),
         ("gemma-2-27b", "gemma-2-27b"), ("gemma-3-27b-it", "gemma-3-27b")]
GB = 1e9


@pytest.mark.parametrize("folder, preset", PAIRS)
def test_published_config_reads_as_the_preset(folder, preset):
    assert load_hf_config(FIXTURES / folder, name=preset) == MODELS[preset]


def test_deepseek_r1_has_v3_shapes():
    assert replace(MODELS["DeepSeek-R1"], name="DeepSeek-V3") == MODELS["DeepSeek-V3"]


# Totals and active parameters as the model cards state them. Active: DeepSeek, Mixtral, Qwen and Meta count
# both embedding tables; OpenAI counts lm_head but not the embedding.
@pytest.mark.parametrize("name, total, active, tables", [
    ("Mixtral-8x7B", 46.7e9, 12.9e9, 2), ("Qwen3-30B-A3B", 30.5e9, 3.3e9, 2), ("Qwen3-235B-A22B", 235e9, 22e9, 2),
    ("DeepSeek-V3", 671e9, 37e9, 2), ("gpt-oss-20b", 20.9e9, 3.6e9, 1), ("gpt-oss-120b", 116.8e9, 5.1e9, 1),
    ("Llama-4-Scout", 109e9, 17e9, 2), ("gemma-2-9b", 9.24e9, None, 0), ("gemma-2-27b", 27.2e9, None, 0),
    ("gemma-3-27b", 27.4e9, None, 0), ("Mistral-7B-v0.1", 7.24e9, None, 0),
])
def test_param_counts_match_model_cards(name, total, active, tables):
    m = MODELS[name]
    assert m.num_params == pytest.approx(total, rel=5e-3)
    if active:
        assert m.active_layer_params + tables * m.lm_head_params == pytest.approx(active, rel=0.03)


def test_deepseek_v3_by_hand():
    h, v, heads = 7168, 129280, 128
    attn = (h * 1536 + 1536 * heads * (128 + 64)  # q_a_proj, q_b_proj
            + h * (512 + 64) + 512 * heads * (128 + 128)  # kv_a_proj_with_mqa, kv_b_proj
            + heads * 128 * h)  # o_proj
    norms = 2 * h + 1536 + 512  # input/post-attention norms, q_a and kv_a layernorms
    expert = 3 * h * 2048
    dense = 3 * h * 18432
    moe = 256 * expert + expert + 256 * h + 256  # routed, one shared, gate and its score-correction bias
    params = 2 * v * h + 61 * (attn + norms) + 3 * dense + 58 * moe + h
    m = MODELS["DeepSeek-V3"]
    assert m.num_params == params
    # As shipped: every linear layer fp8 with one float32 scale per 128 x 128 block; embed, lm_head,
    # norms and gate in bf16
    linear = 61 * attn + 3 * dense + 58 * 257 * expert
    assert m.weight_bytes == round(linear * (1 + 4 / 128**2) + (params - linear) * 2)
    assert m.weight_bytes / GB == pytest.approx(673.2, abs=0.1)  # the checkpoint less its MTP layer


def test_gpt_oss_mxfp4_experts_by_hand():
    """gpt-oss ships its experts in MXFP4 (4-bit values, an 8-bit scale per 32), everything else bf16;
    the Hub's safetensors are 13.8 GB (20b) and 65.3 GB (120b)."""
    for name, layers, experts, published in (("gpt-oss-20b", 24, 32, 13.8), ("gpt-oss-120b", 36, 128, 65.3)):
        m = MODELS[name]
        expert_params = layers * experts * 3 * 2880 * 2880
        assert m.param_groups().experts == expert_params
        rest = m.num_params - expert_params
        assert m.weight_bytes == round(expert_params * (0.5 + 1 / 32) + rest * 2)
        assert m.weight_bytes / GB == pytest.approx(published, rel=0.005)


def test_gemma2_ties_its_embeddings():
    """config.json does not say tie_word_embeddings; Gemma's config class defaults it to true. Counted
    twice, gemma-2-9b's weights came out 1.7 GiB too high."""
    m = MODELS["gemma-2-9b"]
    assert m.tie_word_embeddings and m.num_params == 9_241_705_984
    untied = replace(m, tie_word_embeddings=False)
    assert (untied.weight_bytes - m.weight_bytes) / 2**30 == pytest.approx(256000 * 3584 * 2 / 2**30) == \
        pytest.approx(1.709, abs=1e-3)


def test_layer_types_per_family():
    gemma3 = MODELS["gemma-3-27b"]
    assert [i for i in range(62) if gemma3.layer_type(i) == FULL] == list(range(5, 62, 6))  # 10 full, 52 sliding
    scout = MODELS["Llama-4-Scout"]
    assert [i for i in range(48) if scout.layer_type(i) == FULL] == list(range(3, 48, 4))  # NoPE layers
    assert {scout.layer_type(i) for i in range(48)} == {FULL, CHUNKED} and scout.attention_chunk_size == 8192
    assert [MODELS["gpt-oss-20b"].layer_type(i) for i in range(4)] == [SLIDING, FULL, SLIDING, FULL]
    assert [MODELS["gemma-2-9b"].layer_type(i) for i in range(4)] == [SLIDING, FULL, SLIDING, FULL]
    assert {MODELS["Mistral-7B-v0.1"].layer_type(i) for i in range(32)} == {SLIDING}
    assert MODELS["Mistral-7B"].layer_types == () and MODELS["Mixtral-8x7B"].layer_types == ()


def write(tmp_path, cfg: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "config.json"


def test_qwen_sliding_window_only_with_use_sliding_window(tmp_path):
    base = json.loads((FIXTURES / "Qwen3-30B-A3B" / "config.json").read_text())
    off = {**base, "sliding_window": 131072}  # Qwen2.5 ships a window it does not use
    assert load_hf_config(write(tmp_path, off)).layer_types == ()
    on = {**base, "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 40}
    spec = load_hf_config(write(tmp_path, on))
    assert [spec.layer_type(i) for i in (39, 40, 47)] == [FULL, SLIDING, SLIDING] and spec.sliding_window == 4096


def test_moe_layer_rules(tmp_path):
    ds = json.loads((FIXTURES / "DeepSeek-V3" / "config.json").read_text())
    spec = load_hf_config(write(tmp_path, {**ds, "first_k_dense_replace": 1, "moe_layer_freq": 2}))
    assert spec.moe.dense_layers == (0, *range(1, 61, 2))  # MoE where i >= 1 and i % 2 == 0
    qwen = json.loads((FIXTURES / "Qwen3-30B-A3B" / "config.json").read_text())
    spec = load_hf_config(write(tmp_path, {**qwen, "decoder_sparse_step": 2, "mlp_only_layers": [1]}))
    assert spec.moe.dense_layers[:4] == (0, 1, 2, 4)  # MoE where (i + 1) % 2 == 0 and i not in [1]
    assert spec.num_moe_layers == 23


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["linear_attention", "full_attention"] * 24},
     "layer_types: 'linear_attention' layers are not supported"),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     "quantization_config.quant_method: 'bitsandbytes' checkpoints are not supported"),
    ({"index_topk": 2048}, "index_topk: DeepSeek sparse attention"),
    ({"mamba_d_state": 16}, "mamba_d_state: Mamba layers (Jamba) are not supported"),
    ({"num_experts_per_tok": 200}, "num_experts_per_tok: 200 is more than the 128 experts (num_experts)"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step: must be a positive integer"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types: must be a list of num_hidden_layers (48) names"),
    ({"mlp_only_layers": "all"}, "mlp_only_layers: must be a list of integers"),
    ({"num_experts": 2**20}, "num_experts: must be at most 65,536"),
])
def test_refusals_name_the_key(tmp_path, change, message):
    base = json.loads((FIXTURES / "Qwen3-30B-A3B" / "config.json").read_text())
    with pytest.raises(KvsimError, match="config.json: " + message.replace("(", r"\(").replace(")", r"\)")) as err:
        load_hf_config(write(tmp_path, {**base, **change}))
    assert "\n" not in str(err.value)


def test_qwen3_next_refused_in_one_line():
    with pytest.raises(KvsimError, match=r"config\.json: linear_num_value_heads: linear-attention layers"):
        load_hf_config(FIXTURES / "Qwen3-Next-80B-A3B-Thinking")


@pytest.mark.parametrize("e, k, t", [(5, 2, 1), (5, 2, 2), (6, 3, 3), (4, 1, 4)])
def test_expected_experts_against_enumeration(e, k, t):
    """Each token picks a uniform k-subset of the E experts: average the distinct experts over every
    assignment."""
    subsets = list(itertools.combinations(range(e), k))
    distinct = [len(set().union(*pick)) for pick in itertools.product(subsets, repeat=t)]
    assert MoeSpec(e, k, 8).expected_experts(t) == pytest.approx(sum(distinct) / len(distinct), rel=1e-12)
    assert MoeSpec(e, k, 8).expected_experts(0) == 0


# ---- weights per GPU -------------------------------------------------------------------------
def test_tp_shards_all_but_norms_and_replicated_kv():
    """Qwen3-30B-A3B has 4 KV heads: at tp=8 each rank keeps one, so k and v are split 4 ways."""
    m = MODELS["Qwen3-30B-A3B"]
    h, layers = 2048, 48
    q_o = layers * 2 * h * 32 * 128
    k_v = layers * 2 * h * 4 * 128
    experts = layers * 128 * 3 * h * 768
    small = m.num_params - 2 * 151936 * h - q_o - k_v - experts
    expected = 2 * (2 * 151936 * h / 8 + q_o / 8 + k_v / 4 + experts / 8 + small)
    assert weights_per_gpu(m, 8).total == pytest.approx(expected, rel=1e-12)


def test_deepseek_v3_on_8_gpus_tp_and_dp_ep():
    m = MODELS["DeepSeek-V3"]
    h, fp8 = 7168, 1 + 4 / 128**2
    replicated = 61 * (h * 1536 + h * 576) * fp8  # q_a_proj and kv_a_proj_with_mqa on every rank
    sharded_attn = 61 * (1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * h) * fp8
    dense, experts, shared = 3 * 3 * h * 18432 * fp8, 58 * 256 * 3 * h * 2048 * fp8, 58 * 3 * h * 2048 * fp8
    tables = 2 * 129280 * h * 2
    small = (m.num_params - 61 * (h * 1536 + h * 576 + 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * h)
             - 3 * 3 * h * 18432 - 58 * 257 * 3 * h * 2048 - 2 * 129280 * h) * 2
    tp8 = weights_per_gpu(m, 8)
    assert tp8.total == pytest.approx(replicated + (sharded_attn + dense + experts + shared + tables) / 8 + small,
                                      rel=1e-12)
    assert tp8.total / 2**30 == pytest.approx(79.3, abs=0.05)
    # DP attention + expert parallel over 8 GPUs: attention and dense layers whole on each, 32 experts each
    dp_ep = weights_per_gpu(m, 1, dp=8, enable_expert_parallel=True)
    assert dp_ep.experts == pytest.approx(experts / 8) and dp_ep.attn + dp_ep.attn_replicated == \
        pytest.approx(replicated + sharded_attn)
    assert dp_ep.total == pytest.approx(replicated + sharded_attn + dense + experts / 8 + shared + tables + small)


def test_ep_puts_whole_experts_on_the_busiest_rank():
    m = MODELS["Mixtral-8x7B"]
    one_expert = 32 * 3 * 4096 * 14336 * 2
    assert weights_per_gpu(m, 1, dp=3, enable_expert_parallel=True).experts == pytest.approx(3 * one_expert)
    assert weights_per_gpu(m, 1, dp=3).experts == pytest.approx(8 * one_expert / 3)  # TP-split experts
    assert weights_per_gpu(m, 2, dp=4, enable_expert_parallel=True).experts == pytest.approx(one_expert)


def test_one_gpu_holds_the_checkpoint():
    for m in MODELS.values():
        assert weights_per_gpu(m).total == pytest.approx(m.weight_bytes, abs=1)
    assert math.isclose(weights_per_gpu(MODELS["Llama-3.1-8B"], 2).embed, 128256 * 4096 * 2 / 2)
