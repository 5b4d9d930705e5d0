"""The library API (`import kvsim`): repeated calls, and `kvsim.memory` as the numbers `kvsim memory` prints."""

import kvsim
from kvsim.cli import main
from tests.conftest import scenario_dict


def test_run_repeats_and_equals_the_pipeline():
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import scenario_from_dict

    scenario = scenario_from_dict(scenario_dict(workload={"num_requests": 20}))
    first = kvsim.run(scenario)
    assert kvsim.run(scenario).summaries == first.summaries == run_scenario(scenario, write=False).summaries
    assert callable(kvsim.run) and callable(kvsim.memory)


def test_memory_records_are_what_the_cli_prints(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "Llama-3.1-8B"\n[engine]\nmax_model_len = 8192\n'
                    '[[policies]]\nname = "paged"\n[[policies]]\nname = "int4"\nkv_cache_dtype = "int4"\n'
                    '[[policies]]\nname = "contiguous"\nallocator = "contiguous"\nenable_chunked_prefill = false\n'
                    '[workload]\nnum_requests = 1\nprefix = { num_groups = 2, prefix_len = 2048 }\n')
    mem = kvsim.memory(path)
    assert main(["memory", str(path)]) == 0
    printed = capsys.readouterr().out
    assert [c["kv_cache_dtype"] for c in mem["capacity"]] == ["auto", "int4"]
    auto, int4 = mem["capacity"]
    assert auto["policies"] == ["paged", "contiguous"] and auto["bytes_per_token"] == 131072
    assert int4["bytes_per_token"] == 2 * 32 * 8 * (64 + 4)  # 4-bit values and a float32 scale per head
    assert auto["kv_in_blocks"] == auto["num_blocks"] * auto["bytes_per_block"] <= auto["kv"]
    for cap in mem["capacity"]:
        assert f"{cap['max_tokens']:,}" in printed and f"{cap['num_blocks']:,}" in printed
    assert [r["seq_len"] for r in mem["sequences"][:4]] == [1024, 4096, 8192, 1024]
    for r in mem["sequences"]:
        assert f"({r['num_seqs']:,})" in printed
    contiguous = [r for r in mem["sequences"] if r["policy"] == "contiguous"]
    assert {r["bytes_per_seq"] for r in contiguous} == {8192 * 131072}  # a max_model_len slab each
    assert mem["prefix"]["prefix_len"] == 2048
    assert f"{mem['prefix']['flops_saved'] / 1e12:,.2f} TFLOP per hit" in printed
    assert {r["kv_cache_dtype"] for r in mem["bytes_per_token"]} >= {"auto", "fp8", "int8", "int4"}
    dense = kvsim.memory(path, seq_lens=[100, 5000, 10**6])["sequences"]
    assert [r["seq_len"] for r in dense[:3]] == [100, 5000, 8192]  # capped at max_model_len
