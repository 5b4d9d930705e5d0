"""The Disaggregation page under AppTest: aggregated or disaggregated at a target rate, and which
prefill:decode ratio, is `kvsim plan --target-rate R --disaggregated`'s answer for the scenario file
the dashboard offers, with a chart of the options' cost."""

import json
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
    subprocess.run([sys.executable, "-m", "kvsim", "plan", str(toml), *args[4:], "--quiet", "--out", str(tmp_path / "o")],
                   cwd=ROOT, check=True, capture_output=True)
    plan = json.loads((tmp_path / "o/plan.json").read_text())
    assert shown == f"**{plan['verdict']}**"
    assert plan["deployments"] and plan["aggregated"]["deployments"]
