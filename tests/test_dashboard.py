"""The dashboard (app/) under Streamlit's AppTest: widgets become scenario keys, the numbers on every
page are the command line's for the scenario file the page offers for download, uploads go through
the strict schema and a bad one is one error line, and `python -m kvsim dashboard` starts it."""

import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import kvsim
from kvsim.cli import main
from kvsim.results.figures import bar_figures
from kvsim.results.headline import table_figures
from kvsim.scenario.config import EngineConfig

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app" / "Home.py"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(APP.parent))  # what `streamlit run` does for the app's own modules

from kvdash import fields  # noqa: E402
from kvdash.runs import PREVIEW_REQUESTS  # noqa: E402


def open_app(page: str = "views/whatif.py") -> AppTest:
    """The app opened on `page` (not the Answer page, which plans the default scenario on opening)."""
    return AppTest.from_file(str(APP), default_timeout=120).switch_page(page).run()


def widget(at: AppTest, kind: str, key: str):
    """The settings widget (the question in the main area, or under Advanced in the sidebar) that sets
    scenario `key` (widget keys are `<scenario digest>:<key>`)."""
    every = list(getattr(at.main, kind)) + list(getattr(at.sidebar, kind))
    found = [w for w in every if w.key and w.key.split(":", 1)[-1] == key]
    assert len(found) == 1, f"{kind} for {key}: {[w.key for w in every]}"
    return found[0]


def figures(at: AppTest) -> list[dict]:
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def values(v) -> list:
    """A plotly JSON array: a list, or numpy data as plotly encodes it ({"dtype", "bdata": base64})."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return v


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def one_error(at: AppTest) -> str:
    assert not at.exception
    assert len(at.error) == 1, [e.value for e in at.error]
    message = at.error[0].value
    assert "\n" not in message and "Traceback" not in message
    return message


def downloaded_toml(at: AppTest) -> str:
    [code] = [c for c in at.code if c.language == "toml"]
    return code.value


def downloaded_toml_from_state(at: AppTest) -> str:
    """The scenario file the What-if page offers, for the scenario a page shows."""
    return at.session_state["kvsim.current"].download_toml()


def cli(tmp_path: Path, toml: str, *args: str, command: str = "run") -> subprocess.CompletedProcess:
    """`python -m kvsim` on the dashboard's scenario file, as a user would run it."""
    path = tmp_path / "scenario.toml"
    path.write_text(toml)
    return subprocess.run([sys.executable, "-m", "kvsim", command, str(path), *args], cwd=tmp_path,
                          capture_output=True, text=True, check=True)


def assert_shows(at: AppTest, summaries: dict) -> None:
    """The comparison table and the report's bar figures hold exactly these policies' figures."""
    table = at.dataframe[0].value
    names = list(table.columns[1:])  # a column per policy, in the scenario's order (summary.json sorts its keys)
    assert sorted(names) == sorted(summaries)
    rows = {row["figure"]: row for _, row in table.iterrows()}
    for name in names:
        s = summaries[name]
        assert rows["finished / rejected"][name] == f"{s['requests']['finished']:,} / {s['requests']['rejected']:,}"
        for f in table_figures(summaries):
            assert rows[f.label][name] == f.text(s)  # the terminal table's text
    bars = [t for t in figures(at)[0]["data"] if t["type"] == "bar"]  # a bar per policy and panel
    panels = bar_figures(summaries)
    assert [t["x"] for t in bars] == [[p] for p in names] * len(panels)
    for i, f in enumerate(panels):
        shown = bars[i * len(names):(i + 1) * len(names)]
        assert [t["y"][0] for t in shown] == pytest.approx([f.value(summaries[p]) for p in names], rel=1e-12)
    ttft_cdf = figures(at)[1]["data"][0]  # read back from requests.csv, which keeps 12 significant digits
    assert max(values(ttft_cdf["x"])) == pytest.approx(summaries[ttft_cdf["name"]]["ttft_s"]["max"], rel=1e-11)


