"""The Capacity page under AppTest: its maximum rates, intervals, curves, table and deployment search are
`kvsim plan`'s for the scenario file the dashboard offers (plan.json byte for byte), a search runs only
on its first visit or its button, and a model that does not fit is one error line that leaves the
deployment search usable."""

import csv
import io
import json
import shlex
import subprocess
import sys

import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

from tests.test_dashboard import ROOT, cli, downloaded_toml_from_state, figures, one_error, open_app, widget

FAST = {"kvsim.capacity.seeds": 2, "kvsim.capacity.resolution": 0.1, "kvsim.capacity.requests": 300}
FAST_CLI = ("--seeds", "2", "--resolution", "0.1", "--requests", "300")


@pytest.fixture
def downloads(monkeypatch) -> dict:
    """url -> bytes of every file the app offers (AppTest keeps them only during a run)."""
    kept = {}

    class Kept(MemoryMediaFileStorage):
        def load_and_get_id(self, data, mimetype, kind, filename=None):
            file_id = super().load_and_get_id(data, mimetype, kind, filename)
            kept[self.get_url(file_id)] = self.get_file(file_id).content
            return file_id

    monkeypatch.setattr("streamlit.testing.v1.app_test.MemoryMediaFileStorage", Kept)
    return kept


def offered(at, downloads: dict, name: str, index: int = 0) -> bytes:
    [url] = [d.proto.url for d in at.get("download_button") if d.proto.label == name][index:index + 1]
    return downloads[url]


def capacity_page(sidebar: dict | None = None):
    """The app on the Capacity page, with FAST search settings and sidebar widgets set first."""
    at = open_app()
    for (kind, key), value in (sidebar or {}).items():
        widget(at, kind, key).set_value(value)
    for key, value in FAST.items():
        at.session_state[key] = value
    return at.switch_page("views/capacity.py").run()


def test_capacity_page_is_kvsim_plan(tmp_path, downloads):
    at = open_app()
    widget(at, "multiselect", "policies").set_value(["paged", "paged-fp8"])
    widget(at, "number_input", "engine.max_num_seqs").set_value(128)
    for key, value in FAST.items():
        at.session_state[key] = value
    at.switch_page("views/capacity.py").run()  # the first visit searches with the page's settings
    assert not at.exception and not at.error
    assert [t.value for t in at.title] == ["Capacity"]
    shown = next(c.value for c in at.caption if c.value.startswith("Same numbers"))
    assert shown.split("`")[1] == ("python -m kvsim plan scenarios/chat.toml --set engine.max_num_seqs=128 --policy paged "
                                   "--policy paged-fp8 --seeds 2 --resolution 0.1 --requests 300 --out DIR")
    cli(tmp_path, downloaded_toml_from_state(at), *FAST_CLI, "--quiet", "--out", "out", command="plan")
    plan_json = (tmp_path / "out/plan.json").read_bytes()
    assert offered(at, downloads, "plan.json") == plan_json  # the download is the CLI's file
    assert offered(at, downloads, "plan.csv") == (tmp_path / "out/plan.csv").read_bytes()
    plan = json.loads(plan_json)
    ps = {p["policy"]: p for p in plan["policies"]}
    assert list(ps) == ["paged", "paged-fp8"]

    bars, ttft, tpot = figures(at)
    bar, knee, line = bars["data"]
    assert bar["x"] == knee["x"] == list(ps)
    assert bar["y"] == [ps[p]["safe_rate"] for p in ps]  # the headline: the safe rate
    assert knee["y"] == [ps[p]["mean_rate"] for p in ps]  # beside it, the knee's mean and interval
    assert knee["error_y"]["array"] == pytest.approx([ps[p]["ci_high"] - ps[p]["mean_rate"] for p in ps], rel=1e-12)
    assert knee["error_y"]["arrayminus"] == pytest.approx([ps[p]["mean_rate"] - ps[p]["ci_low"] for p in ps], rel=1e-12)
    assert line["y"] == [plan["meta"]["scenario_rate"]] * 2 == [14.0, 14.0]
    points = list(csv.DictReader(io.StringIO((tmp_path / "out/points.csv").read_text())))
    for fig, column, bound in ((ttft, "ttft_ms_at_pct", 2000), (tpot, "tpot_ms_at_pct", 60)):
        for trace in fig["data"][:2]:
            mine = [p for p in points if p["policy"] == trace["name"] and p["phase"] in ("search", "safe_check")]
            assert trace["x"] == sorted({float(p["rate"]) for p in mine})
            star = trace["marker"]["symbol"].index("star")  # the safe rate, at its mean SLO figure
            assert trace["x"][star] == ps[trace["name"]]["safe_rate"]
            assert trace["y"][star] == pytest.approx(ps[trace["name"]]["at_safe_rate"][column], rel=1e-12)
            assert trace["line"]["color"] == {"paged": "#636EFA", "paged-fp8": "#AB63FA"}[trace["name"]]
        assert fig["data"][2]["y"] == [bound, bound]  # the SLO bound as a line
    table = at.dataframe[0].value
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out/plan.csv").read_text())))
    assert list(table["policy"]) == [r["policy"] for r in rows]
    for (_, shown), row in zip(table.iterrows(), rows):
        assert shown["safe req/s"] == float(row["safe_rate"])
        assert shown["knee (95% CI)"] == f"{float(row['mean_rate']):.3g} ({float(row['ci_low']):.3g}–{float(row['ci_high']):.3g})"
        assert shown["headroom"] == pytest.approx(float(row["headroom"]) * 100, rel=1e-12)
        assert shown["binds"] == row["binding"]
        assert shown["TTFT p99 ms"] == pytest.approx(float(row["at_safe_worst_ttft_ms_at_pct"]), rel=1e-12)
        assert shown["TTFT p99 ms"] <= 2000 and shown["TPOT p99 ms"] <= 60
        assert shown["at 14/s"] == ("✓" if row["sustainable_at_scenario_rate"] == "True" else "✗")

    # a settings change does not search: the page says so, and going back shows the cached plan again
    widget(at, "number_input", "engine.max_num_seqs").set_value(64).run()
    assert [i.value for i in at.info][0].startswith("No search of these settings yet")
    assert not figures(at)
    widget(at, "number_input", "engine.max_num_seqs").set_value(128).run()
    assert figures(at)[0] == bars


