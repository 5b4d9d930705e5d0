"""Validation: the scenario's analytic prediction against what a real engine measured, from
`kvsim.validate` (the table `python -m kvsim validate SCENARIO --measured RUN` prints): per policy and
figure the measured and predicted values and the error, the median |error|, and a chart of the errors.

The measured run is an uploaded .zip of a GPU (`triton` backend) run's results folder, or a JSON: a
results folder's summary.json or a `vllm bench serve --save-result` file (kvdash.measured checks and
unpacks it). The built-in example, benchmarks/results/validate_h100, is an H100 run of
scenarios/validate_h100.toml: it is validated against the sidebar's scenario when the sidebar holds
that one, else against the file itself.
"""

import plotly.graph_objects as go
import streamlit as st

from kvdash import errors, measured, settings
from kvdash.source import SCENARIO_DIR
from kvsim.calibrate.validate import FIGURES, median_abs_error, read_measured
from kvsim.results.figures import policy_colors
from kvsim.scenario.files import read_text

EXAMPLE = SCENARIO_DIR.parent / "benchmarks" / "results" / "validate_h100"
EXAMPLE_SCENARIO = "validate_h100"
EXAMPLE_NAME = "benchmarks/results/validate_h100"
SOURCES = ("built-in example: an H100 run of validate_h100", "upload a measured run")
GOOD = 0.10  # the shaded band: kvsim calibrate's default hold-out bound

cur = settings.current()


def use_example_scenario() -> None:
    st.session_state["kvsim.source"] = "shipped scenario"
    st.session_state["kvsim.shipped"] = EXAMPLE_SCENARIO


def example():
    """(scenario key, measured path, name, measured digest, policies, command-line scenario) of the built-in
    example."""
    if cur.scenario.name == EXAMPLE_SCENARIO:
        scenario = (cur.toml(), cur.base.source, str(cur.base.base_dir), cur.base.digest)
    else:
        source = f"scenarios/{EXAMPLE_SCENARIO}.toml"
        text = read_text(SCENARIO_DIR / f"{EXAMPLE_SCENARIO}.toml", "scenario file")
        scenario = (text, source, str(SCENARIO_DIR), "")
        cols = st.columns([3, 1], vertical_alignment="center")
        cols[0].info(f"The example was measured for {source}, so it is validated against that file (the sidebar "
                     f"holds {cur.scenario.name}). Load it into the sidebar to change its settings.")
        cols[1].button(f"Use {EXAMPLE_SCENARIO} in the sidebar", on_click=use_example_scenario,
                       key="kvsim.validation.use_example")
    args = cur.arguments() if cur.scenario.name == EXAMPLE_SCENARIO else scenario[1]
    return scenario, str(EXAMPLE), EXAMPLE_NAME, measured.digest_of(EXAMPLE), None, args


def uploaded():
    """(scenario key, measured path, name, measured digest, policies, command-line scenario) of an upload, or
    None before one."""
    upload = st.file_uploader("Measured run: a results folder as .zip, or a JSON", type=["zip", "json"],
                              key="kvsim.validation.upload", max_upload_size=max(1, measured.MAX_ZIP_BYTES >> 20),
                              help="A .zip of the results folder of a `triton` backend run of the sidebar's scenario "
                                   "(its summary.json is what is compared), that summary.json itself, or a "
                                   f"`vllm bench serve --save-result` JSON; at most {measured.MAX_ZIP_BYTES >> 20} MiB.")
    if upload is None:
        st.info("Upload a measured run of the sidebar's scenario.")
        return None
    path, digest = measured.saved_upload(upload)
    with measured.named(path, upload.name):
        engine, _ = read_measured(path)
    policies = None
    if engine == "vllm":
        policies = (st.selectbox("policy the vLLM server ran", cur.policies, key="kvsim.validation.policy",
                                 help="A bench result measures one server: the scenario's policy with its settings."),)
    scenario = (cur.toml(), cur.base.source, str(cur.base.base_dir), cur.base.digest)
    args = cur.arguments(policies=False)
    if args and policies:
        args += f" --policy {policies[0]}"
    return scenario, str(path), upload.name, digest, policies, args