def test_whatif_preview_and_full_run_are_the_clis(tmp_path):
    at = open_app()
    assert_clean(at)
    assert [t.value for t in at.title] == ["What-if"]
    widget(at, "multiselect", "policies").set_value(["paged", "paged-fp8", "paged-chunked"])
    widget(at, "selectbox", "policies.2.kv_cache_dtype").set_value("int8")
    widget(at, "checkbox", "policies.1.enable_chunked_prefill").set_value(True)
    widget(at, "number_input", "hardware.gpu_memory_utilization").set_value(0.8)
    widget(at, "number_input", "engine.max_num_seqs").set_value(64)
    widget(at, "number_input", "workload.num_requests").set_value(PREVIEW_REQUESTS + 100)
    widget(at, "number_input", "workload.arrival.rate").set_value(12.0)
    widget(at, "number_input", "slo.ttft_ms").set_value(500.0)
    at.run()
    assert_clean(at)
    toml = downloaded_toml(at)
    for line in ("gpu_memory_utilization = 0.8", "max_num_seqs = 64", f"num_requests = {PREVIEW_REQUESTS + 100}",
                 'kv_cache_dtype = "int8"', "ttft_ms = 500.0"):
        assert line in toml
    assert 'name = "contiguous"' not in toml and 'name = "paged-int8"' not in toml

    (tmp_path / "preview").mkdir()
    cli(tmp_path / "preview", toml, "--quiet", "--out", "out", "--set", f"workload.num_requests={PREVIEW_REQUESTS}")
    assert_shows(at, json.loads((tmp_path / "preview/out/summary.json").read_text())["policies"])
    assert at.markdown[0].value.startswith(f"**Preview: the first {PREVIEW_REQUESTS}")

    at.button(key="kvsim.full_run_button").click().run()
    assert_clean(at)
    (tmp_path / "full").mkdir()
    cli(tmp_path / "full", toml, "--quiet", "--out", "out")
    summary = (tmp_path / "full/out/summary.json").read_bytes()
    assert_shows(at, json.loads(summary)["policies"])
    assert at.markdown[0].value.startswith(f"**Full run: all {PREVIEW_REQUESTS + 100}")
    _, result = at.session_state["kvsim.full_run"]
    assert result.files["summary.json"] == summary  # the download is the CLI's file, byte for byte
    assert result.files["requests.csv"] == (tmp_path / "full/out/requests.csv").read_bytes()
    assert {d.label for d in at.get("download_button")} == {"scenario TOML", "summary.json", "requests.csv",
                                                            "report.html"}
    root = Path(at.session_state["kvsim.upload_dir"]).parent  # everything the dashboard writes is under it
    assert root.parent == Path(tempfile.gettempdir()) and not list(root.glob("run-*"))  # runs cleaned up


def test_memory_page_is_kvsim_memory(tmp_path):
    at = open_app()
    widget(at, "selectbox", "hardware.tensor_parallel_size").set_value(2)
    widget(at, "selectbox", "policies.3.kv_cache_dtype").set_value("int4")
    widget(at, "checkbox", "workload.prefix").set_value(True)
    at.run()
    widget(at, "number_input", "workload.prefix.prefix_len").set_value(1024)
    at.switch_page("views/memory.py").run()
    assert_clean(at)
    assert [t.value for t in at.title] == ["Memory"]
    toml = downloaded_toml_from_state(at)
    (tmp_path / "m").mkdir()
    printed = cli(tmp_path / "m", toml, command="memory").stdout
    mem = kvsim.memory(kvsim.load_scenario(tmp_path / "m/scenario.toml"), seq_lens=figures(at)[2]["data"][0]["x"])
    assert mem["tensor_parallel_size"] == 2
    assert {c["kv_cache_dtype"] for c in mem["capacity"]} == {"auto", "fp8", "int4"}

    breakdown, per_token, sequences, prefix = figures(at)
    for i, cap in enumerate(mem["capacity"]):  # a bar per kv dtype (and activation reserve), named as the CLI heads it
        parts = [cap[k] for k in ("weights", "activations", "reserve", "kv")] + [cap["total"] - cap["budget"]]
        assert [t["y"][i] for t in breakdown["data"]] == [f"{cap['kv_cache_dtype']} ({', '.join(cap['policies'])})"] * 5
        assert [t["x"][i] for t in breakdown["data"]] == pytest.approx([x / 2**30 for x in parts])
    labels = [m.label for m in at.metric][:len(mem["capacity"])]  # KV tokens per GPU: one metric each, its own name
    assert labels == [f"{c['kv_cache_dtype']} ({', '.join(c['policies'])})" for c in mem["capacity"]]
    assert len(set(labels)) == len(labels) == 4  # auto twice: paged-chunked's smaller activations leave more KV
    assert per_token["data"][0]["y"] == pytest.approx([r["bytes_per_token"] / 1024 for r in mem["bytes_per_token"]])
    for trace in sequences["data"][:-1]:
        rows = [r for r in mem["sequences"] if r["policy"] == trace["name"]]
        assert trace["y"] == [r["num_seqs"] for r in rows] and trace["x"] == [r["seq_len"] for r in rows]
    p = mem["prefix"]
    assert p["prefix_len"] == 1024
    full, saved = p["flops_full"] / 1e12, p["flops_saved"] / 1e12
    assert prefix["data"][0]["y"] == pytest.approx([full, full - saved])
    # ... and `python -m kvsim memory` prints the same numbers
    for c in mem["capacity"]:
        assert f"{c['max_tokens']:,}" in printed and f"{c['bytes_per_block']:,}" in printed
        assert {m.value for m in at.metric} >= {f"{c['max_tokens']:,}"}
    for r in mem["sequences"]:
        if r["seq_len"] in (1024, 4096, 8192):
            assert f"({r['num_seqs']:,})" in printed
    assert f"{p['flops_saved'] / 1e12:,.2f} TFLOP per hit" in printed


