"""Reproduce Mooncake's real-workload result (Qin et al., "Mooncake: A KVCache-centric Disaggregated
Architecture for LLM Serving", FAST 2025, section 8.1.3 and Figure 13) with kvsim's disaggregated
serving, and state the gap.

The paper: a dummy model of LLaMA2-70B's architecture; each instance one node of 8 A800-SXM4-80GB
(NVLink; RDMA up to 800 Gb/s between nodes); Mooncake-[10P+10D] (10 prefill and 10 decode
instances, KV streamed layer by layer) against vLLM-[20M] (20 aggregated vLLM instances, the
mid-2024 vLLM: prefill-first scheduling without chunked prefill, no automatic prefix caching);
real request traces replayed at their arrival times; TTFT at most 30 s and TBT at most 0.1 s a
token. Figure 13: the TTFT CDFs nearly coincide, almost 100% of requests within 30 s for both;
TBT within 0.1 s for ~100% of Mooncake's requests and 57% of vLLM's; "Mooncake can process
approximately 75% more requests while adhering to the SLOs". The paper's end-to-end experiments
judge the SLO at P90 (section 8.1, Metric).

kvsim's setup, as close as its presets allow: Llama-3.1-70B (LLaMA2-70B's layers, heads, KV heads and
MLP; a 128k vocabulary instead of 32k, and 128k context), A100-80GB with its NVLink at the A800's
400 GB/s (200 GB/s a direction), TP 8 per instance, the `mooncake-a800` link (800 Gb/s a node =
12.5 GB/s a GPU), layer-wise KV transfer; the trace is Mooncake's released conversation trace
(12,031 requests, ~59 minutes; the paper's was 23,000 requests of its own). The aggregated
baseline as the paper's vLLM (chunked prefill off, prefix caching off), and as today's vLLM V1
(chunked prefill on, prefix caching on) for reference; Mooncake with each prefill instance's own
prefix cache (its CPU/SSD KVCache pool is not modelled).

Two measurements: (1) at the trace's own rate and at the paper's trace's request rate (23,608
requests in an hour, 6.56 req/s: 1.9x ours, whose prompts are longer), the share of requests whose
TTFT is within 30 s and whose mean TBT (TPOT) is within 0.1 s, as Figure 13 plots, and the
per-token TBT at p90 and p99; (2) the highest rate each deployment sustains with TTFT p90 <= 30 s
and every token's TBT p90 <= 100 ms (the paper's 0.1 s a token, judged at P90 as its section 8.1;
kvsim plan, one seed, the whole trace a point), and the ratio disaggregated / paper's vLLM against
the paper's 1.75.

    python benchmarks/disagg_mooncake_repro.py            # writes benchmarks/results/disagg_mooncake.md
    python benchmarks/disagg_mooncake_repro.py --quick    # the first 3,000 requests
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.planning.capacity import plan  # noqa: E402
from kvsim.pipeline import run_scenario  # noqa: E402
from kvsim.scenario.config import scenario_from_dict  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "disagg_mooncake.md"
TRACE = "../traces/mooncake_conversation.jsonl"  # relative to scenarios/
PAPER = {"vllm-20M (paper's vLLM)": {"ttft_ok": "~100%", "tbt_ok": "57%", "capacity": "1 (baseline)"},
         "mooncake-10P+10D": {"ttft_ok": "~100%", "tbt_ok": "~100%", "capacity": "~1.75"}}


def scenario(name: str, policy: dict, pools: tuple[int, int] | None, num_requests: int | None):
    data = {
        "name": name,
        "model": {"name": "Llama-3.1-70B"},
        "hardware": {"gpu": "A100-80GB", "nvlink_gbps": 200.0, "tensor_parallel_size": 8, "num_replicas": 20,
                     "router": "least_loaded"},
        "engine": {"max_model_len": 131072,
                   # the paper's mid-2024 vLLM had no async scheduler; disaggregated pools run synchronously anyway
                   **({"async_scheduling": False} if not policy.get("enable_chunked_prefill", True) or pools else {})},
        "policies": [{"name": name, **policy}],
        "workload": {"arrival": {"process": "trace"}, "prompt_len": {"dist": "trace"},
                     "output_len": {"dist": "trace"},
                     "trace": {"format": "mooncake", "path": TRACE,
                               **({"max_requests": num_requests} if num_requests else {})}},
        "slo": {"percentile": 90, "ttft_ms": 30000, "tpot_ms": None, "itl_ms": 100},
        "output": {"report_html": False},
    }
    if pools:
        data["disaggregation"] = {"prefill": {"num_replicas": pools[0], "router": "prefix_affinity"},
                                  "decode": {"num_replicas": pools[1], "router": "most_free_blocks"},
                                  "link": {"preset": "mooncake-a800"}, "kv_transfer": "layerwise"}
    return scenario_from_dict(data, str(ROOT / "scenarios" / f"{name}.toml"), ROOT / "scenarios")


CONFIGS = {
    "vllm-20M (paper's vLLM)": ({"enable_chunked_prefill": False, "enable_prefix_caching": False}, None),
    "vllm-20M (vLLM V1: chunked prefill, prefix caching)": ({}, None),
    "mooncake-10P+10D": ({}, (10, 10)),
    "mooncake-15P+5D (kvsim's ratio, same 20 nodes)": ({}, (15, 5)),
}


PAPER_RATE = 23608 / 3600  # the paper's trace: requests a second


def shares(sc, rate: float | None = None) -> dict:
    """Run at the trace's own times (or time-scaled to `rate` req/s): the shares of requests within each
    bound (Figure 13's reading) and the per-token TBT."""
    if rate is not None:
        from kvsim.planning.points import at_load

        sc = at_load(sc, rate)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_scenario(sc, Path(tmp) / "out")
        wall = time.perf_counter() - t0
        with open(Path(tmp) / "out" / "requests.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    n = len(rows)
    ttft = sum(1 for r in rows if r["ttft_s"] and float(r["ttft_s"]) <= 30.0) / n
    tbt = sum(1 for r in rows if r["mean_itl_s"] == "" or float(r["mean_itl_s"]) <= 0.1) / n
    s = next(iter(result.summaries.values()))
    return {"ttft_ok": ttft, "tbt_ok": tbt, "ttft_p90": s["ttft_s"]["p90"], "itl_p90": s["itl_s"]["p90"],
            "itl_p99": s["itl_s"]["p99"], "rate": s["arrivals"]["offered_rps"], "wall": wall}


def capacity(sc, num_requests: int) -> dict:
    result = plan(sc, seeds=1, resolution=0.05, num_requests=num_requests, workers=2)
    p = result.policies[0]
    return {"knee": p.mean_rate, "safe": p.safe_rate, "binding": p.binding_detail}


def gap_lines(rows: dict, base: float) -> list[str]:
    """The gap to the paper, in figures: capacity ratio, and Figure 13's TBT shares at the paper's rate."""
    vllm, moon = rows["vllm-20M (paper's vLLM)"], rows["mooncake-10P+10D"]
    ratio = moon["knee"] / base
    best = max((r["knee"] / base, k) for k, r in rows.items() if k.startswith("mooncake"))
    return ["The gap:", "",
            f"- Capacity, Mooncake-[10P+10D] over the paper's vLLM-[20M]: kvsim {ratio:.2f}x, the paper ~1.75x "
            f"(kvsim's ratio is {ratio / 1.75:.0%} of the paper's); the best pool split kvsim tried, {best[1]}: "
            f"{best[0]:.2f}x.",
            f"- TBT <= 0.1 s at the paper's rate: vLLM-[20M] {vllm['paper']['tbt_ok']:.0%} in kvsim against the paper's 57% "
            f"({(vllm['paper']['tbt_ok'] - 0.57) * 100:+.0f} points); Mooncake {moon['paper']['tbt_ok']:.0%} against ~100%.",
            f"- TTFT <= 30 s at the paper's rate: vLLM-[20M] {vllm['paper']['ttft_ok']:.0%}, Mooncake "
            f"{moon['paper']['ttft_ok']:.0%} in kvsim, both ~100% in the paper.",
            "- Likely sources (not isolated here): kvsim's model of the paper's vLLM (prefill-first, no chunked "
            "prefill) keeps TBT better than the paper measured, so the baseline sustains more; kvsim has no "
            "Mooncake Store (the CPU/SSD KVCache pool shared across instances), so each prefill instance reuses only its "
            "own cache and the prefill pool binds first (the knee's binding above); the trace is the released "
            "12,031-request one, not the paper's 23,608, and Llama-3.1-70B on A100 stands in for LLaMA2-70B on A800.", ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first 3,000 requests only")
    args = ap.parse_args()
    n = 3000 if args.quick else None
    rows = {}
    for name, (policy, pools) in CONFIGS.items():
        sc = scenario(name.split(" ")[0], policy, pools, n)
        rows[name] = {"own": shares(sc), "paper": shares(sc, PAPER_RATE), **capacity(sc, n or 12031)}
        print(name, rows[name], flush=True)
    base = rows["vllm-20M (paper's vLLM)"]["knee"]
    lines = ["# Mooncake (FAST 2025) section 8.1.3 / Figure 13, reproduced with kvsim", "",
             f"`python benchmarks/disagg_mooncake_repro.py{' --quick' if args.quick else ''}` "
             f"({n or 12031:,} requests of Mooncake's conversation trace; setup and gaps in the script's docstring).", ""]
    for key, title in (("own", "at the trace's own rate"), ("paper", f"at the paper's trace's rate, {PAPER_RATE:.2f} req/s")):
        lines += [f"Figure 13's reading, {title}:", "",
                  "| deployment | req/s | TTFT <= 30 s | mean TBT <= 0.1 s | TTFT p90 s | TBT p90 / p99 ms (every token) | "
                  "paper: TTFT <= 30 s | paper: TBT <= 0.1 s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in rows.items():
            paper, m = PAPER.get(name, {"ttft_ok": "–", "tbt_ok": "–"}), r[key]
            lines.append(f"| {name} | {m['rate']:.2f} | {m['ttft_ok']:.1%} | {m['tbt_ok']:.1%} | {m['ttft_p90']:.1f} | "
                         f"{m['itl_p90'] * 1e3:.0f} / {m['itl_p99'] * 1e3:.0f} | {paper['ttft_ok']} | {paper['tbt_ok']} |")
        lines.append("")
    lines += ["Capacity: the highest rate meeting TTFT p90 <= 30 s and TBT p90 <= 100 ms:", "",
              "| deployment | knee req/s (safe) | x paper's vLLM | paper |", "| --- | --- | --- | --- |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['knee']:.3g} ({r['safe']:.3g}) | {r['knee'] / base:.2f} | "
                     f"{PAPER.get(name, {}).get('capacity', '–')} |")
    lines += ["", "What binds at each knee: " + "; ".join(f"{k}: {v['binding']}" for k, v in rows.items()), ""]
    lines += gap_lines(rows, base)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
