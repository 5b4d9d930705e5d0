"""Answers kept on disk (kvsim/planning/answer_cache.py): keyed by what decides them, read back into the
same records, never over a file already there; and a fresh dashboard server shows the Answer page from
them without planning."""

import json

import pytest
import streamlit as st

from kvsim.planning import answer_cache, capacity
from kvsim.planning import deploy as deploy_search
from kvsim.scenario.config import load_scenario, scenario_from_dict
from tests.test_dashboard import assert_clean, open_app
from tests.test_dashboard_answer import answer, small

TINY = ["workload.num_requests=200"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "answers"
    monkeypatch.setenv(answer_cache.CACHE_ENV, str(folder))
    return folder


def test_a_kept_plan_reads_back_as_the_same_answer_and_is_not_recomputed(cache, monkeypatch):
    sc = load_scenario("scenarios/chat.toml", TINY)
    settings = dict(policies=["paged"], seeds=1, resolution=0.1)
    first = answer_cache.plan(sc, workers=1, **settings)
    [kept] = list(cache.iterdir())
    assert kept.name.startswith("plan-") and json.loads(kept.read_text())["policies"][0]["policy"] == "paged"

    def no_search(*a, **k):
        raise AssertionError("planned again")

    monkeypatch.setattr(capacity, "plan", no_search)
    again = answer_cache.plan(sc, workers=1, **settings)
    assert again.policies == first.policies and again.meta == json.loads(json.dumps(first.meta))
    assert again.points == first.points
    # another setting, another scenario content, another input file or other code: another key
    key = answer_cache.answer_key(sc, "plan", {"seeds": 1})
    assert answer_cache.answer_key(sc, "plan", {"seeds": 2}) != key
    other = load_scenario("scenarios/chat.toml", TINY + ["slo.ttft_ms=1500"])
    assert answer_cache.answer_key(other, "plan", {"seeds": 1}) != key
    monkeypatch.setattr(answer_cache, "code_digest", lambda: "other code")
    assert answer_cache.answer_key(sc, "plan", {"seeds": 1}) != key


def test_a_trace_named_relative_or_absolute_is_one_input_and_its_bytes_key_the_answer(tmp_path):
    sc = load_scenario("scenarios/azure_conv.toml")
    data = sc.model_dump()
    data["workload"]["trace"]["path"] = str(sc.resolve(sc.workload.trace.path))  # as the dashboard names it
    absolute = scenario_from_dict(data, sc.source, sc.base_dir)
    assert answer_cache.answer_key(absolute, "plan", {}) == answer_cache.answer_key(sc, "plan", {})
    copy = tmp_path / "trace.csv"
    raw = sc.resolve(sc.workload.trace.path).read_bytes()
    copy.write_bytes(raw)
    data["workload"]["trace"]["path"] = str(copy)
    assert answer_cache.answer_key(scenario_from_dict(data, sc.source, sc.base_dir), "plan", {}) == \
        answer_cache.answer_key(sc, "plan", {})
    copy.write_bytes(raw + raw.splitlines(keepends=True)[-1])  # one row more: another input
    assert answer_cache.answer_key(scenario_from_dict(data, sc.source, sc.base_dir), "plan", {}) != \
        answer_cache.answer_key(sc, "plan", {})


def test_a_broken_file_is_recomputed_and_a_file_already_there_is_never_replaced(cache):
    sc = load_scenario("scenarios/chat.toml", TINY)
    settings = dict(policies=["paged"], seeds=1, resolution=0.1)
    key = answer_cache.answer_key(sc, "plan", settings)
    cache.mkdir()
    path = cache / f"plan-{key}.json"
    path.write_text("{not json")
    result = answer_cache.plan(sc, workers=1, **settings)
    assert result.policies[0].safe_rate > 0
    assert path.read_text() == "{not json"  # not kvsim's to replace; the answer is still given
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary left behind


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(answer_cache.CACHE_ENV, "off")
    assert answer_cache.cache_dir() is None
    monkeypatch.setenv(answer_cache.CACHE_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert answer_cache.cache_dir() == tmp_path / "kvsim" / "answers"


def test_a_fresh_dashboard_server_answers_from_disk_without_planning(cache, monkeypatch):
    at = answer(small(open_app()))
    assert_clean(at)
    cards = [m.value for m in at.main.markdown]
    assert {p.name.split("-")[0] for p in cache.iterdir()} == {"plan", "deploy"}
    st.cache_data.clear()  # a fresh server: nothing in memory
    st.cache_resource.clear()

    def no_search(*a, **k):
        raise AssertionError("searched again")

    monkeypatch.setattr(capacity, "plan", no_search)
    monkeypatch.setattr(deploy_search, "deploy", no_search)
    again = answer(small(open_app()))
    assert_clean(again)
    assert [m.value for m in again.main.markdown] == cards
    assert not again.get("progress")