def upload(at: AppTest, key: str, name: str, data: bytes) -> AppTest:
    return at.sidebar.file_uploader(key=key).set_value((name, data, "application/octet-stream")).run()


GOOD_TOML = b"""name = "mine"
[model]
name = "Qwen3-0.6B"
[engine]
max_model_len = 4096
[[policies]]
name = "paged"
[workload]
num_requests = 50
arrival = { process = "poisson", rate = 5.0 }
prompt_len = { dist = "fixed", value = 100 }
output_len = { dist = "fixed", value = 10 }
"""


def assert_waits_for_an_upload(at: AppTest) -> None:
    """Nothing uploaded yet is nothing wrong: a prompt for the file, not a red error line."""
    assert not at.exception and not at.error
    assert [i.value for i in at.info] == [("Upload a scenario TOML file (Advanced, in the sidebar), or start from a "
                                           "shipped scenario.")]


def test_every_page_waits_for_an_upload_without_an_error():
    at = open_app()
    at.sidebar.radio(key="kvsim.source").set_value("uploaded TOML").run()
    for page in ("views/whatif.py", "views/answer.py", "views/capacity.py", "views/memory.py", "views/disagg.py"):
        assert_waits_for_an_upload(at.switch_page(page).run())


@pytest.mark.parametrize("name, data, message", [
    ("bad.toml", GOOD_TOML.replace(b"max_model_len", b"max_model_lenn"),
     "bad.toml: engine.max_model_lenn: unknown key"),
    ("bad.toml", GOOD_TOML.replace(b"rate = 5.0", b"rate = -5.0"), "bad.toml: workload.arrival.rate:"),
    ("bad.toml", b"[model\nname = 1", "bad.toml: invalid TOML:"),
    ("bad.toml", b"\xff\xfe" + GOOD_TOML, "bad.toml:1: scenario file is not UTF-8 text"),
    ("bad.toml", GOOD_TOML.replace(b'"mine"', b'"mi\x00ne"'), "bad.toml:1: NUL byte: scenario file is not a text file"),
    ("big.toml", GOOD_TOML + b"#" * (300 << 10), "big.toml: scenario file is 307,"),
])
def test_bad_scenario_upload_is_one_error_line(name, data, message):
    at = open_app()
    at.sidebar.radio(key="kvsim.source").set_value("uploaded TOML").run()
    assert_waits_for_an_upload(at)
    upload(at, "kvsim.upload_toml", name, data)
    assert one_error(at).startswith(message)
    assert not at.get("plotly_chart")


