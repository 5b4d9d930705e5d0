"""Results folder (all-or-nothing), the self-contained HTML report and the comparison table."""

import csv
import json
import re

import numpy as np
import pytest
from rich.console import Console

from kvsim.errors import KvsimError
from kvsim.results.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS, Metrics
from kvsim.results.figures import cdf_points
from kvsim.results.report import comparison_table, write_report_html
from kvsim.results.writer import ResultsWriter
from kvsim.scenario.config import SloConfig
from kvsim.sequence import Request, Sequence

POLICIES = ("paged-bf16", "contiguous_fp8")


def run_policy(writer, policy, n, slowdown):
    """A tiny fake simulation: n finished requests plus one rejection, with samples on two replicas."""
    m = Metrics(policy, SloConfig(percentile=90), 0.5, requests_file=writer.requests_file)
    for i in range(n):
        seq = Sequence(Request(i, i * 0.1, 128, 8))
        seq.first_scheduled_time = i * 0.1
        seq.first_token_time = i * 0.1 + 0.05 * slowdown * (1 + i % 3)
        seq.finish_time = seq.first_token_time + 7 * 0.01 * slowdown
        seq.num_output_tokens, seq.num_cached_tokens = 8, 32 * (i % 2)
        m.record_itl(0.01 * slowdown, 7)
        m.on_finish(seq)
    rej = Sequence(Request(n, 0.0, 10**6, 8))
    rej.reject_reason, rej.finish_time = "prompt_too_long", 0.0
    m.on_reject(rej)
    for step in range(40):
        for replica in (0, 1):
            m.sample(step * 0.1, m.series(replica), running=step % 5, waiting=step % 3, swapped=0, blocks_used=step,
                     blocks_cached=2, blocks_free=100 - step, reserved_unused_tokens=0, batch_tokens=64)
    writer.add_timeseries(policy, m.timeseries_rows())
    return m.summary(duration_s=4.0, num_blocks=100, block_size=16, bytes_per_block=4096)


def write_run(out_dir, **commit_kw):
    writer = ResultsWriter(out_dir)
    with writer:
        summaries = {p: run_policy(writer, p, 20, k + 1) for k, p in enumerate(POLICIES)}
        writer.commit("demo<scenario>", summaries, {"seed": 1, "backend": "analytic"}, **commit_kw)
    return summaries


def test_commit_writes_all_files_and_summary_round_trips(tmp_path):
    out = tmp_path / "res"
    summaries = write_run(out)
    assert sorted(p.name for p in out.iterdir()) == [".kvsim-results.json", "report.html", "requests.csv",
                                                     "summary.json", "timeseries.csv"]
    assert [p.name for p in tmp_path.iterdir()] == ["res"]  # no temp folder left behind
    marker = json.loads((out / ".kvsim-results.json").read_text())
    assert marker == {"format": "kvsim-results", "version": 1,
                      "files": ["report.html", "requests.csv", "summary.json", "timeseries.csv"]}
    doc = json.loads((out / "summary.json").read_text())
    assert doc == {"scenario": "demo<scenario>", "meta": {"seed": 1, "backend": "analytic"},
                   "policies": json.loads(json.dumps(summaries))}
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == REQUEST_COLUMNS
    assert sum(r[0] == POLICIES[0] for r in rows[1:]) == 21 and sum(r[0] == POLICIES[1] for r in rows[1:]) == 21
    with open(out / "timeseries.csv", newline="") as f:
        ts = list(csv.reader(f))
    assert tuple(ts[0]) == TIMESERIES_COLUMNS
    assert {(r[0], r[1]) for r in ts[1:]} == {(p, r) for p in POLICIES for r in ("0", "1")}


def test_report_html_is_self_contained(tmp_path):
    write_run(tmp_path / "res")
    page = (tmp_path / "res" / "report.html").read_text()
    assert "plotly" in page.lower()
    for name in POLICIES:
        assert name in page
    assert "demo&lt;scenario&gt;" in page and "demo<scenario>" not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", page)
    assert page.count("Plotly.newPlot") == 4  # bars, CDFs, KV over time, running/waiting
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1  # the library is inlined once


def test_report_html_can_be_skipped(tmp_path):
    write_run(tmp_path / "res", report_html=False)
    assert not (tmp_path / "res" / "report.html").exists()
    assert (tmp_path / "res" / "summary.json").exists()


