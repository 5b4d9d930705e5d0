"""The dashboard's speculative-decoding and energy knobs (app/kvdash/extras.py): a checkbox adds the
scenario section, its widgets become its keys, and the page's numbers are the command line's."""

import json

from test_dashboard import assert_clean, cli, downloaded_toml, open_app, widget


def test_speculation_and_energy_knobs_are_scenario_sections(tmp_path):
    at = open_app()
    assert_clean(at)
    widget(at, "checkbox", "speculative").set_value(True)
    widget(at, "checkbox", "energy").set_value(True)
    at.run()
    widget(at, "selectbox", "speculative.method").set_value("ngram")
    widget(at, "number_input", "speculative.num_speculative_tokens").set_value(4)
    widget(at, "number_input", "energy.pue").set_value(1.2)
    at.run()
    assert_clean(at)
    toml = downloaded_toml(at)
    for line in ("[speculative]", 'method = "ngram"', "num_speculative_tokens = 4", "[energy]", "pue = 1.2"):
        assert line in toml, toml
    shown = " ".join(m.value for m in at.markdown)
    assert "ngram k=4" in shown and "J per output token" in shown
    cli(tmp_path, toml, "--quiet", "--out", "out")
    policies = json.loads((tmp_path / "out/summary.json").read_text())["policies"]
    for name, s in policies.items():  # the contiguous policy cannot speculate: by default it does not
        assert s["energy"]["model"]["pue"] == 1.2
        assert s["speculative"]["method"] == "ngram" if name != "contiguous" else "speculative" not in s
    widget(at, "checkbox", "speculative").set_value(False)
    at.run()
    assert "[speculative]" not in downloaded_toml(at)
