"""The Answer page (the dashboard's first screen) under AppTest: its cards are `kvsim plan`'s numbers
for the scenario file the dashboard offers, its target-rate line is `kvsim plan --target-rate`'s, a
model that does not fit shows where the memory goes and buttons to the layouts that fit best, a
setting vLLM would not run is the one fix the library names, every $ counts every GPU and says at
which rate it is priced, the target follows the question's rate; and the fixes around it: a trace's own rate
as the default target, an uploaded scenario without its trace, "Run all" on a model that does not
fit, captions and downloads that follow the settings."""

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.test_dashboard import (FIXTURES, GOOD_TOML, ROOT, assert_clean, cli, downloaded_toml,
                                  downloaded_toml_from_state, figures, one_error, open_app, upload, widget)
from tests.test_dashboard_capacity import keyed

from kvsim.planning.points import base_rate


def small(at):
    """Two policies on 300 requests: a plan of a few seconds."""
    widget(at, "multiselect", "policies").set_value(["paged", "paged-fp8"])
    widget(at, "number_input", "workload.num_requests").set_value(300)
    return at


def answer(at):
    return at.switch_page("views/answer.py").run()


def card_text(at, policy: str) -> str:
    """The markdown of one policy's card, joined."""
    texts = [m.value for m in at.main.markdown]
    start = next(i for i, t in enumerate(texts) if t.endswith(f"**{policy}**") or t.endswith(f"★ {policy}**"))
    return "\n".join(texts[start:start + 3])


def test_the_cards_are_kvsim_plan_and_the_target_line_kvsim_plan_target_rate(tmp_path):
    at = answer(small(open_app()))
    assert_clean(at)
    assert [t.value for t in at.title] == ["Answer"]
    plan_cmd = next(c.value for c in at.caption if "Safe: every one of" in c.value).split("`")[1]
    assert plan_cmd == "python -m kvsim plan scenarios/chat.toml --set workload.num_requests=300 --policy paged " \
                       "--policy paged-fp8"
    cli(tmp_path, downloaded_toml_from_state(at), "--quiet", "--out", "out", command="plan")
    plan = json.loads((tmp_path / "out/plan.json").read_text())
    best = max(plan["policies"], key=lambda p: p["safe_rate"])["policy"]
    for p in plan["policies"]:
        text = card_text(at, p["policy"])
        assert f"safe up to **{p['safe_rate']:.3g} req/s** ({p['headroom']:+.0%})" in text
        assert ("✓ meets the SLO at 14 req/s" if p["sustainable_at_scenario_rate"] else "✗ misses") in text
        assert f"knee {p['mean_rate']:.3g} (95% CI {p['ci_low']:.3g}–{p['ci_high']:.3g})" in text
        assert f"binds: **{p['binding']}**" in text and "**$2.99/hour**" in text  # one H100 at its list price
        assert ("★" in text) == (p["policy"] == best)
        iv = p["safe_rate_interval"]  # where the real safe rate would fall (kvsim.results.intervals)
        assert iv and f"on real runs like this {iv['low']:.3g}–{iv['high']:.3g} req/s ({iv['text']})" in text
    notes = [c.value for c in at.caption if c.value.startswith("Measured: ")]  # each card's provenance
    assert len(notes) == len(plan["policies"]) and all("vLLM 0.24.0 kernels timed on H100-SXM" in n for n in notes)
    # the target rate: the scenario's own by default, with the best policy; the line is the CLI's cheapest
    assert keyed(at, "number_input", "kvsim.answer.target").value == 14.0
    assert keyed(at, "selectbox", "kvsim.answer.policy").value == best
    command = next(c.value for c in at.caption if "--target-rate" in c.value).split("`")[1]
    assert command.endswith(f"--target-rate 14 --policy {best} --gpu H100-SXM --top 1 --no-headroom")
    subprocess.run([sys.executable, *shlex.split(command)[1:], "--quiet", "--out", str(tmp_path / "deploy")],
                   cwd=ROOT, check=True, capture_output=True)
    d = json.loads((tmp_path / "deploy/plan.json").read_text())["deployments"][0]
    [shown] = [s.value for s in at.success]
    assert shown.endswith("Measured: vLLM 0.24.0 kernels timed on H100-SXM (NVIDIA AIConfigurator) plus server "
                          "terms fitted to real vLLM serving runs on H100-SXM")
    assert shown.startswith(f"**{d['num_gpus']} × H100-SXM as TP {d['tensor_parallel_size']} × {d['num_replicas']} "
                            f"replica{'s' if d['num_replicas'] > 1 else ''}, ${d['usd_per_hour']:,.2f}/h (policy {best})**")
    keyed(at, "number_input", "kvsim.answer.target").set_value(60.0).run()  # a target one GPU cannot serve
    [more] = [s.value for s in at.success]
    gpus = int(re.match(r"\*\*(\d+) ×", more).group(1))
    assert gpus > d["num_gpus"]