def test_bad_model_config_and_settings_are_one_error_line():
    at = open_app()
    upload(at, "kvsim.upload_hf", "config.json", json.dumps({"num_attention_heads": 8}).encode())
    assert one_error(at) == "uploaded-model/config.json: missing key 'hidden_size'"
    at.sidebar.file_uploader(key="kvsim.upload_hf").set_value(None).run()
    assert_clean(at)
    widget(at, "selectbox", "policies.0.enable_prefix_caching").set_value(True).run()  # contiguous
    assert one_error(at) == "scenarios/chat.toml: policies[0]: prefix caching needs the paged allocator"
    widget(at, "selectbox", "policies.0.enable_prefix_caching").set_value(None)
    widget(at, "selectbox", "model.name").set_value("Llama-3.1-70B").run()
    message = one_error(at)
    assert message.startswith("scenarios/chat.toml: model Llama-3.1-70B (131.4 GiB of weights per GPU at TP 1) "
                              "does not fit on H100-SXM")
    at.switch_page("views/memory.py").run()  # the same line as `kvsim memory` and `kvsim run` print
    assert one_error(at) == message


def test_uploaded_scenario_trace_and_config_run_as_the_cli(tmp_path):
    hf = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4,
          "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096}
    at = open_app()
    at.sidebar.radio(key="kvsim.source").set_value("uploaded TOML").run()
    upload(at, "kvsim.upload_toml", "mine.toml", GOOD_TOML)
    upload(at, "kvsim.upload_trace", "trace.csv", (FIXTURES / "generic_small.csv").read_bytes())
    assert at.sidebar.selectbox(key="kvsim.trace_format").value == "csv"
    upload(at, "kvsim.upload_hf", "tiny.json", json.dumps(hf).encode())
    assert_clean(at)
    toml = downloaded_toml(at)
    assert 'path = "trace.csv"' in toml and 'hf_config = "tiny/config.json"' in toml and "/tmp" not in toml
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny/config.json").write_text(json.dumps(hf))
    (tmp_path / "trace.csv").write_bytes((FIXTURES / "generic_small.csv").read_bytes())
    cli(tmp_path, toml, "--quiet", "--out", "out")
    summaries = json.loads((tmp_path / "out/summary.json").read_text())["policies"]
    assert summaries["paged"]["requests"]["finished"] == 4  # the trace's rows, not num_requests
    assert_shows(at, summaries)


def test_help_is_the_fields_description_default_and_bounds(monkeypatch):
    info = EngineConfig.model_fields["max_num_seqs"]
    assert info.description
    assert fields.help_text("engine.max_num_seqs") == (f"{info.description}  \n"
                                                       "Default: unset (leave empty); range ≥ 1, ≤ 1,048,576.  \n"
                                                       "Scenario key `engine.max_num_seqs`.")
    monkeypatch.setattr(info, "description", None)  # a field without a description still explains itself
    assert fields.help_text("engine.max_num_seqs") == ("Default: unset (leave empty); range ≥ 1, ≤ 1,048,576.  \n"
                                                       "Scenario key `engine.max_num_seqs`.")
    assert fields.help_text("policies.3.kv_cache_dtype").endswith(
        '  \nDefault: "auto"; one of "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "int8", "int4".  \n'
        "Scenario key `policies.<name>.kv_cache_dtype`.")
    assert "Default: unset (leave empty); range ≥ 1, ≤ 16,777,216." in fields.help_text("engine.max_model_len")
    assert "Default: 0.9; range > 0, ≤ 1." in fields.help_text("hardware.gpu_memory_utilization")
    at = open_app()  # every settings widget explains itself
    for kind in ("number_input", "selectbox", "checkbox", "multiselect", "file_uploader", "radio"):
        for w in getattr(at.sidebar, kind):
            assert w.help or w.key == "kvsim.source", w.key
        for w in getattr(at.main, kind):  # the question: its help names the key
            if w.key and ":" in w.key:
                assert "Scenario key" in w.help or w.key.endswith("model.name"), w.key


