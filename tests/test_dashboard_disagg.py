"""The Disaggregation page under AppTest: aggregated or disaggregated at a target rate, and which
prefill:decode ratio, is `kvsim plan --target-rate R --disaggregated`'s answer for the scenario file
the dashboard offers, its table the one the command prints (every column, headed and rounded as
there), with a chart of the options' cost and their latencies at the SLO's percentile."""

import json
import os
import shlex
import subprocess
import sys

from tests.test_dashboard import ROOT, assert_clean, downloaded_toml_from_state, open_app
from tests.test_dashboard_answer import small
from tests.test_dashboard_capacity import keyed


def test_the_page_answers_as_kvsim_plan_disaggregated(tmp_path):
    at = small(open_app()).switch_page("views/disagg.py").run()
    assert_clean(at)
    assert [t.value for t in at.title] == ["Disaggregation"]
    assert keyed(at, "number_input", "kvsim.pd.target").value == 14.0  # the scenario's own rate
    [shown] = [s.value for s in at.success]
    assert len(at.get("plotly_chart")) == 1
    command = next(c.value for c in at.caption if "--disaggregated" in c.value).split("`")[1]
    args = shlex.split(command)[1:]
    assert args[:4] == ["-m", "kvsim", "plan", "scenarios/chat.toml"]
    toml = tmp_path / "chat.toml"
    toml.write_text(downloaded_toml_from_state(at))
    printed = subprocess.run([sys.executable, "-m", "kvsim", "plan", str(toml), *args[4:], "--out", str(tmp_path / "o")],
                             cwd=ROOT, check=True, capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "400"}).stdout  # no cell wrapped
    plan = json.loads((tmp_path / "o/plan.json").read_text())
    assert shown == f"**{plan['verdict']}**"
    assert plan["deployments"] and plan["aggregated"]["deployments"]
    headers, rows = printed_table(printed)
    table = at.dataframe[0].value
    assert list(table.columns) == headers  # every column the command prints, as it heads it
    assert [list(r) for r in table.itertuples(index=False)] == rows  # each cell as it rounds it
    hover = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["hovertemplate"]
    assert "TTFT p99 %{customdata[0]:,.1f} ms, TPOT p99 %{customdata[1]:,.1f} ms, ITL p99" in hover
    assert "latencies: the p99 of the seeds' requests there" in next(c.value for c in at.caption if "--disaggregated" in
                                                                      c.value)


def printed_table(text: str) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of cells) of the one table rich drew in `text` (┃ heads it, │ separates cells)."""
    lines = text.splitlines()
    [head] = [line for line in lines if line.startswith("┃")]
    return cells(head, "┃"), [cells(line, "│") for line in lines if line.startswith("│")]


def cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split(bar)]
