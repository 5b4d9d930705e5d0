"""Published config.json files load as shipped (or are refused in one line), their parsed shapes match
hand-computed parameter counts, weight bytes and KV bytes per token, and the checkpoint's
quantization_config sets the weights' bytes per role (kvsim.scenario.hf_quant). Fixtures and their
sources: tests/fixtures/hf_configs/README.md."""

import json
import shutil
from pathlib import Path

import pytest

from kvsim.errors import KvsimError
from kvsim.perf.memory import kv_bytes_per_token
from kvsim.scenario.catalog import MODELS, load_hf_config
from kvsim.scenario.models import CHUNKED, FULL

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
REFUSED = {"Qwen3-Next-80B-A3B-Thinking": "linear_num_value_heads: linear-attention layers"}
# folder -> preset it must read as (the name given)
AS_PRESET = {"Llama-3.1-8B": "Llama-3.1-8B", "Llama-3.1-70B": "Llama-3.1-70B", "Qwen3-8B": "Qwen3-8B",
             "Qwen3-0.6B": "Qwen3-0.6B", "Kimi-K2.5": "Kimi-K2.5", "MiniMax-M2.5": "MiniMax-M2.5"}
# folder -> (format, roles) as shipped ("": unquantised; () roles: the format's default)
FORMATS = {"Llama-3.1-70B-Instruct-FP8": ("fp8_tensor", ()), "Qwen3-30B-A3B-FP8": ("fp8", ()),
           "Qwen3-235B-A22B-FP8": ("fp8", ()), "Qwen3-235B-A22B-NVFP4": ("nvfp4", ()),
           "Kimi-K2-Instruct": ("fp8", ()), "Kimi-K2.5": ("int4", ("experts",)),
           "Kimi-K2.5-NVFP4": ("nvfp4", ("mlp", "shared", "experts")), "MiniMax-M2.5": ("fp8", ()),
           "MiniMax-M2.5-NVFP4": ("nvfp4", ("mlp", "shared", "experts")), "gpt-oss-120b": ("mxfp4", ()),
           "DeepSeek-V3": ("fp8", ()), "Llama-4-Scout-17B-16E-Instruct": ("", ()), "Llama-3.1-8B": ("", ())}
GB = 1e9


def folders():
    return sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", folders())
def test_every_published_config_loads_or_is_refused_in_one_line(folder):
    if folder in REFUSED:
        with pytest.raises(KvsimError, match=REFUSED[folder]) as err:
            load_hf_config(FIXTURES / folder)
        assert "\n" not in str(err.value)
        return
    m = load_hf_config(FIXTURES / folder)
    assert m.num_params > 0 and m.weight_bytes > 0
    if folder in AS_PRESET:
        assert load_hf_config(FIXTURES / folder, name=AS_PRESET[folder]) == MODELS[AS_PRESET[folder]]
    if folder in FORMATS:
        assert (m.quantization, m.quantized) == FORMATS[folder]


def test_llama4_scout_as_published_reads_its_empty_no_rope_layers_as_every_fourth_layer_nope():
    """The Hub's config says "no_rope_layers": []; transformers reads that as its default: every fourth
    layer (3, 7, ...) NoPE with full attention, the others chunked-local (8192)."""
    cfg = json.loads((FIXTURES / "Llama-4-Scout-17B-16E-Instruct" / "config.json").read_text())
    assert cfg["text_config"]["no_rope_layers"] == []
    m = load_hf_config(FIXTURES / "Llama-4-Scout-17B-16E-Instruct", name="Llama-4-Scout")
    assert [i for i in range(48) if m.layer_type(i) == FULL] == list(range(3, 48, 4))
    assert m.layer_type(0) == CHUNKED and m == MODELS["Llama-4-Scout"]


def test_kimi_k25_by_hand():
    """Kimi-K2.5: DeepSeek-V3's layout (61 layers, one dense) with 64 heads and 384 experts; the routed experts
    int4 (a bf16 scale per 32 values), everything else bf16; MoonViT (27 layers of 1152) and its patch merger."""
    h, v, heads = 7168, 163840, 64
    attn = h * 1536 + 1536 * heads * 192 + h * 576 + 512 * heads * 256 + heads * 128 * h
    norms = 2 * h + 1536 + 512
    expert, dense = 3 * h * 2048, 3 * h * 18432
    moe = 384 * expert + expert + 384 * h + 384  # routed, shared, router and its bias
    text = 2 * v * h + 61 * (attn + norms) + dense + 60 * moe + h
    vh, vi, m4 = 1152, 4304, 4 * 1152
    vit = 27 * (4 * vh * vh + 4 * vh + 2 * vh * vi + vi + vh + 4 * vh) + 3 * 14 * 14 * vh + vh + 64 * 64 * vh + 2 * vh
    merger = 2 * vh + m4 * m4 + m4 + m4 * h + h
    m = MODELS["Kimi-K2.5"]
    assert m.num_params == text + vit + merger
    assert m.num_params / 1e9 == pytest.approx(1026.9, abs=0.1)  # the model card's "1T", vision ~0.5B
    routed = 60 * 384 * expert
    assert m.weight_bytes == round(routed * (0.5 + 2 / 32) + (m.num_params - routed) * 2)
    assert m.weight_bytes / GB == pytest.approx(595.2, abs=0.1)
    assert kv_bytes_per_token(m, "auto") == 61 * 576 * 2 == 70_272  # one latent of 512 + 64 a layer