def test_a_model_that_does_not_fit_shows_its_memory_and_the_layouts_that_fit_best():
    """Llama-3.1-70B on one H100: one GPU of MI300X or B200 holds it, before two H100s (or two A100s: as
    much memory and slower); the chart stacks what the GPU holds against its memory and the budget."""
    at = small(open_app())
    widget(at, "selectbox", "model.name").set_value("Llama-3.1-70B")
    answer(at)
    assert one_error(at).startswith("scenarios/chat.toml: model Llama-3.1-70B (131.4 GiB of weights per GPU at TP 1) "
                                    "does not fit on H100-SXM")
    assert [b.label for b in at.button if b.key.startswith("kvsim.answer.fix")] == [
        "Use 1 × MI300X (TP 1), $2.49/h", "Use 1 × B200 (TP 1), $5.99/h", "Use 2 × H100-SXM (TP 2), $5.98/h"]
    [chart] = figures(at)
    bars = {t["name"]: t["x"] for t in chart["data"]}
    assert bars["weights"][0] == pytest.approx(131.4, abs=0.05) and bars["KV cache"] == [0.0, 0.0]  # never negative
    assert all(x >= 0 for xs in bars.values() for x in xs)
    lines = {s["name"].split(":")[0]: s["x0"] for s in chart["layout"]["shapes"]}
    assert lines["GPU memory"] == pytest.approx(85017493504 / 2**30)  # what CUDA reports on an H100
    assert lines["budget at gpu_memory_utilization"] == pytest.approx(0.9 * 85017493504 / 2**30)
    assert chart["layout"]["title"]["text"].endswith("GiB over the budget")
    at.button(key="kvsim.answer.fix_0").click().run()
    assert_clean(at)
    assert widget(at, "selectbox", "hardware.gpu").value == "MI300X"
    assert widget(at, "selectbox", "hardware.tensor_parallel_size").value == 1
    assert "/hour** for 1 × MI300X" in card_text(at, "paged")  # now it answers (estimated: no MI300X kernel table)


def test_deepseek_on_h200_gets_the_one_fix_the_library_names():
    """DeepSeek-V3 picked on H200 (chat.toml's block size 16): kvsim run's line names the block size
    vLLM uses for MLA there, so the page offers that and nothing about memory, at TP 1 as at TP 8; the
    Memory page says the same (its figures already use 64). The button sets it."""
    at = small(open_app())
    widget(at, "selectbox", "model.name").set_value("DeepSeek-V3")
    widget(at, "selectbox", "hardware.gpu").set_value("H200")
    answer(at)
    line = ("scenarios/chat.toml: vLLM v0.11.0 runs DeepSeek-V3's latent attention (MLA) with block_size 64 on H200: "
            "set engine.block_size = 64")
    assert one_error(at) == line
    assert [b.label for b in at.button] == ["Set engine.block_size = 64"] and not at.get("plotly_chart")
    widget(at, "selectbox", "hardware.tensor_parallel_size").set_value(8).run()
    assert one_error(at) == line and [b.label for b in at.button] == ["Set engine.block_size = 64"]
    at.switch_page("views/memory.py").run()
    assert not at.error and [w.value for w in at.warning] == [
        line + ". The memory figures here use it already; runs and plans need it set."]
    at.button(key="kvsim.memory_setting.fix_0").click().run()
    assert_clean(at) and not at.warning
    assert widget(at, "selectbox", "engine.block_size").value == 64
    assert "block_size = 64" in downloaded_toml_from_state(at)


