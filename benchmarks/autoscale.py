"""Autoscaling benchmarks (issue 29): the tables of benchmarks/results/autoscale.md, printed.

    python benchmarks/autoscale.py                          # every row
    python benchmarks/autoscale.py --only speed --repeat 2
    python benchmarks/autoscale.py --only day,startup --start 21600 --end 43200

Rows:
- speed: scenarios/autoscale/day_hpa.toml's whole day (24 h at 20 req/s on average, ~1.73 million
  requests, 2-14 replicas), `python -m kvsim run ... --quiet` in a fresh process (CPU seconds:
  user + system, wall, peak RSS, engine events from summary.json), paired in the same session with
  sim_speed's synthetic workload on one replica (`--million-requests`, default 200,000): the
  per-request CPU ratio, the figure a shared machine keeps.
- day: the four shipped autoscalers (HPA, KEDA, WVA, SLO-aware) over a slice of the day (default
  06:00-12:00: the morning ramp and the 09:00 burst): attainment, windows meeting the target,
  replica-hours, $, $ per million tokens, replicas; beside the static pool at the peak and the lower
  bound for the same slice (kvsim.planning.autoscale), every figure from one run.
- plan: `python -m kvsim plan day_hpa.toml --set workload.start_s=... --autoscale --workers 2` on the
  slice (the default grid: 8 settings): CPU and wall of the whole command, the answer.
- startup: the default startup delay's parts for the shipped day's replica and for a 65 GB
  checkpoint (Qwen3-32B in bfloat16 at TP 2, the model of llm-d's SLO-aware guide), beside llm-d's
  published pod-ready times (~100 s with a torch.compile cache, ~135 s without). Reported, not fitted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
DAYS = ("day_hpa", "day_keda", "day_wva", "day_slo_aware")


def fresh(args: list[str], cwd: Path) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MiB) of `python -m kvsim ARGS` in a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"kvsim {' '.join(args)} failed: {proc.stderr.read()}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def speed(repeat: int, million: int) -> list[str]:
    from sim_speed import SYNTHETIC

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        synth = Path(tmp) / "synthetic.toml"
        synth.write_text(SYNTHETIC.format(n=million))
        for i in range(repeat):
            day = fresh(["run", "scenarios/autoscale/day_hpa.toml", "--quiet", "--out", f"{tmp}/day{i}"], ROOT)
            s = json.loads((Path(tmp) / f"day{i}" / "summary.json").read_text())["policies"]["paged"]
            one = fresh(["run", str(synth), "--quiet", "--out", f"{tmp}/one{i}"], ROOT)
            n_day, n_one = s["requests"]["received"], million
            ratio = (day[0] / n_day) / (one[0] / n_one)
            load = os.getloadavg()[0]
            rows.append(f"| {i + 1} | {n_day:,} | {s['engine_events']:,} | {day[0]:.1f} | {day[1]:.1f} | {day[2]:.0f} | "
                        f"{s['autoscaling']['replicas']['min']}-{s['autoscaling']['replicas']['peak']} | {n_one:,} | "
                        f"{one[0]:.1f} | {day[0] / n_day * 1e6:.0f} / {one[0] / n_one * 1e6:.0f} | {ratio:.2f} | "
                        f"{load:.1f} |")
    head = ("| repeat | day requests | engine events | day CPU s | day wall s | day RSS MiB | replicas | one-replica "
            "requests | one-replica CPU s | CPU us/request (day / one replica) | per-request ratio | load |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    return [head, *rows]


def day_slice(start: float, end: float) -> list[str]:
    from kvsim.planning.autoscale import day_record, lower_bound, static_scenario, window_counts
    from kvsim.planning.executors import InlineExecutor
    from kvsim.scenario.config import load_scenario

    sets = [f"workload.start_s={start:g}", f"workload.duration_s={end:g}"]
    scenarios = {name: load_scenario(ROOT / "scenarios" / "autoscale" / f"{name}.toml", sets) for name in DAYS}
    base = scenarios["day_hpa"]
    auto = base.autoscaling
    target = base.slo.percentile / 100
    rows = []
    t0 = time.process_time()
    for name, sc in scenarios.items():
        r = day_record(sc, "paged", None)
        rows.append(_row(name, r))
    days_cpu = time.process_time() - t0
    counts, first, last = window_counts(base, auto.window_s)
    t0 = time.process_time()
    used = lower_bound(InlineExecutor(), base, "paged", counts, auto.window_s, first, last, target,
                       2 * auto.max_replicas, lambda: None)
    bound_cpu = time.process_time() - t0
    static_n = max(w.replicas or 2 * auto.max_replicas for w in used)
    static = day_record(static_scenario(base, static_n), "paged", None)
    rows.append(_row(f"static pool at the peak ({static_n})", static))
    from kvsim.results.fleet import cost_figures
    from kvsim.scenario.catalog import gpu_price

    hours = sum((w.replicas or 0) * (w.end - w.start) for w in used) / 3600
    usd = cost_figures(hours, base.hardware.tensor_parallel_size, gpu_price(base, base.hardware.gpu), 0, 0)["usd"]
    rows.append(f"| lower bound (fewest replicas per {auto.window_s:g} s window) | – | – | {hours:.1f} | ${usd:,.0f} | – | "
                f"{min(w.replicas or 0 for w in used)}-{max(w.replicas or 0 for w in used)} |")
    head = ("| autoscaler | attainment | windows meeting the target | replica-hours | $ | $ per M tokens | replicas |\n"
            "| --- | --- | --- | --- | --- | --- | --- |")
    note = (f"Slice {start / 3600:g}:00-{end / 3600:g}:00 ({sum(counts):,} requests), target {target:.0%} of requests "
            f"meeting every per-request bound; CPU: the four days {days_cpu:.0f} s, the lower bound's searches "
            f"{bound_cpu:.0f} s (windows: " + ", ".join(f"{w.start / 3600:g} h: {w.replicas}" for w in used) + ").")
    return [head, *rows, "", note]


def _row(name: str, r: dict) -> str:
    reps = r["replicas"]
    return (f"| {name} | {r['attainment']:.2%} | {r['windows_meeting_target']} of {r['num_windows']} | "
            f"{r['replica_hours']:.1f} | ${r['usd']:,.0f} | ${r['usd_per_m_tokens']:.3f} | {reps['min']}-{reps['peak']} |")


def plan(start: float, end: float) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["plan", "scenarios/autoscale/day_hpa.toml", "--set", f"workload.start_s={start:g}", "--set",
                f"workload.duration_s={end:g}", "--autoscale", "--workers", "2", "--quiet", "--out", f"{tmp}/plan"]
        cpu_self = time.process_time()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        usage = os.times()
        if proc.returncode:
            raise SystemExit(proc.stderr)
        doc = json.loads((Path(tmp) / "plan" / "plan.json").read_text())
    cpu = usage.children_user + usage.children_system
    best = doc["candidates"][doc["best"]] if doc["best"] is not None else None
    table = ["| setting | meets the target | attainment | $ | replica-hours | replicas | stopped early |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in doc["candidates"]:
        reps = c.get("replicas") or {}
        table.append(f"| {', '.join(f'{k}={v}' for k, v in c['settings'].items())} | {c['meets_target']} | "
                     + ("–" if c.get("attainment") is None else f"{c['attainment']:.2%}") + " | "
                     + ("–" if c.get("usd") is None else f"${c['usd']:,.0f}") + " | "
                     + ("–" if c.get("replica_hours") is None else f"{c['replica_hours']:.1f}") + " | "
                     + (f"{reps['min']}-{reps['peak']}" if reps else "–") + f" | {c['stopped_early']} |")
    return table + ["", f"`python -m kvsim {' '.join(args[:-3])}`: {len(doc['candidates'])} settings, {doc['requests']:,} requests "
            f"each; wall {wall:.0f} s, CPU of the command and its workers {cpu:.0f} s (this process {cpu_self:.1f} s); "
            f"cheapest meeting the target: "
            + (f"{best['settings']} at ${best['usd']:,.0f} ({best['replica_hours']:.1f} replica-hours)" if best else "none")
            + f"; static pool {doc['static']['replicas']} replicas ${doc['static']['usd']:,.0f}; lower bound "
              f"${doc['lower']['usd']:,.0f}; load average {os.getloadavg()[0]:.1f} at the end."]


def startup() -> list[str]:
    from kvsim.perf.startup import startup_delay
    from kvsim.scenario.autoscaling import StartupConfig
    from kvsim.scenario.catalog import MODELS

    rows = ["| replica | checkpoint GB | " + " | ".join(n for n, _, _ in startup_delay(StartupConfig(), 1e9).parts)
            + " | total s | published |", "| --- | --- |" + " --- |" * 9]
    for label, nbytes, published in (("Llama-3.1-70B TP4 (the shipped day)", MODELS["Llama-3.1-70B"].weight_bytes, "–"),
                                      ("a 65 GB checkpoint (Qwen3-32B bf16, TP 2)", 65.5e9,
                                       "llm-d: ~100 s pod-ready with a compile cache, ~135 s without")):
        d = startup_delay(StartupConfig(), nbytes)
        rows.append(f"| {label} | {nbytes / 1e9:.1f} | " + " | ".join(f"{s:.1f}" for _, s, _ in d.parts)
                    + f" | {d.total_s:.1f} | {published} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="speed,day,plan,startup")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--million-requests", type=int, default=200_000)
    p.add_argument("--start", type=float, default=21_600.0)
    p.add_argument("--end", type=float, default=43_200.0)
    args = p.parse_args()
    only = set(args.only.split(","))
    sections = []
    for name, fn in (("startup", startup), ("speed", lambda: speed(args.repeat, args.million_requests)),
                     ("day", lambda: day_slice(args.start, args.end)), ("plan", lambda: plan(args.start, args.end))):
        if name in only:
            sections.append((name, fn()))
    text = "\n\n".join(f"### {name}\n\n" + "\n".join(lines) for name, lines in sections)
    print(text)


if __name__ == "__main__":
    main()
