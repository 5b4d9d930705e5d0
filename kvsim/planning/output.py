"""Plan and sweep answers as files (plan.json, plan.csv, points.csv, sweep.csv), through the results
writer (all or nothing, never over a folder kvsim did not write), and as terminal tables."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Iterable

from rich.table import Table

from kvsim.results.cells import csv_cell
from kvsim.results.intervals import real_runs_words
from kvsim.results.report import meta_deployment_text, slo_text
from kvsim.results.verdict import LABELS, percentile_label
from kvsim.results.writer import ResultsWriter
from kvsim.planning.capacity import ties


def _cell(value):
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return "" if value is None else csv_cell(value)


def csv_text(rows: list[dict], columns: Iterable[str] | None = None) -> str:
    """Rows as CSV text (columns: the given ones, else the union in first-seen order); floats by repr."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def json_text(doc: dict) -> str:
    return json.dumps(_json_safe(doc), indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_outputs(out_dir: Path, files: dict[str, str], scenario=None, force: bool = False, vetted=None) -> Path:
    """The files into `out_dir`, all or nothing, replacing only an earlier kvsim folder unless
    `force` (never one holding the scenario's inputs), and only what `check_out` found (`vetted`) when
    the command started: kvsim.results.writer.ResultsWriter."""
    from kvsim.pipeline import input_paths

    inputs = input_paths(scenario) if scenario is not None else ()
    writer = ResultsWriter(out_dir, force=force, inputs=inputs, streams=False, vetted=vetted)
    with writer:
        return writer.commit_files(files)


def check_out(out_dir: Path, scenario, force: bool = False):
    """Refuse now, before any simulation, a folder that `write_outputs` would refuse at the end; what is
    there and may be replaced (`write_outputs(vetted=)` replaces only that, as it is now)."""
    from kvsim.results.writer import check_target, recover_leftovers, results_path
    from kvsim.pipeline import input_paths

    path = results_path(out_dir)
    recover_leftovers(path)  # as the writer does first: what a killed run left is put back or removed
    return check_target(path, force, input_paths(scenario))


def plan_files(result) -> dict[str, str]:
    """plan.json (the whole answer), plan.csv (a row per policy or deployment), points.csv: name -> text."""
    doc = result.to_dict()
    points = doc.pop("points")
    return {"plan.json": json_text(doc), "plan.csv": csv_text(result.rows()), "points.csv": csv_text(points)}


def write_plan(out_dir: Path, result, scenario=None, force: bool = False, vetted=None) -> Path:
    """`plan_files` into `out_dir` (see write_outputs)."""
    return write_outputs(out_dir, plan_files(result), scenario, force, vetted)


# ---- terminal

def _num(x, digits=2, pct=False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:+.0%}" if pct else f"{x:,.{digits}f}"


def load_unit(meta: dict) -> str:
    """What the plan's rates count: req/s, sessions/s, or clients (a closed loop's concurrency)."""
    return meta.get("load_unit") or "req/s"


def _there(p, unit: str, meta: dict) -> str:
    """A closed loop's throughput at its safe concurrency, named as what it is (not the rate the clients sent)."""
    rps = p.at_safe_rate.get("throughput_rps") if unit == "clients" else None
    if rps is None:
        return ""
    scale = meta.get("safe_check_step_time_scale", 1.0)
    return (f", completing {rps:.3g} req/s there over the safe check's whole runs"
            + (f" (every step {scale - 1:.0%} dearer)" if scale != 1.0 else ""))


def plan_lines(result) -> list[str]:
    m = result.meta
    unit = load_unit(m)
    closed = unit == "clients"
    load = (f"a closed loop of {m['scenario_rate']:g} clients" if closed
            else f"scenario rate {m['scenario_rate']:.3g} {unit}")
    lines = [f"{m['model']} on {meta_deployment_text(m)}; {load}",
             slo_text(m["slo"]) + ("; sustainable = SLO met (clients wait for their replies: a closed loop cannot "
                                   "fall behind)" if closed else
                                   f"; sustainable = SLO met and backlog ≤ {m['stability_tolerance']:.0%} at the last arrival"),
             f"{_seeds_text(m)} × {m['num_requests']:,} requests a point, ±{m['resolution']:.0%} "
             f"{'concurrency' if closed else 'rate'} resolution; {len(result.points)} points simulated; "
             f"{_safe_text(m)}" + _margin_text(m)]
    if m.get("replications_note"):
        lines.append(f"only {len(m['seeds'])} of the {m['seeds_asked']} seeds asked can differ: {m['replications_note']}"
                     + ("; one replication gives no 95% interval (the knee's band below is the search's resolution "
                        "and the step-cost margin only)" if len(m["seeds"]) == 1 else ""))
    basis = m.get("pricing_basis")
    if basis:
        lines.append(f"priced: {basis['label'].upper() if basis['label'] == 'estimated' else basis['label']} "
                     f"({basis['why']})")
    for p in result.policies:
        if p.safe_rate == 0:
            lowest = min(pt["rate"] for pt in result.points if pt["policy"] == p.policy)
            lines.append(f"{p.policy}: no safe {'concurrency' if closed else 'rate'} found, down to {lowest:.3g} {unit} "
                         f"(requests alone miss the SLO; at the knee: {p.binding_detail})")
    groups = ties([p for p in result.policies if p.safe_rate > 0], unit)
    if groups:
        best = groups[0][0]
        interval = (f"95% CI {best.ci_low:.3g}–{best.ci_high:.3g}" if best.replications != 1 else
                    f"no 95% CI from one replication; resolution and step-cost band {best.ci_low:.3g}–{best.ci_high:.3g}")
        lines.append(f"best: {best.policy}, safe at {best.safe_rate:.3g} {unit} ({best.headroom:+.0%} against the "
                     f"scenario's {'clients' if closed else 'rate'}){_there(best, unit, m)}; knee "
                     f"{best.mean_rate:.3g}, {interval}; binds at the knee: {best.binding_detail}")
        if len(groups[0]) > 1:
            lines.append("tied with it (" + ("95% intervals overlap, the seeds cannot tell them apart"
                                            if best.replications != 1 else "within the search's resolution and "
                                            "step-cost band of each other")
                         + ("; ranked by the req/s completed at the safe concurrency" if closed else "") + "): "
                         + ", ".join(f"{p.policy} (safe {p.safe_rate:.3g}"
                                     + (f", {p.at_safe_rate.get('throughput_rps') or 0:.3g} req/s" if closed else "")
                                     + f", CI {p.ci_low:.3g}–{p.ci_high:.3g})" for p in groups[0][1:]))
    for p in result.policies:
        iv = p.safe_rate_interval
        if iv and p.safe_rate > 0:
            lines.append(f"{p.policy}: safe rate {p.safe_rate:.3g} {unit}; {real_runs_words(iv)} "
                         f"{iv['low']:.3g}–{iv['high']:.3g} {unit} ({iv['text']})")
    return lines


def _seeds_text(meta: dict) -> str:
    n = len(meta["seeds"])
    if not meta.get("trace_windows"):
        return f"{n} seed{'s' if n != 1 else ''}"
    return f"{n} seed{'s' if n != 1 else ''} (" + (f"{n} disjoint windows of the trace" if n > 1 else "one window")  + ")"


def _safe_text(meta: dict) -> str:
    """What the safe rate was checked with: the long run as long as it really was (a trace replayed with
    its times ends at its last row)."""
    long, n, rows = meta.get("long_run_requests", 0), meta["num_requests"], meta.get("trace_rows")
    if rows is not None and long <= n:
        return f"safe = every seed sustainable there (no longer run: the trace's {rows:,} rows are all a point replays)"
    if rows is not None and long < 4 * n:
        return f"safe = every seed and a run of the whole trace ({long:,} requests, not {4 * n:,}) sustainable there"
    return f"safe = every seed and a {long:,}-request run sustainable there"


def knee_text(p) -> str:
    """'mean (low–high)': the 95% interval, or the band without one (a single replication)."""
    band = f"{_num(p.mean_rate)} ({_num(p.ci_low)}–{_num(p.ci_high)})"
    return band if getattr(p, "replications", 0) != 1 else f"{_num(p.mean_rate)} (no CI: one replication)"


def _margin_text(meta: dict) -> str:
    scale = meta.get("safe_check_step_time_scale", 1.0)
    if scale == 1.0:
        return ""
    return (f", with every step {scale - 1:.0%} slower than priced; the knee's interval is widened by how far "
            f"it moves when steps cost ±{meta['step_cost_margin']:.0%}")


def _slo_columns(slo: dict, prefix: str = "", suffix: str = " at max") -> list[tuple[str, str]]:
    q = percentile_label(slo.get("percentile", 99.0))
    return [(f"{prefix}{k}_at_pct", f"{LABELS[k]} {q} ms{suffix}") for k in LABELS if slo.get(k) is not None]


def tied_with(answers: list) -> dict[str, list[str]]:
    """Each answer's ties (the others in its group of overlapping 95% intervals), by label."""
    return {a.policy: [b.policy for b in group if b is not a] for group in ties(answers) for a in group}


def plan_table(result) -> Table:
    slo_cols = _slo_columns(result.meta["slo"], "worst_", " at safe")
    unit = load_unit(result.meta)
    closed = unit == "clients"
    table = Table(title=f"kvsim plan: safe {'concurrency' if closed else 'rate'} per policy (every seed and a long "
                        "run sustainable)")
    tied = tied_with(result.policies)
    labels = ["policy", f"safe {unit}", *(["completed req/s at safe"] if closed else []), "knee: mean (95% CI)",
              "tied with",
              "headroom", f"at scenario {'clients' if closed else 'rate'}", *(c[1] for c in slo_cols), "binds at the knee"]
    left = {0, labels.index("tied with"), labels.index("tied with") + 2, len(labels) - 1}
    for i, label in enumerate(labels):
        table.add_column(label, justify="left" if i in left else "right", no_wrap=i == 0)
    for p in result.policies:
        more = ">" if p.censored else ""
        table.add_row(p.policy, _num(p.safe_rate, 0 if closed else 2),
                      *([_num(p.at_safe_rate.get("throughput_rps"))] if closed else []),
                      f"{more}{knee_text(p)}",
                      ", ".join(tied[p.policy]) or "–", _num(p.headroom, pct=True),
                      "✓ sustainable" if p.sustainable_at_scenario_rate else "✗ not sustainable",
                      *(_num(p.at_safe_rate.get(c[0]), 0) for c in slo_cols), p.binding or "–")
    return table


def tuning_table(result) -> Table:
    unit = load_unit(result.meta)
    table = Table(title=f"kvsim plan --tune: engine settings that raise the safe {'concurrency' if unit == 'clients' else 'rate'} (vLLM flags)")
    for i, c in enumerate(["policy", f"safe {unit} at the scenario's settings", f"tuned safe {unit}", "gain",
                           "vllm serve flags", "binds then", "tried"]):
        table.add_column(c, justify="right" if i in (1, 2, 3) else "left", no_wrap=i in (0, 4))
    for t in result.tuning:
        tried = ", ".join(f"{x['max_num_seqs']}/{x['max_num_batched_tokens']}: {_num(x['safe_rate'])}"
                          + ("" if x["kept"] else " (not kept)") for x in t.tried) or "– (nothing to change)"
        table.add_row(t.policy, _num(t.baseline_safe_rate), _num(t.safe_rate), _num(t.gain, pct=True), t.flags(),
                      t.binding or "–", tried)
    table.caption = f"tried: max_num_seqs/max_num_batched_tokens: safe {unit}"
    return table


def deploy_lines(result) -> list[str]:
    m = result.meta
    lines = [f"{m['model']}, target {result.target_rate:g} req/s; " + slo_text(m["slo"]),
             f"policies compared per GPU and TP (one replica, coarse): {', '.join(m['policies'])}; "
             f"{len(m['seeds'])} seeds × {m['num_requests']:,} requests a point and a "
             f"{m['long_run_requests']:,}-request run must sustain the target, whatever the layout"
             + _margin_check(m) + f"; {len(result.points)} points simulated",
             f"$/M tokens at the target rate ({m['mean_prompt_tokens']:.0f} input, {m['mean_output_tokens']:.0f} "
             f"output tokens a request on average), each charging the whole hour"]
    if m.get("from_closed_loop"):
        lines.insert(1, "the scenario's closed loop planned as its requests arriving at the target rate (Poisson, "
                        "no client limit: vllm bench serve --request-rate without --max-concurrency)")
    if m.get("replications_note"):
        lines.append(f"only {len(m['seeds'])} of the {m['seeds_asked']} seeds asked can differ: {m['replications_note']}")
    if result.deployments:
        d = result.deployments[0]
        lines.append(f"cheapest: {d.answer()}, ${d.usd_per_m_output:.3f} per million output tokens"
                     + ("" if d.safe_rate is None else f"; safe up to {d.safe_rate:.3g} req/s ({d.headroom:+.0%})")
                     + f"; {d.pricing}")
        if d.pricing == "estimated":
            sure = next((x for x in result.deployments if x.pricing == "measured"), None)
            lines.append(f"ESTIMATED: the cheapest rests on {d.pricing_why}; treat it as a lead to measure, not an "
                         "answer" + ("" if sure is None else f". Cheapest measured: {sure.answer()}"))
        lines.append(f"run it: {d.num_replicas} × vllm serve {m['model']} {d.vllm_flags}".rstrip()
                     + (" (behind one load balancer)" if d.num_replicas > 1 else ""))
    else:
        lines.append("no layout meets the SLO at the target rate")
    return lines


def skipped_line(skipped: list[dict], what: str = "layouts") -> str:
    """One line: how many layouts were left out, counted by why (plan.json lists each with its reason)."""
    from kvsim.planning.deploy import SKIP_KINDS, skip_counts

    if not skipped:
        return ""
    kinds = ", ".join(f"{n} {SKIP_KINDS.get(kind, kind)}" for kind, n in skip_counts(skipped).items())
    return f"{len(skipped)} {what} left out: {kinds} (each with its reason in plan.json: --out DIR)"


def deploy_table(result) -> Table:
    table = Table(title=f"kvsim plan: deployments for {result.target_rate:g} req/s, cheapest first")
    cols = ["GPU", "layout × replicas", "GPUs", "policy", "safe req/s", "knee: mean (95% CI)", "$/hour", "$/M in",
            "$/M out", "headroom", "binds", "priced"]
    for i, c in enumerate(cols):
        table.add_column(c, justify="left" if i in (0, 1, 3, 10, 11) else "right", no_wrap=i < 4)
    for d in result.deployments:
        knee = "–" if d.mean_rate is None else f"{_num(d.mean_rate)} ({_num(d.ci_low)}–{_num(d.ci_high)})"
        table.add_row(d.gpu, f"{d.layout_name} × {d.num_replicas}", str(d.num_gpus), d.policy,
                      _num(d.safe_rate) if d.safe_rate is not None else f"≥{result.target_rate:g}",
                      knee, _num(d.usd_per_hour), _num(d.usd_per_m_input, 3), _num(d.usd_per_m_output, 3),
                      _num(d.headroom, pct=True), d.binding or "–", d.pricing or "–")
    table.caption = "priced: measured (vLLM kernels timed on the GPU, or a calibration of its own) or estimated " \
                    "(its datasheet at H100 efficiencies, or layers no table times): plan.json says why"
    return table


def pd_lines(result) -> list[str]:
    """A disaggregated plan's opening lines and its verdict: aggregated or disaggregated, which ratio."""
    m = result.meta
    link = m["link"]
    lines = [f"{m['model']}, target {result.target_rate:g} req/s; " + slo_text(m["slo"]),
             f"policies searched: disaggregated {', '.join(m['policies'])}; aggregated "
             f"{', '.join(m['aggregated_policies'])} (each layout keeps its cheapest)",
             f"KV over {link['preset']}" + (f" at {link['bandwidth_gbps']:g} GB/s" if link.get("bandwidth_gbps") else "")
             + f", {m['kv_transfer'].replace('_', ' ')}; {len(m['seeds'])} seeds × {m['num_requests']:,} requests a "
             f"point and a {m['long_run_requests']:,}-request run must sustain the target, whatever the layout"
             + _margin_check(m) + f"; {len(result.points) + len(result.aggregated.points)} points simulated",
             "answer: " + result.verdict()]
    if m.get("from_closed_loop"):
        lines.insert(1, "the scenario's closed loop planned as its requests arriving at the target rate (Poisson, "
                        "no client limit: vllm bench serve --request-rate without --max-concurrency)")
    if m.get("replications_note"):
        lines.append(f"only {len(m['seeds'])} of the {m['seeds_asked']} seeds asked can differ: {m['replications_note']}")
    if result.estimated_note():
        lines.append(result.estimated_note())
    return lines


def _margin_check(meta: dict) -> str:
    scale = meta.get("safe_check_step_time_scale", 1.0)
    return "" if scale == 1.0 else f", with every step {scale - 1:.0%} slower than priced"


def cell_text(column: str, value) -> str:
    """A table record's value as the terminal shows it: $ to 2 decimals ($/M to 3), TTFT and E2E in whole ms,
    TPOT and ITL to 0.1 ms."""
    if isinstance(value, str):
        return value
    if column.startswith("$"):
        return _num(value, 3 if "/M" in column else 2)
    if column.startswith(("TTFT", "E2E")):
        return _num(value, 0)
    if column.startswith(("TPOT", "ITL")):
        return _num(value, 1)
    return "–" if value is None else str(value)


def pd_table(result) -> Table:
    """The best disaggregated layouts (cheapest first) beside the best aggregated one: `PDPlan.table()`."""
    table = Table(title=f"kvsim plan: disaggregated vs aggregated for {result.target_rate:g} req/s, cheapest first")
    rows = result.table()
    cols = list(rows[0]) if rows else ["serving", "policy", "prefill", "decode", "GPUs", "$/hour"]
    left = {"serving", "policy", "prefill", "decode", "prefill binds", "decode binds", "priced"}
    for c in cols:
        table.add_column(c, justify="left" if c in left else "right", no_wrap=c in ("serving", "policy", "prefill"))
    for row in rows:
        table.add_row(*(cell_text(c, row[c]) for c in cols))
    table.caption = ("latencies at the target at the SLO's percentile, the seeds' mean as checked (every step "
                     f"{result.meta.get('safe_check_step_time_scale', 1.0) - 1:.0%} dearer); priced: measured or "
                     "estimated step times (an estimated pool makes its layout estimated): plan.json says why")
    return table