def test_minimax_m25_by_hand():
    """MiniMax-M2.5: 62 layers of 48 query / 8 KV heads of 128, every layer 256 experts of 1536 (top 8) with a
    routing bias, q and k RMS-normed over all heads; shipped in 128x128-block fp8."""
    h, v = 3072, 200064
    attn = h * 6144 + 2 * h * 1024 + 6144 * h
    experts = 256 * 3 * h * 1536
    small = 2 * h + (48 + 8) * 128 + 256 * h + 256
    m = MODELS["MiniMax-M2.5"]
    params = 2 * v * h + 62 * (attn + experts + small) + h
    assert m.num_params == params and m.num_params / 1e9 == pytest.approx(228.7, abs=0.1)  # "230B"
    linear = 62 * (attn + experts)
    assert m.weight_bytes == round(linear * (1 + 4 / 128**2) + (params - linear) * 2)
    assert kv_bytes_per_token(m, "auto") == 62 * 2 * 8 * 128 * 2 == 253_952
    nvfp4 = load_hf_config(FIXTURES / "MiniMax-M2.5-NVFP4")  # attention left bf16 by its ignore list
    assert nvfp4.weight_bytes == round(62 * experts * (0.5 + 1 / 16) + (params - 62 * experts) * 2)


def test_nvfp4_and_fp8_checkpoints_by_hand():
    llama = MODELS["Llama-3.1-70B"]
    fp8 = load_hf_config(FIXTURES / "Llama-3.1-70B-Instruct-FP8")  # ModelOpt 0.23: hf_quant_config.json beside
    linear = llama.param_groups().attn + llama.param_groups().attn_kv + llama.param_groups().dense_mlp
    assert fp8.weight_bytes == round(linear * 1 + (llama.num_params - linear) * 2)
    qwen = load_hf_config(FIXTURES / "Qwen3-235B-A22B-NVFP4")  # every linear layer NVFP4 but the router
    p = MODELS["Qwen3-235B-A22B"].param_groups()
    lin = p.attn + p.attn_kv + p.experts
    assert qwen.weight_bytes == round(lin * (0.5 + 1 / 16) + (p.total - lin) * 2)
    kimi = load_hf_config(FIXTURES / "Kimi-K2.5-NVFP4")  # attention bf16, MLPs and experts NVFP4
    k = kimi.param_groups()
    lin = k.dense_mlp + k.shared_experts + k.experts
    assert kimi.weight_bytes == round(lin * (0.5 + 1 / 16) + (k.total - lin) * 2)


def write(tmp_path, cfg: dict, name: str = "config.json") -> Path:
    (tmp_path / name).write_text(json.dumps(cfg))
    return tmp_path


QWEN = json.loads((FIXTURES / "Qwen3-30B-A3B" / "config.json").read_text())


def ct(weights: dict, acts=None, ignore=()) -> dict:
    return {"quant_method": "compressed-tensors", "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}


@pytest.mark.parametrize("q, fmt, roles, group", [
    (ct({"num_bits": 8, "type": "float", "strategy": "channel"}, {"num_bits": 8, "type": "float"},
        ["re:.*mlp.gate$", "lm_head"]), "fp8_tensor", (), 0),  # RedHat's FP8-dynamic checkpoints
    (ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}), "fp8", (), 0),
    (ct({"num_bits": 4, "type": "int", "group_size": 128}, None, ["re:.*self_attn.*"]), "int4",
     ("mlp", "shared", "experts"), 128),
    (ct({"num_bits": 4, "type": "float", "group_size": 16}, {"num_bits": 4, "type": "float"}), "nvfp4", (), 0),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["model.layers.*.self_attn*"]}, "nvfp4",
     ("mlp", "shared", "experts"), 0),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "int4", (), 128),
    ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}, "int4", (), 64),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_tensor", (), 0),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}, "fp8", (), 0),
])
def test_quantization_configs_read_as_vllm_reads_them(tmp_path, q, fmt, roles, group):
    m = load_hf_config(write(tmp_path, {**QWEN, "quantization_config": q}))
    assert (m.quantization, m.quantized, m.quant_group_size) == (fmt, roles, group)