def test_a_data_parallel_layout_is_priced_for_every_gpu_at_the_rate_it_says():
    """Two data-parallel ranks of one H100 each are $5.98/h, each card's $/M at its safe rate and the
    target line's at the target, each saying which; the page names the layout with its DP (and EP:
    scenarios/moe.toml's DP 2 + EP on two H100s)."""
    at = small(open_app())
    widget(at, "number_input", "hardware.data_parallel_size").set_value(2)
    answer(at)
    assert_clean(at)
    assert any(c.value.startswith("Llama-3.1-8B on 2 × H100-SXM as TP 1 × DP 2 × 1 replica · ") for c in at.caption)
    for policy in ("paged", "paged-fp8"):
        text = card_text(at, policy)
        safe = float(re.search(r"safe up to \*\*([\d.]+) req/s", text).group(1))
        money = re.search(r"\*\*\$([\d.]+)/hour\*\* for 2 × H100-SXM · \$([\d.]+) per M output tokens at "
                          r"([\d.]+) req/s", text)
        assert money, text
        assert float(money.group(1)) == 5.98 and float(money.group(3)) == safe
        [target] = [s.value for s in at.success]
        line = re.search(r"\$([\d.]+)/h \(policy [\w-]+\)\*\*  \n\$([\d.]+) per M output tokens at 14 req/s", target)
        assert line, target
        # both are $/hour over the output tokens of an hour: one mean output length behind the two
        tokens = float(line.group(1)) * 1e6 / (14 * 3600 * float(line.group(2)))
        assert float(money.group(2)) == pytest.approx(5.98 * 1e6 / (safe * 3600 * tokens), rel=0.01)
    at.sidebar.selectbox(key="kvsim.shipped").set_value("moe")
    at.switch_page("views/memory.py").run()
    assert_clean(at)
    assert any(c.value.startswith("Qwen3-30B-A3B on 2 × H100-SXM as TP 1 × DP 2 + EP × 1 replica, max_model_len")
               for c in at.caption)


def asks_for_a_search(at) -> bool:
    return any("Search the safe rates" in i.value for i in at.info)


def test_the_target_follows_the_questions_rate_and_capacity_shows_a_plan_it_has():
    """The arrival rate changed from 14 to 15: the target rate is 15 (the command no longer says
    `--set workload.arrival.rate=15.0 --target-rate 14`), and Capacity shows the Answer page's plan of
    15 req/s without a button press."""
    at = answer(small(open_app()))
    at.switch_page("views/capacity.py").run()  # the first visit: the Answer page's plan of 14 req/s
    assert not asks_for_a_search(at) and keyed(at, "number_input", "kvsim.capacity.target_rate").value == 14.0
    answer(at)
    widget(at, "number_input", "workload.arrival.rate").set_value(15.0).run()  # on the Answer page: its widgets stay
    assert_clean(at)
    assert keyed(at, "number_input", "kvsim.answer.target").value == 15.0
    command = next(c.value for c in at.caption if "--target-rate" in c.value).split("`")[1]
    assert "--set workload.arrival.rate=15.0" in command and "--target-rate 15 " in command
    at.switch_page("views/capacity.py").run()
    assert not asks_for_a_search(at) and not at.error and not at.get("progress")
    assert "--set workload.arrival.rate=15.0" in next(c.value for c in at.caption if c.value.startswith("Same numbers"))
    assert keyed(at, "number_input", "kvsim.capacity.target_rate").value == 15.0


