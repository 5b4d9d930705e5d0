"""What-if: the sidebar's scenario run through `kvsim.run`, policies side by side.

A preview of the first requests reruns on every change (cached by the scenario's content); a button
runs the whole scenario. The table and figures are the CLI's own (kvsim.results.report), and the
downloads are the settings as a scenario file and the run's results folder files.
"""

import streamlit as st

from kvdash import charts, diagnosis, errors, runs, settings
from kvsim.results.headline import table_figures
from kvsim.results.report import verdict_lines

cur = settings.current()


def comparison_rows(summaries: dict) -> list[dict]:
    """The comparison table, a row per figure and a column per policy (it fits the page however
    many figures): the report's headline figures as the terminal table prints them."""
    rows = [{"figure": "finished / rejected",
             **{name: f"{s['requests']['finished']:,} / {s['requests']['rejected']:,}" for name, s in summaries.items()}}]
    for f in table_figures(summaries):
        rows.append({"figure": f.label, **{name: f.text(s) for name, s in summaries.items()}})
    return rows


with errors.caught(st):
    scenario, base = cur.scenario, cur.base
    st.caption(f"{settings.layout_text(scenario)}; {settings.workload_text(scenario)}")
    diag = diagnosis.diagnose(scenario)
    if diag is not None:  # no run can start: say why now, not after a "Run all"
        st.error(errors.one_line(diag.message))
        diagnosis.buttons(diag, base.digest, "whatif")
        st.stop()
    full_toml = cur.toml()
    total = runs.request_count(full_toml, base.source, str(base.base_dir), base.digest)
    is_preview = total is None or total > runs.PREVIEW_REQUESTS
    result = runs.last_full_run(full_toml, base.digest)
    top = st.columns([3, 1], vertical_alignment="center")
    if is_preview and result is None:
        if top[1].button(f"Run all {total:,} requests" if total else "Run the whole scenario", type="primary",
                         key="kvsim.full_run_button", help="Simulate every request of the scenario, as "
                         "`python -m kvsim` does, instead of the preview's first requests."):
            result = runs.full_run(full_toml, base.source, base.base_dir, base.digest, len(cur.policies), st)
    if result is None:
        toml, _ = cur.validated((f"workload.num_requests={runs.PREVIEW_REQUESTS}",)) if is_preview \
            else (full_toml, None)
        result = runs.preview(toml, base.source, str(base.base_dir), base.digest)
        what = (f"Preview: the first {runs.PREVIEW_REQUESTS:,} of {f'{total:,}' if total else 'the'} requests"
                if is_preview else f"All {total:,} requests")
    else:
        what = f"Full run: all {total:,} requests" if total else "Full run"
    top[0].markdown(f"**{what}** · {', '.join(cur.policies)} · simulated in {result.wall_s:.2f} s")
    st.markdown("  \n".join(verdict_lines(result.summaries, result.meta)))  # model, SLO, who meets it, what binds

    st.subheader("Policy comparison")
    st.dataframe(comparison_rows(result.summaries), hide_index=True, width="stretch", height="content")
    for i, fig in enumerate(result.figures):
        charts.plot(fig, f"kvsim.report_fig_{i}")

    st.subheader("Downloads")
    label = "preview " if result.toml != full_toml else ""
    cols = st.columns(len(runs.DOWNLOADS) + 1)
    cols[0].download_button("scenario TOML", cur.download_toml(), file_name=f"{scenario.name or 'scenario'}.toml",
                            mime="application/toml", on_click="ignore", key="kvsim.dl_toml",
                            help="These settings as a scenario file for `python -m kvsim`")
    for col, (name, mime) in zip(cols[1:], runs.DOWNLOADS):
        if name in result.files:
            col.download_button(f"{label}{name}", result.files[name], file_name=name, mime=mime,
                                on_click="ignore", key=f"kvsim.dl_{name}")
    with st.expander("These settings as a scenario file"):
        st.code(cur.download_toml(), language="toml")