def test_quantization_config_inside_text_config_and_in_hf_quant_config_json(tmp_path):
    scout = json.loads((FIXTURES / "Llama-4-Scout-17B-16E-Instruct" / "config.json").read_text())
    scout["text_config"]["quantization_config"] = ct({"num_bits": 8, "type": "float", "strategy": "channel"},
                                                     {"num_bits": 8, "type": "float"}, ["re:.*router", "re:vision.*"])
    m = load_hf_config(write(tmp_path, scout))
    assert m.quantization == "fp8_tensor" and m.weight_bytes < MODELS["Llama-4-Scout"].weight_bytes * 0.52
    folder = tmp_path / "modelopt"
    folder.mkdir()
    shutil.copy(FIXTURES / "Llama-3.1-8B" / "config.json", folder / "config.json")
    write(folder, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                     "exclude_modules": ["lm_head"]}},
          "hf_quant_config.json")
    assert load_hf_config(folder).quantization == "nvfp4"


@pytest.mark.parametrize("q, message", [
    (ct({"num_bits": 8, "type": "int", "strategy": "channel"}, {"num_bits": 8, "type": "int"}),
     "quantization_config.config_groups.group_0.weights: 8-bit int weights are not priced"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
     "quantization_config.quant_algo: 'MIXED_PRECISION' is not read"),
    ({"quant_method": "gptq", "bits": 8}, "quantization_config.bits: gptq checkpoints of 8 bits are not priced"),
    ({"quant_method": "gguf"}, "quantization_config.quant_method: 'gguf' checkpoints are not supported"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "a": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}},
        "b": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}},
     "quantization_config.config_groups: mixed weight formats"),
    ("fp8", "quantization_config: must be a table"),
])
def test_unread_quantization_is_one_line_naming_the_key(tmp_path, q, message):
    with pytest.raises(KvsimError, match="config.json: " + message) as err:
        load_hf_config(write(tmp_path, {**QWEN, "quantization_config": q}))
    assert "\n" not in str(err.value)


def test_minimax_lightning_attention_is_refused(tmp_path):
    cfg = json.loads((FIXTURES / "MiniMax-M2.5-NVFP4" / "config.json").read_text())
    cfg["attn_type_list"] = [0] + cfg["attn_type_list"][1:]
    with pytest.raises(KvsimError, match="attn_type_list: lightning \\(linear\\) attention layers are not supported"):
        load_hf_config(write(tmp_path, cfg))


def scenario_text(model: str, extra: str = "") -> str:
    return (f'name = "s"\n[model]\n{model}\n[hardware]\ngpu = "H100-SXM"\ngpu_memory_utilization = 0.9\n{extra}'
            '[[policies]]\nname = "paged"\n[workload]\nnum_requests = 5\n')


def test_llama2_7b_kv_blocks_within_two_percent_of_vllms_log(tmp_path):
    """vLLM logged 7,463 GPU KV blocks (block 16) for Llama-2-7B on one H100 at gpu_memory_utilization 0.9
    (../shared/groundtruth: max_model_len 4096, max_num_batched_tokens 2048, max_num_seqs 128)."""
    from kvsim.perf.memory import kv_capacity
    from kvsim.scenario.catalog import gpu_spec, model_spec
    from kvsim.scenario.config import load_scenario

    shutil.copytree(FIXTURES / "Llama-2-7b-hf", tmp_path / "llama2")
    path = tmp_path / "s.toml"
    path.write_text(scenario_text('hf_config = "llama2"', "[engine]\nmax_model_len = 4096\n"
                                  "max_num_batched_tokens = 2048\nmax_num_seqs = 128\n"))
    sc = load_scenario(path)
    blocks = kv_capacity(sc, sc.policies[0], model_spec(sc), gpu_spec(sc)).num_blocks
    assert abs(blocks / 7463 - 1) < 0.02, blocks


def test_model_dtype_nvfp4_quantises_every_linear_layer(tmp_path):
    from kvsim.scenario.catalog import model_spec
    from kvsim.scenario.config import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(scenario_text('name = "Llama-3.1-70B"\ndtype = "nvfp4"'))
    m = model_spec(load_scenario(path))
    p = m.param_groups()
    lin = p.attn + p.attn_kv + p.dense_mlp
    assert m.quantization == "nvfp4" and m.weight_bytes == round(lin * (0.5 + 1 / 16) + (p.total - lin) * 2)
