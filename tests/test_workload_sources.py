"""Request lengths from the datasets users bring: a ShareGPT-style JSON (sampled as `vllm bench serve
--dataset-name sharegpt` does), a `vllm bench serve --save-detailed` JSON, and their own CSV logs
with a column mapping; each checked against lengths computed by hand from the small fixtures, and
bad input as one line naming the file, the key and the line (or entry)."""

import json
import math
import shutil

import pytest

from conftest import make_scenario
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.scenario.traces import load_trace
from kvsim.scenario.workload import generate_requests

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def with_trace(tmp_path, trace: dict, arrival=None, num_requests=None):
    """A scenario replaying lengths (and, with arrival=None, times) from `trace`, copied beside it."""
    shutil.copy(FIXTURES / trace["path"], tmp_path / trace["path"])
    sc = make_scenario(workload={"seed": 3, "num_requests": num_requests,
                                 "arrival": arrival or {"process": "trace"},
                                 "prompt_len": {"dist": "trace"}, "output_len": {"dist": "trace"}, "trace": trace})
    sc._base_dir = tmp_path
    return sc


def tokens(text: str, per: float = 4.0) -> int:
    return max(1, math.ceil(len(text.encode("utf-8")) / per))


def test_sharegpt_first_two_turns_estimated_and_filtered_as_vllm_bench(tmp_path):
    convs = json.loads((FIXTURES / "sharegpt_small.json").read_text())
    want = []
    for c in convs:
        turns = c["conversations"]
        if len(turns) < 2:
            continue  # one turn: no output to replay
        p, o = tokens(turns[0]["value"]), tokens(turns[1]["value"])
        if p >= 4 and o >= 4 and p <= 1024 and p + o <= 2048:
            want.append((p, o))
    assert want == [(14, 13), (15, 12)]  # "ok" (1 token) is under vllm bench's 4; the CJK turn is 60 bytes
    sc = with_trace(tmp_path, {"format": "sharegpt", "path": "sharegpt_small.json"},
                    arrival={"process": "poisson", "rate": 2.0}, num_requests=5)
    t = load_trace(sc)
    assert list(zip(t.prompt_len.tolist(), t.output_len.tolist())) == want
    reqs = list(generate_requests(sc))
    assert [(r.prompt_len, r.output_len) for r in reqs] == [want[i % 2] for i in range(5)]  # rows cycle
    sc2 = with_trace(tmp_path, {"format": "sharegpt", "path": "sharegpt_small.json", "bytes_per_token": 2.0},
                     arrival={"process": "poisson", "rate": 2.0}, num_requests=2)
    assert load_trace(sc2).prompt_len.tolist()[0] == tokens(convs[0]["conversations"][0]["value"], 2.0) == 27


def test_vllm_bench_json_lengths(tmp_path):
    sc = with_trace(tmp_path, {"format": "vllm_bench", "path": "vllm_bench_small.json"},
                    arrival={"process": "deterministic", "rate": 4.0})
    reqs = list(generate_requests(sc))  # no count: one pass over the file
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(120, 30), (340, 7), (56, 128)]
    assert [r.arrival_time for r in reqs] == pytest.approx([0.25, 0.5, 0.75])


def test_own_csv_log_with_a_column_mapping(tmp_path):
    columns = {"arrival": "time_ms", "arrival_unit": "ms", "prompt_tokens": "tokens_in", "output_tokens": "tokens_out"}
    sc = with_trace(tmp_path, {"format": "csv", "path": "log_mapped.csv", "columns": columns})
    reqs = list(generate_requests(sc))  # rows sorted by time (stably), the first at 0
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        (0.0, 200, 20), (0.5, 400, 40), (1.0, 100, 10), (1.0, 300, 30)]
    lengths_only = {k: v for k, v in columns.items() if not k.startswith("arrival")}
    sc = with_trace(tmp_path, {"format": "csv", "path": "log_mapped.csv", "columns": lengths_only},
                    arrival={"process": "deterministic", "rate": 10.0})
    assert [(r.prompt_len, r.output_len) for r in generate_requests(sc)] == [(100, 10), (200, 20), (300, 30),
                                                                            (400, 40)]  # file order
    (tmp_path / "dated.csv").write_text("when,in,out\n2024-05-01 12:00:01.5,10,2\n2024-05-01T12:00:00,20,3\n")
    dated = {"arrival": "when", "arrival_unit": "datetime", "prompt_tokens": "in", "output_tokens": "out"}
    sc = make_scenario(workload={"arrival": {"process": "trace"}, "prompt_len": {"dist": "trace"},
                                 "output_len": {"dist": "trace"},
                                 "trace": {"format": "csv", "path": "dated.csv", "columns": dated}})
    sc._base_dir = tmp_path
    assert [(r.arrival_time, r.prompt_len) for r in generate_requests(sc)] == [(0.0, 20), (1.5, 10)]


