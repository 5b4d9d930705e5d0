"""`kvsim plan --speculative-k` on two chat workloads: does speculation raise capacity, and where does it stop paying?

    python benchmarks/spec_plan.py     # writes benchmarks/results/spec_plan.{md,json}

Llama-3.1-8B on one H100 (measured kernels), a chat workload (prompts lognormal mean 600, replies
lognormal mean 300), SLO p90 TTFT <= 1 s and TPOT <= 25 ms; one seed, 800 requests a point, +-5% rate
resolution (a quick plan: the seeds' noise is wide, and the plan says when the knees tie).
1. EAGLE with SpecDecode-Bench's ShareGPT acceptance (kvsim.perf.acceptance), k = 1..5.
2. EAGLE-3 with a poor i.i.d. acceptance of 0.35 a draft, k = 1..3: the verify pass's extra rows
   cost about what the accepted drafts give at the knee.
3. EAGLE-3 with an acceptance of 0.2 and only k = 2 or 3 offered: speculation that stops paying
   below the knee.
4. EAGLE-3 with an acceptance of 0.1 and only k = 3 or 4 offered: speculation that never pays.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE = """
name = "spec-plan"
[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100-SXM"
[engine]
max_model_len = 8192
[[policies]]
name = "paged"
[workload]
seed = 1
num_requests = 800
arrival = { process = "poisson", rate = 8.0 }
prompt_len = { dist = "lognormal", mean = 600, sigma = 0.8, max = 6000 }
output_len = { dist = "lognormal", mean = 300, sigma = 0.8, max = 2000 }
[slo]
percentile = 90
ttft_ms = 1000
tpot_ms = 25
[energy]
[output]
report_html = false
[speculative]
num_speculative_tokens = 3  # the k searched replace it
"""
CASES = {
    "EAGLE, ShareGPT acceptance (SpecDecode-Bench)": ('method = "eagle"\ndataset = "sharegpt"\n', [1, 2, 3, 4, 5]),
    "EAGLE-3, i.i.d. acceptance 0.35": ('method = "eagle3"\nacceptance_rate = 0.35\n', [1, 2, 3]),
    "EAGLE-3, i.i.d. acceptance 0.2, k = 2 or 3": ('method = "eagle3"\nacceptance_rate = 0.2\n', [2, 3]),
    "EAGLE-3, i.i.d. acceptance 0.1, k = 3 or 4": ('method = "eagle3"\nacceptance_rate = 0.1\n', [3, 4]),
}


def main() -> None:
    from kvsim.planning.speculation import speculation_plan
    from kvsim.scenario.config import scenario_from_toml

    out, lines = {}, []
    for name, (spec, ks) in CASES.items():
        sc = scenario_from_toml(BASE + spec, "<spec_plan>", ROOT)
        result = speculation_plan(sc, ks, seeds=1, resolution=0.05, num_requests=800, workers=2)
        d = result.to_dict()
        out[name] = {"policies": [{k: p[k] for k in ("policy", "safe_rate", "ci_low", "ci_high")} for p in d["policies"]],
                     "speculation": d["speculation"]}
        pay = d["speculation"]["payoffs"][0]
        lines += [f"## {name}", "", "| variant | safe req/s | knee 95% CI |", "| --- | --- | --- |"]
        lines += [f"| {p['policy']} | {p['safe_rate']:.3g} | {p['ci_low']:.3g}-{p['ci_high']:.3g} |" for p in d["policies"]]
        lines += ["", f"Verdict: {pay['verdict']}", "",
                  f"| load req/s | fraction of the speculation-free safe rate | TPOT p90 ms off | k={pay['best_k']} | "
                  "J per output token off | spec | mean acceptance length |", "|" + " --- |" * 7]
        for r in pay["loads"]:
            lines.append(f"| {r['rate']:.3g} | {r['fraction_of_knee']:.0%} | {r['off_tpot_ms_at_pct']:.2f} | "
                         f"{r['spec_tpot_ms_at_pct']:.2f} | {r['off_joules_per_output_token']:.3f} | "
                         f"{r['spec_joules_per_output_token']:.3f} | {r['spec_mean_acceptance_length']:.3f} |")
        lines.append("")
        print("\n".join(lines), flush=True)
    res = ROOT / "benchmarks" / "results"
    (res / "spec_plan.json").write_text(json.dumps(out, indent=1) + "\n")
    (res / "spec_plan.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
