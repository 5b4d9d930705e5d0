"""Memory: where each GPU's memory goes and what the KV cache holds, from `kvsim.memory` (the
numbers `python -m kvsim memory` prints): the capacity breakdown, bytes per token per kv dtype,
sequences that fit per context length and policy, and the prefill FLOPs a shared prefix saves.

The page gives the diagnosis the other pages give (kvdash.diagnosis): a model that does not fit shows
where the memory goes and the layouts that fit; a setting the runs refuse (an MLA model's block size)
is said above the figures, which already use what vLLM runs.
"""

import streamlit as st

import kvsim
from kvdash import charts, diagnosis, errors, settings
from kvsim.results.memory_report import table_lengths
from kvsim.results.figures import policy_colors


cur = settings.current()


def chart_lengths(max_len: int) -> list[int]:
    """Context lengths for the sequences chart: powers of two from 256, the table's lengths and the maximum."""
    lens = {2**k for k in range(8, 18) if 2**k < max_len} | set(table_lengths(max_len)) | {max_len}
    return sorted(lens)


def bytes_per_token_figure(rows: list[dict], in_use: set) -> dict:
    names = [r["kv_cache_dtype"] for r in rows]
    return {"data": [{"type": "bar", "x": names, "y": [r["bytes_per_token"] / 1024 for r in rows],
                      "marker": {"color": ["#EF553B" if n in in_use else "#B0B0B0" for n in names]},
                      "hovertemplate": "%{x}: %{y:,.2f} KiB per token<extra></extra>"}],
            "layout": {"height": 320, "title": {"text": "KV bytes per token per GPU (in use: red)"},
                       "yaxis": {"title": {"text": "KiB per token"}}}}


def sequences_figure(rows: list[dict], max_num_seqs: int) -> dict:
    colors = policy_colors(list(dict.fromkeys(r["policy"] for r in rows)))
    data = []
    for policy, color in colors.items():
        mine = [r for r in rows if r["policy"] == policy]
        data.append({"type": "scatter", "mode": "lines+markers", "name": policy, "line": {"color": color},
                     "x": [r["seq_len"] for r in mine], "y": [r["num_seqs"] for r in mine],
                     "hovertemplate": policy + ": %{y:,} sequences of %{x:,} tokens<extra></extra>"})
    lens = [r["seq_len"] for r in rows]
    data.append({"type": "scatter", "mode": "lines", "name": "engine.max_num_seqs", "x": [min(lens), max(lens)],
                 "y": [max_num_seqs, max_num_seqs], "line": {"dash": "dash", "color": "#444"}})
    ticks = sorted(set(lens))
    return {"data": data, "layout": {"height": 420, "title": {"text": "Sequences that fit in the KV cache"},
                                     "xaxis": {"type": "log", "title": {"text": "context length (tokens)"},
                                               "tickvals": ticks, "ticktext": [_tokens(n) for n in ticks]},
                                     "yaxis": {"type": "log", "dtick": 1, "title": {"text": "concurrent sequences"}}}}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def prefix_figure(prefix: dict) -> dict:
    full, saved = prefix["flops_full"] / 1e12, prefix["flops_saved"] / 1e12
    return {"data": [{"type": "bar", "x": ["without prefix cache", "with a prefix-cache hit"],
                      "y": [full, full - saved], "marker": {"color": ["#B0B0B0", "#00CC96"]},
                      "hovertemplate": "%{x}: %{y:,.2f} TFLOP<extra></extra>"}],
            "layout": {"height": 320, "yaxis": {"title": {"text": "TFLOP"}},
                       "title": {"text": f"Prefill of a {prefix['prompt_len']:,}-token prompt"}}}


def show(fig: dict, key: str) -> None:
    charts.plot(fig, f"kvsim.memory_{key}")


def capacity_label(cap: dict) -> str:
    """A capacity record's name, as `kvsim memory` heads its column: 'auto (contiguous, paged)'."""
    return f"{cap['kv_cache_dtype']} ({', '.join(cap['policies'])})"


def diagnosed(scenario) -> None:
    """The diagnosis of the runs (a setting: above the figures) and of the sizing (the page's own: it stops)."""
    run = diagnosis.diagnose(scenario)
    if run is not None and run.kind == diagnosis.SETTING:
        st.warning(f"{errors.one_line(run.message)}. The memory figures here use it already; runs and plans need it set.")
        diagnosis.buttons(run, cur.base.digest, "memory_setting")
    sizing = diagnosis.diagnose(scenario, simulate=False)
    if sizing is not None:
        st.error(errors.one_line(sizing.message))
        diagnosis.buttons(sizing, cur.base.digest, "memory")
        if sizing.kind == diagnosis.MEMORY:
            diagnosis.memory_view(scenario, "memory")
        st.stop()


with errors.caught(st):
    scenario = cur.scenario
    diagnosed(scenario)
    max_len = kvsim.memory(scenario, seq_lens=())["max_model_len"]
    mem = kvsim.memory(scenario, seq_lens=chart_lengths(max_len))
    st.caption(f"{settings.layout_text(scenario)}, max_model_len {max_len:,}: per GPU, as `python -m kvsim memory` "
               "prints it")
    for cap in mem["capacity"]:
        if cap["problem"]:
            st.warning(errors.one_line(cap["problem"]))

    st.subheader("Capacity breakdown")
    show(diagnosis.breakdown_figure(mem["capacity"], mem["gpu"]), "breakdown")
    st.markdown("**KV tokens per GPU**, per kv dtype (and the policies sharing its breakdown)")
    cols = st.columns(len(mem["capacity"]))
    for col, cap in zip(cols, mem["capacity"]):
        col.metric(capacity_label(cap), f"{cap['max_tokens']:,}",
                   help=f"{cap['num_blocks']:,} blocks of {cap['block_size']} tokens, {cap['bytes_per_block']:,} "
                        f"bytes each; policies {', '.join(cap['policies'])}")

    st.subheader("Bytes per token")
    show(bytes_per_token_figure(mem["bytes_per_token"], {c["kv_cache_dtype"] for c in mem["capacity"]}), "bytes")

    st.subheader("Concurrent sequences vs context length")
    show(sequences_figure(mem["sequences"], scenario.engine.max_num_seqs), "sequences")
    shown = set(table_lengths(max_len))
    table = {}
    for r in mem["sequences"]:
        if r["seq_len"] in shown:
            row = table.setdefault((r["policy"], r["kv_cache_dtype"]), {
                "policy": r["policy"], "allocator": r["allocator"], "kv dtype": r["kv_cache_dtype"]})
            row[f"{r['seq_len']:,} tok"] = f"{r['bytes_per_seq'] / 2**20:,.1f} MiB ({r['num_seqs']:,})"
    st.caption("Bytes per sequence (sequences that fit), as in `python -m kvsim memory`")
    st.dataframe(list(table.values()), hide_index=True)

    st.subheader("Prefix caching")
    if mem["prefix"] is None:
        st.info("This workload has no shared prefix: turn on *shared prefixes* under Workload in the sidebar.")
    else:
        p = mem["prefix"]
        st.metric(f"Prefill FLOPs saved per hit on the {p['prefix_len']:,}-token shared prefix",
                  f"{p['flops_saved'] / 1e12:,.2f} TFLOP", f"{p['flops_saved'] / p['flops_full']:.0%} of the prefill",
                  delta_color="off")
        show(prefix_figure(p), "prefix")