@pytest.mark.parametrize("trace, arrival, message", [
    ({"format": "csv", "path": "log_mapped.csv",
      "columns": {"arrival": "time_ms", "prompt_tokens": "prompt", "output_tokens": "tokens_out"}}, None,
     "log_mapped.csv:1: missing column 'prompt' in header (workload.trace.columns.prompt_tokens)"),
    ({"format": "sharegpt", "path": "sharegpt_small.json"}, None,
     "workload: arrival.process: the sharegpt trace has no arrival times: use poisson, gamma or deterministic"),
    ({"format": "csv", "path": "log_mapped.csv", "columns": {"prompt_tokens": "tokens_in",
                                                            "output_tokens": "tokens_out"}}, None,
     "workload: arrival.process: the csv trace has no arrival times"),
    ({"format": "azure", "path": "log_mapped.csv", "columns": {"prompt_tokens": "a", "output_tokens": "b"}}, None,
     'workload.trace: columns: only for format "csv", not \'azure\''),
])
def test_bad_mappings_are_one_line_naming_the_key(tmp_path, capsys, trace, arrival, message):
    shutil.copy(FIXTURES / trace["path"], tmp_path / trace["path"])
    table = ", ".join(f"{k} = {json.dumps(v) if not isinstance(v, dict) else _inline(v)}" for k, v in trace.items())
    (tmp_path / "s.toml").write_text(f'[model]\nname = "Llama-3.1-8B"\n[[policies]]\nname = "p"\n[workload]\n'
                                     f'arrival = {{ process = "trace" }}\nprompt_len = {{ dist = "trace" }}\n'
                                     f'output_len = {{ dist = "trace" }}\ntrace = {{ {table} }}\n')
    assert main([str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def _inline(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


@pytest.mark.parametrize("text, message", [
    ('[{"conversations": [{"from": "human", "value": "hello there friend"}, {"from": "gpt"}]}]',
     "bad.json: conversation 0: a turn without a string \"value\""),
    ('[{"conversations": [{"from": "human", "value": "hello there friend"}, {"from": "gpt", "value": "fine thanks"}]}, 7]',
     "bad.json: conversation 1: expected an object with a \"conversations\" list"),
    ('[{"conversations": []}, {"conversations": [', "bad.json: bad JSON after conversation 0:"),
    ('{"conversations": []}', "bad.json: expected a JSON list of conversations, found none"),
])
def test_bad_sharegpt_is_one_line_naming_the_entry(tmp_path, text, message):
    (tmp_path / "bad.json").write_text(text)
    sc = make_scenario(workload={"num_requests": 2, "arrival": {"process": "poisson", "rate": 1.0},
                                 "prompt_len": {"dist": "trace"}, "output_len": {"dist": "trace"},
                                 "trace": {"format": "sharegpt", "path": "bad.json"}})
    sc._base_dir = tmp_path
    with pytest.raises(KvsimError) as err:
        load_trace(sc)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_vllm_bench_is_one_line(tmp_path):
    (tmp_path / "b.json").write_text('{"input_lens": [10, 20], "output_lens": [5]}')
    sc = make_scenario(workload={"num_requests": 2, "arrival": {"process": "poisson", "rate": 1.0},
                                 "prompt_len": {"dist": "trace"}, "output_len": {"dist": "trace"},
                                 "trace": {"format": "vllm_bench", "path": "b.json"}})
    sc._base_dir = tmp_path
    with pytest.raises(KvsimError, match=r"b\.json: input_lens has 2 requests, output_lens 1$"):
        load_trace(sc)
    (tmp_path / "b.json").write_text('{"input_lens": [10, -2], "output_lens": [5, 6]}')
    with pytest.raises(KvsimError, match=r"b\.json:1: input_lens\[1\] must be positive: -2"):
        load_trace(sc)
