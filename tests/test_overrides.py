"""`--set dotted.key=value`: TOML values, policies by name/index/all, tables created, one-line errors."""

import pytest

from kvsim.errors import KvsimError
from kvsim.scenario.config import load_scenario
from kvsim.scenario.overrides import apply_overrides, parse_override, parse_value

from conftest import scenario_dict

try:
    import tomllib
except ImportError:  # pragma: no cover
    import tomli as tomllib


def test_values_are_read_as_toml_and_bare_words_as_strings():
    assert parse_value("8") == 8 and parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_value('"fp8"') == "fp8" and parse_value("fp8") == "fp8" and parse_value("H200") == "H200"
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value('{ process = "poisson", rate = 4.0 }') == {"process": "poisson", "rate": 4.0}
    with pytest.raises(KvsimError, match="cannot read value"):
        parse_value("[1, 2")


def test_key_parts_and_missing_equals():
    assert parse_override("workload.arrival.rate=3") == (["workload", "arrival", "rate"], 3)
    for bad in ("engine.max_num_seqs", "engine..x=1", "=3"):
        with pytest.raises(KvsimError, match="expected dotted.key=value"):
            parse_override(bad)


def test_policies_by_name_index_and_all():
    data = scenario_dict(policies=[{"name": "a"}, {"name": "b"}])
    out = apply_overrides(data, ["policies.b.kv_cache_dtype=fp8", "policies.0.allocator=contiguous",
                                 "policies.*.enable_chunked_prefill=false"])
    assert out["policies"] == [{"name": "a", "allocator": "contiguous", "enable_chunked_prefill": False},
                               {"name": "b", "kv_cache_dtype": "fp8", "enable_chunked_prefill": False}]
    assert data["policies"] == [{"name": "a"}, {"name": "b"}]  # the input is left alone
    with pytest.raises(KvsimError, match="no policy named 'c'"):
        apply_overrides(data, ["policies.c.kv_cache_dtype=fp8"])
    with pytest.raises(KvsimError, match="out of range"):
        apply_overrides(data, ["policies.5.kv_cache_dtype=fp8"])


def test_missing_tables_are_created_and_values_are_not_tables():
    out = apply_overrides(scenario_dict(), ["workload.prefix.num_groups=4"])
    assert out["workload"]["prefix"] == {"num_groups": 4}
    with pytest.raises(KvsimError, match="workload.seed.x: seed is a value"):
        apply_overrides(scenario_dict(), ["workload.seed.x=1"])


SCENARIO = """
name = "s"
[model]
name = "Llama-3.1-8B"
[engine]
max_model_len = 4096
[[policies]]
name = "paged"
[workload]
num_requests = 10
arrival = { process = "poisson", rate = 2.0 }
"""


def test_load_scenario_validates_overrides_with_the_schema(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    sc = load_scenario(path, ["engine.max_num_seqs=12", "hardware.gpu=H200", "workload.arrival.rate=0.5"])
    assert (sc.engine.max_num_seqs, sc.hardware.gpu, sc.workload.arrival.rate) == (12, "H200", 0.5)
    assert load_scenario(path, ["name=other"]).name == "other"
    with pytest.raises(KvsimError, match=r"s.toml: engine.max_num_seqz: unknown key"):
        load_scenario(path, ["engine.max_num_seqz=12"])
    with pytest.raises(KvsimError, match=r"s.toml: engine.max_num_seqs: "):
        load_scenario(path, ["engine.max_num_seqs=many"])
    assert tomllib.loads(SCENARIO)["engine"] == {"max_model_len": 4096}
