"""Energy per output token against ML.ENERGY Leaderboard v3.0 (Llama 3.1 on H100, vLLM 0.11.1).

    python benchmarks/energy_mlenergy.py            # fit on 8B, check 8B and 70B, write the results
    python benchmarks/energy_mlenergy.py --check    # only check with the shipped coefficients
    python benchmarks/energy_mlenergy.py --tables   # the Markdown again from the JSON

ML.ENERGY v3.0 ("LLM Inference Energy: A Longitudinal Analysis", ml.energy blog, 2026-02-09; the
points read off its figures' SVG data: github.com/ml-energy/blog, docs/posts/assets/llm-energy-over-time)
ran each model on H100 SXM with vLLM 0.11.1 (async scheduling, max_num_batched_tokens 8192,
max_model_len 20480) over 1,024 LMArena chat requests sent at once, max_num_seqs the batch size, and
measured GPU energy and output tokens in the steady state. Here: the same engine settings and a
chat-like workload (prompts lognormal, mean 200 tokens; outputs lognormal, mean 700, as the
leaderboard's Text Conversation task's mean output of 627-717), closed-loop B clients with every
request ready at once; the steady state as the difference of runs of 2N and N requests (the ramps
cancel). The meter's busy HBM and tensor-core utilisation (kvsim.perf.energy.StepWork over kvsim's
own step times) are regressed on the measured average GPU power of the 8B curve (active, memory and
compute watts; idle 70 W fixed); the 70B-on-4-GPUs curve is held out. Steps are priced with vLLM
0.14.0's kernel tables, the shipped release nearest the leaderboard's 0.11.1. Results:
benchmarks/results/energy_mlenergy.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ML.ENERGY v3.0 (V3 series of the longitudinal post's figures): batch -> (avg GPU power W all GPUs,
# output tokens/s, J per output token)
MLENERGY = {
    "Llama-3.1-8B": {"gpus": 1, "points": {
        16: (513.3, 1953.6, 0.2627), 32: (559.7, 3391.1, 0.1651), 64: (610.3, 5147.2, 0.1186),
        96: (644.0, 6260.1, 0.1029), 128: (669.2, 7036.5, 0.0951), 192: (688.3, 8223.3, 0.0837),
        256: (690.5, 9009.6, 0.0766), 384: (686.5, 9248.0, 0.0742), 512: (688.3, 9805.6, 0.0702)}},
    "Llama-3.1-70B": {"gpus": 4, "points": {
        16: (1803.8, 862.6, 2.091), 32: (1794.2, 1486.7, 1.2069), 64: (2001.5, 2510.5, 0.7972),
        96: (2101.5, 3244.3, 0.6478), 128: (2183.8, 3876.3, 0.5634), 192: (2293.1, 4461.2, 0.514),
        256: (2354.3, 4915.1, 0.479), 384: (2343.5, 5318.8, 0.4406), 512: (2492.9, 5921.3, 0.421)}},
}
FIT_MODEL = "Llama-3.1-8B"

SCENARIO = """
name = "mlenergy"
[model]
name = "{model}"
[hardware]
gpu = "H100-SXM"
tensor_parallel_size = {tp}
[engine]
max_num_seqs = {batch}
max_num_batched_tokens = 8192
max_model_len = 20480
async_scheduling = true
vllm_version = "0.14.0"
[[policies]]
name = "paged"
[workload]
seed = 3
num_requests = {n}
max_concurrency = {batch}
arrival = {{ process = "immediate" }}
prompt_len = {{ dist = "lognormal", mean = 200, sigma = 1.0, max = 4096 }}
output_len = {{ dist = "lognormal", mean = 700, sigma = 0.8, min = 16, max = 4096 }}
[energy]
[output]
report_html = false
"""


def steady(model: str, tp: int, batch: int) -> dict:
    """The saturated window's figures: every request ready at once, B clients, over the window while
    clients keep sending (Metrics' arrival window; the drain after the last send left out)."""
    from kvsim.pipeline import run_scenario
    from kvsim.scenario.config import scenario_from_toml

    sc = scenario_from_toml(SCENARIO.format(model=model, tp=tp, batch=batch, n=max(1024, 6 * batch)), "<mlenergy>", ROOT)
    w = run_scenario(sc, write=False).summaries["paged"]["energy"]["window"]
    return {"tokens_per_s": w["output_tokens_per_s"], "u_mem": w["busy_hbm_utilization"],
            "u_comp": w["busy_compute_utilization"], "gpu_w": w["mean_busy_gpu_power_w"],
            "j_per_token": w["gpu_joules_per_output_token"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check the shipped coefficients")
    ap.add_argument("--tables", action="store_true", help="only rewrite the Markdown from the JSON")
    args = ap.parse_args()
    if args.tables:
        return rewrite()
    from kvsim.perf.energy import GPU_POWER

    rows = {}
    for model, ref in MLENERGY.items():
        for batch in ref["points"]:
            rows[(model, batch)] = steady(model, ref["gpus"], batch)
            print(model, batch, {k: round(v, 4) for k, v in rows[(model, batch)].items()}, flush=True)
    p = GPU_POWER["H100-SXM"]
    fit = None
    if not args.check:  # least squares on the 8B points under the board power (those at it say only 'capped')
        pts = [(b, r) for (m, b), r in rows.items() if m == FIT_MODEL and MLENERGY[m]["points"][b][0] < 0.97 * p.tdp_w]
        # HBM's share is not identifiable here (every point streams the weights at a similar utilisation):
        # it is fixed at HBM3's ~4 pJ/bit at 3.35 TB/s, about 110 W (memory_w, an estimate); active and
        # compute watts are fitted, non-negative
        A = np.array([[1.0, r["u_comp"]] for _, r in pts])
        y = np.array([MLENERGY[FIT_MODEL]["points"][b][0] - p.idle_w - p.memory_w * r["u_mem"] for b, r in pts])
        (active_w, compute_w), *_ = np.linalg.lstsq(A, y, rcond=None)
        fit = (max(0.0, active_w), p.memory_w, max(0.0, compute_w))
        print("fit active, memory (fixed), compute W:", np.round(fit, 1))
    active, mem, comp = fit if fit is not None else (p.active_w, p.memory_w, p.compute_w)
    table = []
    for (model, batch), r in rows.items():
        gpus, (pw, tput, jpt) = MLENERGY[model]["gpus"], MLENERGY[model]["points"][batch]
        power = min(p.tdp_w, p.idle_w + active + mem * r["u_mem"] + comp * r["u_comp"])
        # with the shipped coefficients, the meter's own figure (its limit applied event by event)
        j = power * gpus / r["tokens_per_s"] if fit is not None else r["j_per_token"]
        if fit is None:
            power = r["gpu_w"]
        table.append({"model": model, "gpus": gpus, "batch": batch, "measured_w_per_gpu": pw / gpus, "model_w": power,
                      "measured_tokens_per_s": tput, "kvsim_tokens_per_s": r["tokens_per_s"],
                      "measured_j_per_token": jpt, "kvsim_j_per_token": j, "error": j / jpt - 1,
                      "u_mem": r["u_mem"], "u_comp": r["u_comp"], "in_fit": model == FIT_MODEL})
    write(table, {"idle_w": p.idle_w, "active_w": float(active), "memory_w": float(mem), "compute_w": float(comp)},
          fitted=fit is not None)


def write(table: list, coefficients: dict, fitted: bool) -> None:
    """benchmarks/results/energy_mlenergy.{json,md}."""
    out = ROOT / "benchmarks" / "results"
    (out / "energy_mlenergy.json").write_text(json.dumps({"coefficients": coefficients, "fitted_here": fitted,
                                                        "rows": table}, indent=1) + "\n")
    lines = ["| model | GPUs | batch | measured W/GPU | kvsim W/GPU | measured tok/s | kvsim tok/s | measured J/tok | "
             "kvsim J/tok | error | power alone: kvsim W at measured tok/s | in fit |", "|" + " --- |" * 12]
    for t in table:
        alone = t["model_w"] * t["gpus"] / t["measured_tokens_per_s"]
        lines.append(f"| {t['model']} | {t['gpus']} | {t['batch']} | {t['measured_w_per_gpu']:.0f} | {t['model_w']:.0f} | "
                     f"{t['measured_tokens_per_s']:.0f} | {t['kvsim_tokens_per_s']:.0f} | {t['measured_j_per_token']:.3f} | "
                     f"{t['kvsim_j_per_token']:.3f} | {t['error']:+.1%} | {alone:.3f} ({alone / t['measured_j_per_token'] - 1:+.1%}) | "
                     f"{'yes' if t['in_fit'] else 'no'} |")
    c = coefficients
    lines += ["", f"Coefficients ({'fitted by this run' if fitted else 'as shipped in kvsim.perf.energy'}): idle "
              f"{c['idle_w']:g} W, active {c['active_w']:.0f} W, memory {c['memory_w']:.0f} W x HBM utilisation, compute "
              f"{c['compute_w']:.0f} W x tensor-core utilisation, at most 700 W. kvsim J/tok is the meter's own figure "
              "(summary.json energy.window) when the coefficients are the shipped ones. J/tok = power x GPUs / "
              "throughput: the last column keeps the measured throughput, so it isolates the power model's error from "
              "the step-time model's."]
    print("\n".join(lines))
    (out / "energy_mlenergy.md").write_text("\n".join(lines) + "\n")


def rewrite() -> None:
    """The tables again from the JSON (no simulation)."""
    got = json.loads((ROOT / "benchmarks" / "results" / "energy_mlenergy.json").read_text())
    write(got["rows"], got["coefficients"], got.get("fitted_here", False))


if __name__ == "__main__":
    main()
