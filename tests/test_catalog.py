"""Model and GPU presets: published parameter counts, config.json loading, one-line errors."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvsim.errors import KvsimError
from kvsim.scenario.catalog import GPUS, MODELS, gpu_spec, load_hf_config, model_spec
from kvsim.scenario.layout import hardware_gpus, hourly_cost
from kvsim.scenario.config import load_scenario

ROOT = Path(__file__).resolve().parent.parent

# config.json files as published on the Hugging Face Hub (fields kvsim reads, plus a few it ignores).
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
LLAMA_31_8B = {  # no head_dim key: it defaults to hidden_size // num_attention_heads
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def scenario(tmp_path, model_toml: str, hardware_toml: str = ""):
    path = tmp_path / "scen.toml"
    path.write_text(f"[model]\n{model_toml}\n[hardware]\n{hardware_toml}\n"
                    "[[policies]]\nname = 'paged'\n[workload]\nnum_requests = 1\n")
    return load_scenario(path)


def write_config(tmp_path, folder: str, cfg) -> str:
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return f"{folder}/config.json"


def test_llama_8b_param_count_exact():
    # embed + 32 x (q,o: 4096^2 each; k,v: 4096x1024 each; gate/up/down: 3 x 4096x14336; 2 norms) + norm + lm_head
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    expected = 128256 * 4096 + 32 * layer + 4096 + 128256 * 4096
    assert expected == 8_030_261_248  # the count Hugging Face reports for meta-llama/Llama-3.1-8B
    assert MODELS["Llama-3.1-8B"].num_params == expected


@pytest.mark.parametrize("name, published", [
    ("Llama-3.1-8B", 8.03e9), ("Llama-3.1-70B", 70.6e9), ("Qwen3-0.6B", 0.596e9), ("Qwen3-8B", 8.19e9),
    ("Mistral-7B", 7.25e9),
])
def test_param_counts_match_published(name, published):
    assert MODELS[name].num_params == pytest.approx(published, rel=5e-3)


def test_tied_embeddings_count_once():
    qwen = MODELS["Qwen3-0.6B"]
    untied = replace(qwen, tie_word_embeddings=False)
    assert untied.num_params - qwen.num_params == 151936 * 1024
    # Qwen3's per-head q/k norms add 2 x head_dim weights per layer.
    assert qwen.num_params - replace(qwen, qk_norm=False).num_params == 28 * 2 * 128


def test_weight_bytes_follow_dtype():
    m = MODELS["Llama-3.1-8B"]
    assert m.weight_bytes == 2 * m.num_params
    # vLLM's fp8 quantises Linear layers only: embed_tokens, lm_head and the norms stay 16-bit
    sixteen_bit = 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096
    assert replace(m, dtype="fp8").weight_bytes == (m.num_params - sixteen_bit) + 2 * sixteen_bit
    assert replace(m, dtype="float32").weight_bytes == 4 * m.num_params


def test_flops_per_token_is_twice_the_matmul_params():
    m = MODELS["Llama-3.1-8B"]
    matmuls = m.num_params - 128256 * 4096 - (32 * 2 * 4096 + 4096)  # drop the embedding gather and the norms
    assert m.params_per_token_flops == 2 * matmuls
    # only sampled rows go through lm_head: 10 tokens, 2 logits
    assert m.gemm_flops(10, 2) == 10 * m.params_per_token_flops - 8 * 2 * 128256 * 4096


@pytest.mark.parametrize("name, cfg", [("Qwen3-0.6B", QWEN3_06B), ("Llama-3.1-8B", LLAMA_31_8B)])
def test_hf_config_matches_preset(tmp_path, name, cfg):
    rel = write_config(tmp_path, name, cfg)
    spec = model_spec(scenario(tmp_path, f"hf_config = '{rel}'"))
    assert spec == MODELS[name]


def test_hf_config_defaults_and_dtype(tmp_path):
    cfg = {k: v for k, v in LLAMA_31_8B.items() if k not in ("num_key_value_heads", "rope_theta")}
    rel = write_config(tmp_path, "mha", cfg)
    spec = model_spec(scenario(tmp_path, f"hf_config = '{rel}'\ndtype = 'fp8'"))
    assert spec.num_key_value_heads == 32 and spec.head_dim == 128 and spec.rope_theta == 10000.0
    assert not spec.qk_norm and spec.dtype == "fp8" and spec.name == "mha"
    assert load_hf_config(tmp_path / "mha").num_key_value_heads == 32  # a folder holding config.json


def test_preset_lookup_is_case_insensitive(tmp_path):
    assert model_spec(scenario(tmp_path, "name = 'qwen3-8b'")) == MODELS["Qwen3-8B"]
    assert gpu_spec(scenario(tmp_path, "name = 'Qwen3-8B'", "gpu = 'h100-sxm'")) == GPUS["H100-SXM"]


def test_unknown_preset_names_file_and_key(tmp_path):
    with pytest.raises(KvsimError, match=r"scen\.toml: model\.name: unknown model 'GPT-5'.*Llama-3\.1-8B"):
        model_spec(scenario(tmp_path, "name = 'GPT-5'"))


def test_missing_config_file(tmp_path):
    with pytest.raises(KvsimError, match=r"nope[/\\]config\.json: model config \(model.hf_config\) not found"):
        model_spec(scenario(tmp_path, "hf_config = 'nope/config.json'"))


def test_bad_json_names_file_and_line(tmp_path):
    rel = write_config(tmp_path, "bad", '{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(KvsimError, match=r"bad[/\\]config\.json:3: invalid JSON"):
        model_spec(scenario(tmp_path, f"hf_config = '{rel}'"))


def test_missing_key_names_file_and_key(tmp_path):
    rel = write_config(tmp_path, "short", {k: v for k, v in QWEN3_06B.items() if k != "intermediate_size"})
    with pytest.raises(KvsimError, match=r"short[/\\]config\.json: missing key 'intermediate_size'"):
        model_spec(scenario(tmp_path, f"hf_config = '{rel}'"))


def test_wrong_type_names_key(tmp_path):
    rel = write_config(tmp_path, "typo", {**QWEN3_06B, "num_hidden_layers": "28"})
    with pytest.raises(KvsimError, match=r"typo[/\\]config\.json: num_hidden_layers: must be a positive integer"):
        model_spec(scenario(tmp_path, f"hf_config = '{rel}'"))


def test_gpu_figures_are_dense_and_as_reported():
    h100 = GPUS["H100-SXM"]
    assert h100.memory_gib * 1024 == 81559  # MiB as nvidia-smi reports
    assert h100.bf16_tflops == pytest.approx(989.4)  # not the 1979 "with sparsity" figure
    assert GPUS["A100-80GB"].fp8_tflops == GPUS["A100-80GB"].bf16_tflops  # no fp8 units
    for g in GPUS.values():
        assert g.fp8_tflops >= g.bf16_tflops > g.fp32_tflops > 0
        assert g.memory_gib > 40 and g.hbm_bandwidth_gbps > 800


def test_gpu_overrides_apply(tmp_path):
    g = gpu_spec(scenario(tmp_path, "name = 'Qwen3-8B'", "gpu = 'H200'\nmemory_gib = 100.0\nnvlink_gbps = 50.0"))
    assert g == replace(GPUS["H200"], memory_gib=100.0, cuda_memory_gib=100.0, nvlink_gbps=50.0)  # it reports that size


def test_unknown_gpu_names_key(tmp_path):
    with pytest.raises(KvsimError, match=r"scen\.toml: hardware\.gpu: unknown GPU 'TPUv5'.*H100-SXM"):
        gpu_spec(scenario(tmp_path, "name = 'Qwen3-8B'", "gpu = 'TPUv5'"))


def test_the_hourly_price_pays_for_every_gpu_tp_times_dp_times_replicas(tmp_path):
    """scenarios/moe.toml serves on 2 H100s as DP 2 + EP at TP 1: two GPUs' price, not one."""
    moe = load_scenario(ROOT / "scenarios" / "moe.toml")
    assert hardware_gpus(moe.hardware) == 2
    cost = hourly_cost(moe)
    assert cost.usd_per_hour == pytest.approx(2 * 2.99) and cost.num_gpus == 2
    wide = scenario(tmp_path, "name = 'Qwen3-30B-A3B'", "gpu = 'H200'\ntensor_parallel_size = 2\n"
                    "data_parallel_size = 2\nenable_expert_parallel = true\nnum_replicas = 3")
    assert hardware_gpus(wide.hardware) == 12 and hourly_cost(wide).usd_per_hour == pytest.approx(12 * 3.79)
    (tmp_path / "priced.toml").write_text((tmp_path / "scen.toml").read_text()
                                          + "[cost]\ngpu_hour_usd = { H200 = 2.0 }\n")
    assert hourly_cost(load_scenario(tmp_path / "priced.toml")).usd_per_hour == pytest.approx(24.0)  # the scenario's own price
