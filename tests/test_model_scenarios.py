"""The shipped mixture-of-experts and MLA scenarios (`scenarios/moe.toml`, `scenarios/deepseek.toml`):
they load, simulate every request, and their KV figures equal what the configs give by hand."""

from pathlib import Path

import pytest

from kvsim.perf.memory import compute_capacity
from kvsim.pipeline import run_scenario
from kvsim.results.memory_report import memory_records
from kvsim.scenario.catalog import GPUS, model_spec
from kvsim.scenario.config import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def scenario(name: str, *overrides: str):
    return load_scenario(ROOT / "scenarios" / f"{name}.toml", overrides)


def test_moe_scenario_weights_and_kv_by_hand():
    """Qwen3-30B-A3B (48 layers, hidden 2048, 32 query / 4 KV heads of 128, 128 experts of intermediate
    768, vocabulary 151936, untied embeddings) on two H100s as DP 2 + EP: each GPU holds attention,
    router and embeddings whole and 64 of the 128 experts."""
    sc = scenario("moe")
    assert (sc.hardware.tensor_parallel_size, sc.hardware.data_parallel_size, sc.hardware.enable_expert_parallel) \
        == (1, 2, True)
    spec = model_spec(sc)
    h, layers = 2048, 48
    attn = h * 32 * 128 + 2 * h * 4 * 128 + 32 * 128 * h + 2 * 128  # q, k, v, o, q_norm and k_norm
    per_layer = attn + 2 * h + h * 128  # two RMSNorms, the router
    experts = 64 * 3 * h * 768 * layers  # gate, up and down projections of this GPU's 64 experts
    params = 2 * 151936 * h + layers * per_layer + h + experts
    cap = compute_capacity(sc, sc.policies[0], spec, GPUS["H100-SXM"])
    assert cap.weights == 2 * params == 32_073_216_000
    per_token = 2 * layers * 4 * 128 * 2  # K and V, 4 KV heads whole on the GPU (TP 1), bf16
    assert cap.bytes_per_block == 16 * per_token == 1_572_864
    assert cap.num_blocks == int((cap.budget - cap.weights - cap.activations - cap.reserve) // cap.bytes_per_block)
    doc = memory_records(sc, spec, GPUS["H100-SXM"])
    paged, fp8 = doc["policies"][0], doc["policies"][1]
    assert paged["kv_bytes_per_token"] == per_token and fp8["kv_bytes_per_token"] == per_token / 2
    assert fp8["num_blocks"] == 2 * paged["num_blocks"]  # same memory, half the page
    assert paged["max_sequences"]["8192"] == paged["num_blocks"] // (8192 // 16)


def test_deepseek_scenario_latent_cache_beside_mha_by_hand():
    """DeepSeek-V3 at TP 8 on H200s: MLA caches 512 + 64 elements a token a layer on every rank (61
    layers); multi-head attention would cache 16 of 128 heads' 192-dim keys and 128-dim values a GPU."""
    sc = scenario("deepseek")
    spec = model_spec(sc)
    doc = memory_records(sc, spec, GPUS["H200"])
    paged, fp8 = doc["policies"]
    latent, mha = 61 * (512 + 64) * 2, 61 * 16 * (192 + 128) * 2
    assert (paged["kv_bytes_per_token"], paged["kv_bytes_per_token_mha"]) == (latent, mha) == (70_272, 624_640)
    assert mha / latent == pytest.approx(8.89, abs=0.01) and 8 * mha / latent == pytest.approx(71.1, abs=0.1)
    assert paged["block_size"] == 64 and paged["bytes_per_block"] == 64 * latent
    assert [g["spec"] for g in paged["kv_cache_groups"]] == ["MLAAttentionSpec"]
    blocks = paged["num_blocks"]
    assert paged["max_sequences"] == {str(n): blocks // (n // 64) for n in (1024, 4096, 8192, 16384, 32768)}
    tokens_mha = int(compute_capacity(sc, sc.policies[0], spec, GPUS["H200"]).kv // (mha * 64)) * 64
    assert paged["max_sequences_mha"]["8192"] == tokens_mha // 8192 < paged["max_sequences"]["8192"] // 8
    assert fp8["kv_bytes_per_token"] == latent / 2 and fp8["num_blocks"] == 2 * blocks


@pytest.mark.parametrize("name,policies", [("moe", ("paged", "paged-fp8", "contiguous")),
                                           ("deepseek", ("paged", "paged-fp8"))])
def test_model_scenarios_simulate_every_request(name, policies):
    sc = scenario(name, "workload.num_requests=60")
    out = run_scenario(sc, write=False).summaries
    assert tuple(out) == policies
    for s in out.values():
        assert s["requests"]["finished"] == 60 and s["requests"]["rejected"] == 0
        kv = s["kv"]
        assert 0 < kv["peak_used_blocks"] <= kv["num_blocks"]
    replicas = sc.hardware.data_parallel_size  # each DP rank an engine with its own cache
    assert out["paged"]["kv"]["num_blocks"] == replicas * out["paged"]["kv"]["num_blocks_per_replica"]
    if name == "moe":  # contiguous slabs reserve max_model_len (16384 tokens, 1024 blocks) a sequence
        assert out["contiguous"]["kv"]["peak_used_blocks"] % 1024 == 0