def test_abort_and_exception_leave_nothing(tmp_path):
    writer = ResultsWriter(tmp_path / "a")
    writer.requests_csv.writerow(["x"])
    writer.abort()
    with pytest.raises(RuntimeError):
        with ResultsWriter(tmp_path / "b") as writer:
            run_policy(writer, "p", 3, 1)
            raise RuntimeError("simulation failed")
    with ResultsWriter(tmp_path / "c"):
        pass  # never committed
    assert list(tmp_path.iterdir()) == []


def test_failed_commit_keeps_previous_results(tmp_path):
    out = tmp_path / "res"
    write_run(out)
    before = (out / "summary.json").read_text()
    with pytest.raises(TypeError):
        with ResultsWriter(out) as writer:
            writer.commit("x", {"p": {"bad": object()}}, {})  # not JSON-able
    assert (out / "summary.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["res"]


def test_only_a_kvsim_results_folder_is_replaced(tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    (out / "notes.txt").write_text("someone's work")
    with pytest.raises(KvsimError, match="res: folder exists and is not a kvsim results folder: pass --force"):
        write_run(out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    write_run(out)  # an empty folder may be used
    write_run(out)  # and an earlier results folder replaced
    (out / "notes.txt").write_text("added later")
    with pytest.raises(KvsimError, match=r"res: results folder also holds files kvsim did not write \(notes.txt\)"):
        write_run(out)
    assert (out / "notes.txt").exists() and (out / "summary.json").exists()
    with ResultsWriter(out, force=True) as writer:
        writer.commit("forced", {}, {})
    assert not (out / "notes.txt").exists() and json.loads((out / "summary.json").read_text())["scenario"] == "forced"
    assert [p.name for p in tmp_path.iterdir()] == ["res"]


def test_out_dir_that_is_a_file_is_a_user_error(tmp_path):
    (tmp_path / "res").write_text("")
    with pytest.raises(KvsimError, match="res: .*not a folder"):
        ResultsWriter(tmp_path / "res")


def test_comparison_table_one_row_per_policy(tmp_path):
    summaries = write_run(tmp_path / "res")
    table = comparison_table(summaries)
    assert table.row_count == len(POLICIES)
    console = Console(record=True, width=400)
    console.print(table)
    text = console.export_text()
    for name in POLICIES:
        assert name in text
    assert "20/1" in text  # finished/rejected
    ttft_p99 = summaries[POLICIES[1]]["slo"]["at_percentile"]["ttft_ms"]  # the figure the SLO judges
    assert f"{ttft_p99:,.1f}" in text and "TTFT p90 ms (≤2000)" in text


def test_transposed_comparison_fits_a_narrow_terminal(tmp_path):
    summaries = write_run(tmp_path / "res")
    wide, narrow = comparison_table(summaries), comparison_table(summaries, transpose=True)
    assert len(narrow.columns) == len(POLICIES) + 1 and narrow.row_count == len(wide.columns) - 1
    console = Console(record=True, width=80)
    console.print(narrow)
    text = console.export_text()
    assert "…" not in text and "20/1" in text
    assert f"{summaries[POLICIES[1]]['slo']['at_percentile']['ttft_ms']:,.1f}" in text


def test_comparison_table_handles_empty_summary():
    s = Metrics("idle", SloConfig(), 1.0).summary(duration_s=0.0, num_blocks=10, block_size=16, bytes_per_block=1)
    table = comparison_table({"idle": s})
    assert table.row_count == 1
    Console(record=True, width=400).print(table)


def test_write_report_html_with_no_finished_requests(tmp_path):
    req, ts = tmp_path / "requests.csv", tmp_path / "timeseries.csv"
    req.write_text(",".join(REQUEST_COLUMNS) + "\n")
    ts.write_text(",".join(TIMESERIES_COLUMNS) + "\n")
    s = Metrics("idle", SloConfig(), 1.0).summary(duration_s=1.0, num_blocks=10, block_size=16, bytes_per_block=1)
    write_report_html(tmp_path / "r.html", "empty", {"idle": s}, req, ts)
    assert "idle" in (tmp_path / "r.html").read_text()


def test_cdf_points_thinned_and_exact_at_the_ends():
    rng = np.random.default_rng(0)
    values = rng.exponential(size=10_000)
    x, y = cdf_points(values)
    assert len(x) <= 2000 and len(x) == len(y)
    assert x[0] == values.min() and x[-1] == values.max() and y[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    # each point is the true empirical CDF at x (no ties in continuous data)
    for xi, yi in zip(x[::97], y[::97]):
        assert yi == pytest.approx(np.mean(values <= xi))
    small = np.array([3.0, 1.0, 2.0])
    xs, ys = cdf_points(small)
    assert xs.tolist() == [1.0, 2.0, 3.0] and ys.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_in_memory_latencies_equal_the_csv_columns(tmp_path):
    """The report's CDFs come from Metrics.latencies(); they must be what requests.csv holds (to its 12 digits)."""
    from kvsim.results.figures import _read_latencies
    writer = ResultsWriter(tmp_path / "res")
    with writer:
        metrics = {}
        for k, p in enumerate(POLICIES):
            m = Metrics(p, SloConfig(), 0.5, requests_file=writer.requests_file)
            for i in range(30):
                seq = Sequence(Request(i, i * 0.1, 128, 1 + i % 4))
                seq.first_scheduled_time = i * 0.1
                seq.first_token_time = i * 0.1 + 0.013 * (k + 1) * (1 + i % 7)
                seq.finish_time = seq.first_token_time + 0.0071 * (i % 4)
                seq.num_output_tokens = 1 + i % 4
                m.on_finish(seq)
            metrics[p] = m
        writer.requests_file.flush()
        from_csv = _read_latencies(writer.tmp_dir / "requests.csv")
    assert set(from_csv) == set(POLICIES)
    for p, m in metrics.items():
        mem = m.latencies()
        assert len(mem["mean_itl_s"]) < len(mem["ttft_s"]) == 30  # one-token requests have no ITL
        for col, values in from_csv[p].items():
            assert len(values) == len(mem[col]) and np.allclose(values, mem[col], rtol=1e-11, atol=0), (p, col)


def test_in_memory_timeseries_equal_the_csv_columns(tmp_path):
    """The report's time series come from the rows the writer was given; they must equal timeseries.csv
    read back, bit for bit (floats are written as repr, which reads back exactly)."""
    from kvsim.results.figures import _read_timeseries, timeseries_arrays
    rng = np.random.default_rng(3)
    writer = ResultsWriter(tmp_path / "res")
    with writer:
        for p in POLICIES:
            m = Metrics(p, SloConfig(), 0.25)
            for t in np.cumsum(rng.exponential(0.07, 200)):
                replica = int(rng.integers(0, 3))
                m.sample(float(t), m.series(replica), running=int(rng.integers(0, 9)), waiting=1, swapped=0,
                         blocks_used=int(rng.integers(0, 500)), blocks_cached=3, blocks_free=7,
                         reserved_unused_tokens=11, batch_tokens=int(rng.integers(1, 9000)),
                         external_fragmentation=float(rng.random()))
            writer.add_timeseries(p, m.timeseries_rows())
        writer._timeseries_file.flush()
        from_csv = _read_timeseries(writer.tmp_dir / "timeseries.csv")
        in_memory = writer._series
    assert list(from_csv) == list(in_memory) and len(from_csv) == 2 * 3
    for key, cols in from_csv.items():
        assert list(cols) == list(TIMESERIES_COLUMNS[2:])
        for col, values in cols.items():
            assert values.dtype == np.float64 and np.array_equal(values, in_memory[key][col]), (key, col)
    assert timeseries_arrays([]) == {}


def test_report_opens_with_the_verdict_and_draws_the_slo(tmp_path):
    meta = {"model": "Llama-3.1-8B", "gpu": "H100-SXM", "tensor_parallel_size": 2, "num_replicas": 3,
            "arrival": {"process": "poisson", "rate": 4.0}, "policy_order": ["other", *POLICIES],
            "slo": {"ttft_ms": 2000.0, "tpot_ms": 100.0, "itl_ms": None, "e2e_ms": None, "percentile": 90.0}}
    writer = ResultsWriter(tmp_path / "res")
    with writer:
        summaries = {p: run_policy(writer, p, 20, k + 1) for k, p in enumerate(POLICIES)}
        writer.commit("demo", summaries, meta)
    page = (tmp_path / "res" / "report.html").read_text()
    head = page[:page.index("<table>")]
    assert "Llama-3.1-8B on 6 × H100-SXM as TP 2 × 3 replicas; poisson 4 req/s" in head
    assert "SLO at p90: TTFT ≤ 2000 ms, TPOT ≤ 100 ms" in head and "policies meet the SLO" in head
    assert '"type":"log"' in page  # TTFT axis
    assert "SLO TTFT \\u2264 2000 ms" in page and "SLO TPOT \\u2264 100 ms" in page  # bound lines on the CDFs
    assert "% of KV capacity" in page
    assert '"text":"preemptions"' not in page  # none in this run: no empty panel
    # colours follow the policies' names, whichever others are on the page
    from kvsim.results.figures import policy_colors
    colors = policy_colors(["other", *POLICIES])
    assert all(f'"color":"{colors[p]}"' in page for p in POLICIES)
    assert f'"color":"{colors["other"]}"' not in page


def test_policy_colours_are_fixed_by_name_and_distinct_on_a_page():
    from kvsim.results.figures import NAMED_COLORS, PALETTE, policy_colors

    chat = policy_colors(["contiguous", "paged", "paged-fp8", "paged-int8", "paged-chunked"])
    mooncake = policy_colors(["paged-no-prefix-cache", "paged-fp8", "paged-prefix-cache"])
    assert chat["paged-fp8"] == mooncake["paged-fp8"] == NAMED_COLORS["paged-fp8"]  # across scenarios
    assert policy_colors(["paged-int8", "paged"]) == {p: chat[p] for p in ("paged-int8", "paged")}  # any order
    assert len(set(chat.values())) == 5 and len(set(mooncake.values())) == 3
    crowded = policy_colors([f"p{i}" for i in range(len(PALETTE))])
    assert len(set(crowded.values())) == len(PALETTE)  # collisions take the next free colour
    clash = policy_colors(["paged", "paged-prefix-cache"])  # two names of one colour on one page
    assert clash["paged"] == NAMED_COLORS["paged"] != clash["paged-prefix-cache"]


def test_report_figures_draw_latency_on_log_axes_with_slo_lines_and_a_legend_for_the_capacity(tmp_path):
    from kvsim.results.figures import CAPACITY_GREY, SLO_RED, report_plots

    meta = {"policy_order": list(POLICIES), "slo": {"ttft_ms": 200.0, "tpot_ms": 100.0, "percentile": 90.0}}
    writer = ResultsWriter(tmp_path / "res")
    with writer:
        summaries = {p: run_policy(writer, p, 20, k + 1) for k, p in enumerate(POLICIES)}
        for s in summaries.values():
            s["slo"]["bounds"] = {"ttft_ms": 200.0, "tpot_ms": 100.0}
        writer.commit("demo", summaries, meta)
    bars, cdfs, kv, queue = report_plots(summaries, tmp_path / "res/requests.csv", tmp_path / "res/timeseries.csv",
                                         meta=meta)[:4]
    ttft_panel = next(i for i, a in enumerate(bars.layout["annotations"]) if a["text"].startswith("TTFT p90"))
    suffix = "" if ttft_panel == 0 else str(ttft_panel + 1)
    assert bars.layout[f"yaxis{suffix}"]["type"] == "log"  # latencies: one slow policy squashes nothing
    assert any(sh["yref"] == f"y{suffix}" and sh["y0"] == 200.0 and sh["line"]["color"] == SLO_RED
               for sh in bars.layout["shapes"])  # the bound, in its panel
    assert bars.layout[f"xaxis{suffix}"]["showticklabels"] is False  # names in the legend, not rotated labels
    assert [t["name"] for t in bars.data if t["type"] == "bar"][:2] == list(POLICIES)
    dashes = {t["name"]: t["line"]["dash"] for t in cdfs.data if t.get("legendgroup") in POLICIES}
    assert len(set(dashes.values())) == 2  # identical curves stay visible
    capacity = [t for t in kv.data if t["name"] == "KV capacity (100%)"]
    assert capacity and capacity[0]["showlegend"] and capacity[0]["line"]["color"] == CAPACITY_GREY
    cached = [t for t in kv.data if "prefix cache (reclaimable)" in t["name"]]
    assert cached and all(t["fill"] == "tonexty" for t in cached)  # shaded above the blocks in use
    shown = [t for t in kv.data if t.get("showlegend")]
    assert len(shown) == 2 * len(POLICIES) + 1  # a policy's replicas share its legend entries


def test_a_missing_plotly_is_one_line_naming_the_package(monkeypatch):
    """plotly is a dependency, but a hand-made environment may lack it: the report says so, not a bug."""
    import kvsim.results.report as report

    monkeypatch.setattr(report, "find_spec", lambda name: None)
    with pytest.raises(KvsimError, match="needs the plotly package, which is not installed: pip install plotly"):
        report._package_dir("plotly")