def error_figure(records: list[dict], colors: dict) -> dict:
    order = [f[0] for f in FIGURES]
    data = []
    for policy, color in colors.items():
        mine = sorted((r for r in records if r["policy"] == policy and r["error"] is not None),
                      key=lambda r: order.index(r["figure"]))
        data.append({"type": "bar", "orientation": "h", "name": policy, "y": [r["figure"] for r in mine],
                     "x": [r["error"] * 100 for r in mine], "marker": {"color": color},
                     "customdata": [[r["measured"], r["predicted"], r["unit"]] for r in mine],
                     "hovertemplate": policy + ", %{y}: %{x:+.1f}% (predicted %{customdata[1]:,.4g} vs measured "
                                      "%{customdata[0]:,.4g} %{customdata[2]})<extra></extra>"})
    shown = [f for f in order if any(r["figure"] == f and r["error"] is not None for r in records)]
    band = {"type": "rect", "xref": "x", "yref": "paper", "x0": -GOOD * 100, "x1": GOOD * 100, "y0": 0, "y1": 1,
            "fillcolor": "#00CC96", "opacity": 0.12, "line": {"width": 0}, "layer": "below"}
    return {"data": data, "layout": {
        "barmode": "group", "height": 160 + 34 * len(shown) * max(1, len(colors)) ** 0.5,
        "title": {"text": "Prediction error per figure: predicted / measured − 1 (shaded: within ±10%)"},
        "xaxis": {"title": {"text": "error (%)"}, "zeroline": True, "zerolinecolor": "#444"},
        "yaxis": {"autorange": "reversed", "categoryorder": "array", "categoryarray": shown},
        "shapes": [band], "legend": {"orientation": "h", "y": -0.15}}}


def table(records: list[dict]) -> list[dict]:
    return [{"policy": r["policy"], "figure": r["figure"], "unit": r["unit"], "measured": r["measured"],
             "predicted": r["predicted"], "error": None if r["error"] is None else r["error"] * 100} for r in records]


def show(records: list[dict], policy_order: list[str]) -> None:
    serving = [r for r in records if r["kind"] == "serving"]
    policies = list(dict.fromkeys(r["policy"] for r in serving))
    colors = {p: c for p, c in policy_colors(policy_order).items() if p in policies}
    cols = st.columns(len(policies) + 1)
    cols[0].metric("median |error|, all figures", f"{median_abs_error(records):.1%}")
    for col, policy in zip(cols[1:], policies):
        col.metric(f"median |error|, {policy}", f"{median_abs_error(records, policy):.1%}")
    st.plotly_chart(go.Figure(error_figure(serving, colors)), theme=None, key="kvsim.validation_errors")
    number = {"measured": st.column_config.NumberColumn(format="localized"),
              "predicted": st.column_config.NumberColumn(format="localized"),
              "error": st.column_config.NumberColumn("error (%)", format="%+.1f%%")}
    st.dataframe(table(serving), hide_index=True, column_config=number, height="content")
    steps = [r for r in records if r["kind"] == "step"]
    if steps:
        st.caption("The GPU run's steps by phase: measured in all beside the analytic price of the same steps")
        st.dataframe(table(steps), hide_index=True, column_config=number)


with errors.caught(st):
    choices = SOURCES if EXAMPLE.is_dir() else SOURCES[1:]
    source = st.radio("Measured run", choices, horizontal=True, key="kvsim.validation.source")
    got = example() if source == SOURCES[0] else uploaded()
    if got is not None:
        scenario, path, name, digest, policies, args = got
        with measured.named(path, name):
            records = measured.validate(*scenario, path, digest, policies)
        note = "" if args else " (SCENARIO.toml: the scenario file the What-if page offers)"
        st.caption(f"{scenario[1]} simulated by the analytic backend against {name}; the same table: "
                   f"`python -m kvsim validate {args or 'SCENARIO.toml'} --measured {name}`{note}")
        show(records, list(dict.fromkeys(r["policy"] for r in records)))  # the scenario's order
