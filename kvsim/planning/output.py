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
from kvsim.results.report import slo_text
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


def write_outputs(out_dir: Path, files: dict[str, str], scenario=None, force: bool = False) -> Path:
    """The files into `out_dir`, all or nothing, replacing only an earlier kvsim folder unless
    `force` (never one holding the scenario's inputs): kvsim.results.writer.ResultsWriter."""
    from kvsim.pipeline import input_paths

    inputs = input_paths(scenario) if scenario is not None else ()
    writer = ResultsWriter(out_dir, force=force, inputs=inputs, streams=False)
    with writer:
        return writer.commit_files(files)


def check_out(out_dir: Path, scenario, force: bool = False) -> None:
    """Refuse now, before any simulation, a folder that `write_outputs` would refuse at the end."""
    from kvsim.results.writer import check_target, results_path
    from kvsim.pipeline import input_paths

    check_target(results_path(out_dir), force, input_paths(scenario))


def plan_files(result) -> dict[str, str]:
    """plan.json (the whole answer), plan.csv (a row per policy or deployment), points.csv: name -> text."""
    doc = result.to_dict()
    points = doc.pop("points")
    return {"plan.json": json_text(doc), "plan.csv": csv_text(result.rows()), "points.csv": csv_text(points)}


def write_plan(out_dir: Path, result, scenario=None, force: bool = False) -> Path:
    """`plan_files` into `out_dir` (see write_outputs)."""
    return write_outputs(out_dir, plan_files(result), scenario, force)


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


def _there(p, unit: str) -> str:
    """A closed loop's throughput at its safe concurrency."""
    rps = p.at_safe_rate.get("throughput_rps") if unit == "clients" else None
    return "" if rps is None else f", {rps:.3g} req/s there"


def plan_lines(result) -> list[str]:
    m = result.meta
    unit = load_unit(m)
    closed = unit == "clients"
    load = (f"a closed loop of {m['scenario_rate']:g} clients" if closed
            else f"scenario rate {m['scenario_rate']:.3g} {unit}")
    lines = [f"{m['model']} on {m['gpu']}, TP {m['tensor_parallel_size']} × {m['num_replicas']} replica"
             f"{'s' if m['num_replicas'] > 1 else ''}; {load}",
             slo_text(m["slo"]) + ("; sustainable = SLO met (clients wait for their replies: a closed loop cannot "
                                   "fall behind)" if closed else
                                   f"; sustainable = SLO met and backlog ≤ {m['stability_tolerance']:.0%} at the last arrival"),
             f"{len(m['seeds'])} seeds × {m['num_requests']:,} requests a point, ±{m['resolution']:.0%} "
             f"{'concurrency' if closed else 'rate'} resolution; {len(result.points)} points simulated; safe = every "
             f"seed and a {m.get('long_run_requests', 0):,}-request run sustainable there" + _margin_text(m)]
    basis = m.get("pricing_basis")
    if basis:
        lines.append(f"priced: {basis['label'].upper() if basis['label'] == 'estimated' else basis['label']} "
                     f"({basis['why']})")
    for p in result.policies:
        if p.safe_rate == 0:
            lowest = min(pt["rate"] for pt in result.points if pt["policy"] == p.policy)
            lines.append(f"{p.policy}: no safe {'concurrency' if closed else 'rate'} found, down to {lowest:.3g} {unit} "
                         f"(requests alone miss the SLO; at the knee: {p.binding_detail})")
    groups = [g for g in ties([p for p in result.policies if p.safe_rate > 0])]
    if groups:
        best = groups[0][0]
        lines.append(f"best: {best.policy}, safe at {best.safe_rate:.3g} {unit}{_there(best, unit)} "
                     f"({best.headroom:+.0%} against the scenario's {'clients' if closed else 'rate'}; knee "
                     f"{best.mean_rate:.3g}, 95% CI {best.ci_low:.3g}–{best.ci_high:.3g}); binds at the knee: "
                     f"{best.binding_detail}")
        if len(groups[0]) > 1:
            lines.append("tied with it (95% intervals overlap, the seeds cannot tell them apart): "
                         + ", ".join(f"{p.policy} (safe {p.safe_rate:.3g}, CI {p.ci_low:.3g}–{p.ci_high:.3g})"
                                     for p in groups[0][1:]))
    for p in result.policies:
        iv = p.safe_rate_interval
        if iv and p.safe_rate > 0:
            lines.append(f"{p.policy}: safe rate {p.safe_rate:.3g} {unit}; on real runs like this "
                         f"{iv['low']:.3g}–{iv['high']:.3g} {unit} ({iv['text']})")
    return lines


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
    labels = ["policy", f"safe {unit}", *(["req/s at safe"] if closed else []), "knee: mean (95% CI)", "tied with",
              "headroom", f"at scenario {'clients' if closed else 'rate'}", *(c[1] for c in slo_cols), "binds at the knee"]
    left = {0, labels.index("tied with"), labels.index("tied with") + 2, len(labels) - 1}
    for i, label in enumerate(labels):
        table.add_column(label, justify="left" if i in left else "right", no_wrap=i == 0)
    for p in result.policies:
        more = ">" if p.censored else ""
        table.add_row(p.policy, _num(p.safe_rate, 0 if closed else 2),
                      *([_num(p.at_safe_rate.get("throughput_rps"))] if closed else []),
                      f"{more}{_num(p.mean_rate)} ({_num(p.ci_low)}–{_num(p.ci_high)})",
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
             f"{m['long_run_requests']:,}-request run must sustain the target; {len(result.points)} points simulated",
             f"$/M tokens at the target rate ({m['mean_prompt_tokens']:.0f} input, {m['mean_output_tokens']:.0f} "
             f"output tokens a request on average), each charging the whole hour"]
    if m.get("from_closed_loop"):
        lines.insert(1, "the scenario's closed loop planned as its requests arriving at the target rate (Poisson, "
                        "no client limit: vllm bench serve --request-rate without --max-concurrency)")
    if result.deployments:
        d = result.deployments[0]
        lines.append(f"cheapest: {d.answer()}, ${d.usd_per_m_output:.3f} per million output tokens"
                     + ("" if d.safe_rate is None else f"; safe up to {d.safe_rate:.3g} req/s ({d.headroom:+.0%})")
                     + f"; {d.pricing}")
        if d.pricing == "estimated":
            sure = next((x for x in result.deployments if x.pricing == "measured"), None)
            lines.append(f"ESTIMATED: the cheapest rests on {d.pricing_why}; treat it as a lead to measure, not an "
                         "answer" + ("" if sure is None else f". Cheapest measured: {sure.answer()}"))
    else:
        lines.append("no layout meets the SLO at the target rate")
    return lines


