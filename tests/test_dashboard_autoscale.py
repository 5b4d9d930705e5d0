"""The Autoscaling page under AppTest: a shipped autoscaled day's first minutes simulated as
`kvsim run` simulates them (replicas, attainment, $), its figure drawn; a scenario without an
[autoscaling] section is pointed at the shipped days."""

import json
import subprocess
import sys

from tests.test_dashboard import ROOT, assert_clean, downloaded_toml_from_state, open_app


def keyed(at, kind: str, prefix: str):
    [found] = [w for w in getattr(at.main, kind) if w.key and w.key.startswith(prefix)]
    return found


def test_a_scenario_without_autoscaling_is_pointed_at_the_shipped_days():
    at = open_app("views/autoscale.py")
    assert_clean(at)
    assert [t.value for t in at.title] == ["Autoscaling"]
    assert at.info and "autoscale/day_hpa" in at.info[0].value
    assert len(at.get("plotly_chart")) == 1  # the offered load over time


def test_the_page_simulates_the_first_minutes_of_a_shipped_day_as_kvsim_run(tmp_path):
    at = open_app("views/autoscale.py")
    at.sidebar.selectbox(key="kvsim.shipped").set_value("autoscale/day_hpa").run()
    assert_clean(at)
    keyed(at, "number_input", "kvsim.auto.hours").set_value(0.1).run()
    at.button(key="kvsim.auto.run").click().run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 2  # the load curve and the day
    shown = at.markdown[0].value if at.markdown else ""
    assert "SLO attainment" in shown and "replica-hours" in shown
    toml = tmp_path / "day.toml"
    toml.write_text(downloaded_toml_from_state(at))
    subprocess.run([sys.executable, "-m", "kvsim", "run", str(toml), "--set", "workload.duration_s=360", "--quiet",
                    "--out", str(tmp_path / "o")], cwd=ROOT, check=True, capture_output=True)
    auto = json.loads((tmp_path / "o/summary.json").read_text())["policies"]["paged"]["autoscaling"]
    assert f"{auto['replica_hours']:.1f} replica-hours" in shown and f"{auto['attainment']:.2%}" in shown