def test_dashboard_command(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr("os.execv", lambda exe, argv: calls.append(argv))
    assert main(["dashboard", "--server.port", "8765", "--server.headless", "true"]) == 0
    assert calls == [[sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", "8765",
                      "--server.headless", "true", "--server.address", "127.0.0.1"]]  # this machine only
    assert main(["dashboard", "--server.address", "0.0.0.0"]) == 0  # the network, when asked for
    assert calls[-1][-2:] == ["--server.address", "0.0.0.0"]
    monkeypatch.setattr("kvsim.cli.DASHBOARD_APP", tmp_path / "app" / "Home.py")
    assert main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvsim: error: {tmp_path}/app/Home.py: dashboard not found")


def test_picking_a_moe_model_names_its_experts_and_dp_ep_are_scenario_keys():
    """The model picker's caption says what a preset is (experts, latent attention, windows); data
    parallelism and expert parallelism are keys under Advanced, as vLLM names them."""
    from kvdash.settings import model_traits

    from kvsim.scenario.catalog import MODELS

    assert model_traits(MODELS["Llama-3.1-8B"]) == ""
    assert model_traits(MODELS["DeepSeek-V3"]) == ("mixture of experts: 8 of 256 experts a token · latent attention "
                                                   "(MLA): 576 cached elements a token and layer")
    assert model_traits(MODELS["gpt-oss-20b"]).endswith("sliding window of 128 tokens on 12 of 24 layers")
    at = open_app()
    widget(at, "selectbox", "model.name").set_value("Qwen3-30B-A3B").run()
    assert_clean(at)
    assert any("8 of 128 experts a token" in c.value for c in at.main.caption)
    widget(at, "number_input", "hardware.data_parallel_size").set_value(2)
    widget(at, "checkbox", "hardware.enable_expert_parallel").set_value(True)
    at.run()
    assert_clean(at)
    toml = downloaded_toml(at)
    assert "data_parallel_size = 2" in toml and "enable_expert_parallel = true" in toml


def test_log_axes_are_labelled_in_whole_numbers_at_ticks_their_span_allows():
    """plotly's own log ticks label 200 and 500 as a bare '2' and '5': every log axis gets a number format,
    and ticks by the decades it spans (every digit under 0.7 of one, 1-2-5 up to 3, decades beyond);
    an axis with its own labels keeps them."""
    from kvdash.charts import LOG_TICKS, readable

    fig = {"data": [{"x": [1, 2], "y": [3.0, 2e5], "yaxis": "y2"}, {"x": [1, 2], "y": [0.5, 4.0]}],
           "layout": {"xaxis": {"type": "log", "range": [1, 1.5]}, "yaxis": {"type": "log"},
                      "yaxis2": {"type": "log"}, "xaxis2": {"type": "log", "ticktext": ["1k"], "tickvals": [1000]}}}
    out = readable(fig)["layout"]
    assert out["xaxis"] == {"type": "log", "range": [1, 1.5], "tickformat": LOG_TICKS, "dtick": "D1"}
    assert out["yaxis"]["dtick"] == "D2" and out["yaxis"]["tickformat"] == LOG_TICKS  # 0.5-4: 0.9 decades
    assert out["yaxis2"]["dtick"] == 1  # 3-200,000: 4.8 decades
    assert out["xaxis2"] == fig["layout"]["xaxis2"] and "tickformat" not in fig["layout"]["yaxis"]  # a copy


def test_offload_knobs_are_scenario_keys(tmp_path):
    """A scenario with a [kv_offload] section gets its knobs under Advanced (each a scenario key); one
    without has none. The run reads them: a smaller tier, ARC, the oracle's TTFT."""
    at = open_app()
    assert not [w for w in at.sidebar.number_input if w.key and w.key.endswith(":kv_offload.kv_offloading_size")]
    at.sidebar.selectbox(key="kvsim.shipped").set_value("offload_sizing").run()
    assert_clean(at)
    widget(at, "number_input", "kv_offload.kv_offloading_size").set_value(8.0)
    widget(at, "selectbox", "kv_offload.eviction_policy").set_value("arc")
    widget(at, "checkbox", "kv_offload.optimal_ttft").set_value(True)
    at.run()
    assert_clean(at)
    toml = downloaded_toml(at)
    assert "kv_offloading_size = 8.0" in toml and 'eviction_policy = "arc"' in toml and "optimal_ttft = true" in toml