def deploy_table(result) -> Table:
    table = Table(title=f"kvsim plan: deployments for {result.target_rate:g} req/s, cheapest first")
    cols = ["GPU", "TP × replicas", "GPUs", "policy", "safe req/s", "knee: mean (95% CI)", "$/hour", "$/M in",
            "$/M out", "headroom", "binds", "priced"]
    for i, c in enumerate(cols):
        table.add_column(c, justify="left" if i in (0, 1, 3, 10, 11) else "right", no_wrap=i < 4)
    for d in result.deployments:
        knee = "–" if d.mean_rate is None else f"{_num(d.mean_rate)} ({_num(d.ci_low)}–{_num(d.ci_high)})"
        table.add_row(d.gpu, f"{d.layout} × {d.num_replicas}", str(d.num_gpus), d.policy,
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
    lines = [f"{m['model']}, target {result.target_rate:g} req/s, policy {m['policy']}; " + slo_text(m["slo"]),
             f"KV over {link['preset']}" + (f" at {link['bandwidth_gbps']:g} GB/s" if link.get("bandwidth_gbps") else "")
             + f", {m['kv_transfer'].replace('_', ' ')}; {len(m['seeds'])} seeds × {m['num_requests']:,} requests a "
             f"point and a {m['long_run_requests']:,}-request run must sustain the target; "
             f"{len(result.points) + len(result.aggregated.points)} points simulated",
             "answer: " + result.verdict()]
    if m.get("from_closed_loop"):
        lines.insert(1, "the scenario's closed loop planned as its requests arriving at the target rate (Poisson, "
                        "no client limit: vllm bench serve --request-rate without --max-concurrency)")
    if result.estimated_note():
        lines.append(result.estimated_note())
    return lines


def pd_table(result) -> Table:
    """The best disaggregated layouts (cheapest first) beside the best aggregated one."""
    table = Table(title=f"kvsim plan: disaggregated vs aggregated for {result.target_rate:g} req/s, cheapest first")
    cols = ["serving", "prefill", "decode", "GPUs", "$/hour", "$/M in", "$/M out", "TTFT p ms", "TPOT p ms",
            "prefill binds", "decode binds", "priced"]
    for i, c in enumerate(cols):
        table.add_column(c, justify="left" if i in (0, 1, 2, 9, 10, 11) else "right", no_wrap=i < 3)
    for d in result.deployments:
        tight = {"prefill": " (one fewer fails)" if d.prefill_tight else "",
                 "decode": " (one fewer fails)" if d.decode_tight else ""}
        table.add_row("disaggregated", f"{d.num_prefill} × {d.prefill_gpu} TP {d.prefill_tp}",
                      f"{d.num_decode} × {d.decode_gpu} TP {d.decode_tp}", str(d.num_gpus), _num(d.usd_per_hour),
                      _num(d.usd_per_m_input, 3), _num(d.usd_per_m_output, 3), _num(d.at_target.get("ttft_ms_at_pct"), 0),
                      _num(d.at_target.get("tpot_ms_at_pct"), 0), (d.prefill_binding or "–") + tight["prefill"],
                      (d.decode_binding or "–") + tight["decode"], d.pricing or "–")
    for a in result.aggregated.deployments[:1]:
        table.add_row("aggregated", f"{a.num_replicas} × {a.gpu} TP {a.tensor_parallel_size} (both phases)", "",
                      str(a.num_gpus), _num(a.usd_per_hour), _num(a.usd_per_m_input, 3), _num(a.usd_per_m_output, 3),
                      _num(a.at_target.get("ttft_ms_at_pct"), 0), _num(a.at_target.get("tpot_ms_at_pct"), 0),
                      a.binding or "–", "", a.pricing or "–")
    table.caption = "priced: measured or estimated step times (an estimated pool makes its layout estimated): " \
                    "plan.json says why"
    return table