def test_a_traces_own_rate_is_the_default_target_and_an_uploaded_trace_scenario_asks_for_its_trace():
    at = open_app()
    at.sidebar.radio(key="kvsim.source").set_value("uploaded TOML").run()
    with_trace = GOOD_TOML.replace(b'arrival = { process = "poisson", rate = 5.0 }',
                                   b'arrival = { process = "trace" }\ntrace = { format = "csv", path = "mine.csv" }')
    upload(at, "kvsim.upload_toml", "mine.toml", with_trace)
    assert one_error(at) == ("mine.toml: workload.trace.path names mine.csv: upload the trace too (Upload a trace or "
                             "a model config, in the sidebar)")
    upload(at, "kvsim.upload_trace", "mine.csv", (FIXTURES / "generic_small.csv").read_bytes())
    answer(at)
    assert_clean(at)
    scenario = at.session_state["kvsim.current"].scenario
    assert keyed(at, "number_input", "kvsim.answer.target").value == float(f"{base_rate(scenario):.4g}") == 3.0
    assert widget(at, "number_input", "workload.arrival.time_scale").value == 1.0  # the question's rate, for a trace


def test_run_all_on_a_model_that_does_not_fit_is_its_error_and_captions_follow_the_settings():
    at = open_app()
    widget(at, "selectbox", "model.name").set_value("Llama-3.1-70B").run()
    message = one_error(at)
    assert "does not fit on H100-SXM" in message
    assert not [b for b in at.button if b.key == "kvsim.full_run_button"] and not at.get("progress")
    widget(at, "selectbox", "model.name").set_value("Qwen3-8B")
    widget(at, "selectbox", "hardware.gpu").set_value("A100-80GB").run()
    assert_clean(at)
    assert at.caption[0].value.startswith("Qwen3-8B on 1 × A100-80GB as TP 1 × 1 replica")
    toml = downloaded_toml(at)
    assert 'description = "Qwen3-8B on 1 × A100-80GB as TP 1 × 1 replica (from chat.toml, changed in the dashboard)"' \
        in toml and "Llama-3.1-8B" not in toml


def test_a_closed_loop_is_answered_in_clients_and_the_req_s_they_get(tmp_path):
    """scenarios/closed_loop.toml: the question's load is its clients; each card gives the safe
    concurrency of `kvsim plan` and the requests/s there; the target rate defaults to what the best
    policy's safe clients get, planned as the open loop of the same requests."""
    at = open_app()
    at.sidebar.selectbox(key="kvsim.shipped").set_value("closed_loop").run()
    widget(at, "multiselect", "policies").set_value(["paged", "paged-fp8"])
    widget(at, "number_input", "workload.num_requests").set_value(300)
    assert widget(at, "number_input", "workload.max_concurrency").value == 64
    at = answer(at)
    assert_clean(at)
    cli(tmp_path, downloaded_toml_from_state(at), "--quiet", "--out", "out", command="plan")
    plan = json.loads((tmp_path / "out/plan.json").read_text())
    assert plan["meta"]["load_unit"] == "clients"
    for p in plan["policies"]:
        text = card_text(at, p["policy"])
        assert "at 64 clients" in text
        rps = p["at_safe_rate"]["throughput_rps"]
        assert f"safe up to **{p['safe_rate']:.3g} clients**, {rps:.3g} req/s ({p['headroom']:+.0%})" in text
    best = max(plan["policies"], key=lambda p: (p["safe_rate"], p["mean_rate"]))
    assert keyed(at, "number_input", "kvsim.answer.target").value == float(f"{best['at_safe_rate']['throughput_rps']:.4g}")