def keyed(at, kind: str, prefix: str):
    """The one widget whose key starts with `prefix` (keys tied to the scenario end in its digest)."""
    [found] = [w for w in getattr(at, kind) if w.key and w.key.startswith(prefix)]
    return found


def test_the_capacity_page_opens_on_kvsim_plans_own_settings(tmp_path, downloads):
    at = open_app()
    widget(at, "multiselect", "policies").set_value(["paged"])
    widget(at, "number_input", "workload.num_requests").set_value(300)
    at.switch_page("views/capacity.py").run()  # no search settings given: kvsim plan's defaults
    assert not at.exception and not at.error
    shown = next(c.value for c in at.caption if c.value.startswith("Same numbers"))
    assert shown.split("`")[1] == ("python -m kvsim plan scenarios/chat.toml --set workload.num_requests=300 "
                                   "--policy paged --out DIR")
    cli(tmp_path, downloaded_toml_from_state(at), "--quiet", "--out", "out", command="plan")
    assert offered(at, downloads, "plan.json") == (tmp_path / "out/plan.json").read_bytes()
    assert keyed(at, "number_input", "kvsim.capacity.target_rate").value == 14.0  # the scenario's own rate


def test_deployment_search_is_kvsim_plan_target_rate(tmp_path, downloads):
    at = capacity_page()
    keyed(at, "number_input", "kvsim.capacity.target_rate").set_value(20.0)
    at.selectbox(key="kvsim.capacity.policy").set_value("paged-fp8")
    at.multiselect(key="kvsim.capacity.gpus").set_value(["H100-SXM", "A100-80GB"])
    at.multiselect(key="kvsim.capacity.tps").set_value([2, 1])
    [submit] = [b for b in at.button if b.label == "Search deployments"]
    submit.click().run()
    assert not at.exception and not at.error
    shown = next(c.value for c in at.caption if c.value.startswith("Same numbers") and "--target-rate" in c.value)
    command = shown.split("`")[1]  # the command the page gives, run as it says
    assert command == ("python -m kvsim plan scenarios/chat.toml --target-rate 20 --policy paged-fp8 --gpu A100-80GB "
                       "--gpu H100-SXM --tp 1 --tp 2 --seeds 2 --resolution 0.1 --requests 300 --out DIR")
    subprocess.run([sys.executable, *shlex.split(command.replace("DIR", str(tmp_path / "out")))[1:], "--quiet"],
                   cwd=ROOT, check=True, capture_output=True)
    plan_json = (tmp_path / "out/plan.json").read_bytes()
    assert offered(at, downloads, "plan.json", index=1) == plan_json
    deployments = json.loads(plan_json)["deployments"]
    table = next(d.value for d in at.dataframe if "$/hour" in d.value.columns)
    assert list(table["GPU"]) == [d["gpu"] for d in deployments]
    assert list(table["TP × replicas"]) == [f"{d['tensor_parallel_size']} × {d['num_replicas']}" for d in deployments]
    assert list(table["$/hour"]) == [d["usd_per_hour"] for d in deployments]
    assert list(table["$/M output"]) == [d["usd_per_m_output"] for d in deployments]
    assert list(table["$/M input"]) == [d["usd_per_m_input"] for d in deployments]
    assert list(table["policy"]) == [d["policy"] for d in deployments] == ["paged-fp8"] * len(deployments)
    assert list(table["safe req/s"]) == [f"{d['safe_rate']:.3g}" for d in deployments]
    assert all(d["meets_target"] and d["safe_rate"] >= 20 for d in deployments)
    assert figures(at)[-1]["data"][0]["x"] == [d["usd_per_m_output"] for d in deployments]


def test_a_model_that_does_not_fit_is_one_line_and_the_deployment_search_still_offered():
    at = capacity_page({("selectbox", "model.name"): "Llama-3.1-70B"})
    message = one_error(at)
    assert not at.get("progress")  # no bar left behind by the failed search
    assert message.startswith("scenarios/chat.toml: model Llama-3.1-70B (131.4 GiB of weights per GPU at TP 1) "
                              "does not fit on H100-SXM")
    at.multiselect(key="kvsim.capacity.gpus").set_value([])
    [submit] = [b for b in at.button if b.label == "Search deployments"]
    submit.click().run()  # the rate search's line stays, and the deployment search says what is missing
    assert [e.value for e in at.error] == [message, "deployment search: choose at least one candidate GPU and one "
                                                    "TP degree"]
