"""How each model family is priced as deployed, per GPU: measured or estimated, why, part by part, and its KV
capacity (issue 26, items 3 and 4).

    python benchmarks/deployed_pricing.py     # ~1 min; writes benchmarks/results/deployed_pricing.{md,json}

For every preset family (and the published quantised checkpoints in tests/fixtures/hf_configs: FP8, NVFP4,
int4) on H100-SXM, H200, B200 and A100-80GB at `vllm serve` defaults (gpu_memory_utilization 0.9, the
newest shipped kernel tables, max_model_len 32768 or the model's own if shorter): the pricing basis
kvsim states (kvsim.perf.basis.pricing_basis: the label, and each part priced otherwise than by plain
rows, kvsim.perf.kernel_plan), the weights and KV cache per GPU (blocks and the tokens vLLM logs as "GPU
KV cache size"), and one decode step of 64 sequences at 2,048 tokens of context, priced as the run would
be. A deployment kvsim refuses is its one-line reason. First, the KV-block check against a real vLLM log:
Llama-2-7B on one H100 at 0.9 (7,463 blocks, ../shared/groundtruth's README; its config is the fixture).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kvsim.batch import Batch  # noqa: E402
from kvsim.errors import KvsimError  # noqa: E402
from kvsim.perf.basis import pricing_basis  # noqa: E402
from kvsim.perf.memory import GiB, kv_capacity  # noqa: E402
from kvsim.scenario.catalog import gpu_spec, model_spec  # noqa: E402
from kvsim.scenario.config import scenario_from_dict  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"
# (family, model: a preset name, "hf:<fixture folder>" or "<preset>+nvfp4", [(GPU, TP), ...])
DEPLOYMENTS = [
    ("Llama 3", "Llama-3.1-8B", [("H100-SXM", 1), ("H200", 1), ("B200", 1), ("A100-80GB", 1)]),
    ("Llama 3", "Llama-3.1-70B", [("H100-SXM", 4), ("H200", 2), ("B200", 2)]),
    ("Llama 3", "Llama-3.1-70B+nvfp4", [("B200", 1), ("H100-SXM", 2)]),
    ("Llama 3", "hf:Llama-3.1-70B-Instruct-FP8", [("H100-SXM", 2), ("B200", 1), ("A100-80GB", 2)]),
    ("Llama 4", "Llama-4-Scout", [("H100-SXM", 4), ("H200", 2), ("B200", 2)]),
    ("Qwen3 dense", "Qwen3-8B", [("H100-SXM", 1), ("B200", 1)]),
    ("Qwen3 MoE", "Qwen3-30B-A3B", [("H100-SXM", 1), ("A100-80GB", 1)]),
    ("Qwen3 MoE", "hf:Qwen3-30B-A3B-FP8", [("H100-SXM", 1), ("A100-80GB", 1)]),
    ("Qwen3 MoE", "Qwen3-235B-A22B", [("H200", 8)]),
    ("Qwen3 MoE", "hf:Qwen3-235B-A22B-FP8", [("H200", 4), ("B200", 2)]),
    ("Qwen3 MoE", "hf:Qwen3-235B-A22B-NVFP4", [("B200", 1), ("H200", 2)]),
    ("Mixtral", "Mixtral-8x7B", [("H100-SXM", 2), ("H200", 1)]),
    ("DeepSeek-V3", "DeepSeek-V3", [("H200", 8), ("B200", 8)]),
    ("Kimi-K2", "hf:Kimi-K2-Instruct", [("H200", 8), ("B200", 8)]),
    ("Kimi-K2", "Kimi-K2.5", [("H200", 8), ("B200", 8)]),
    ("Kimi-K2", "hf:Kimi-K2.5-NVFP4", [("B200", 4), ("H200", 8)]),
    ("gpt-oss", "gpt-oss-20b", [("H100-SXM", 1)]),
    ("gpt-oss", "gpt-oss-120b", [("H100-SXM", 1), ("H200", 1), ("B200", 1), ("A100-80GB", 1)]),
    ("gemma-2", "gemma-2-9b", [("H100-SXM", 1)]),
    ("gemma-2", "gemma-2-27b", [("H100-SXM", 1), ("H200", 1)]),
    ("gemma-3", "gemma-3-27b", [("H100-SXM", 1), ("B200", 1)]),
    ("Mistral", "Mistral-7B-v0.1", [("H100-SXM", 1)]),
    ("MiniMax-M2", "MiniMax-M2.5", [("H200", 4), ("B200", 2)]),
    ("MiniMax-M2", "hf:MiniMax-M2.5-NVFP4", [("B200", 2), ("H200", 2)]),
    ("Qwen3-Next", "hf:Qwen3-Next-80B-A3B-Thinking", [("H200", 2)]),
    ("release 0.16", "Llama-3.1-8B@0.16.0", [("H100-SXM", 1), ("B200", 1)]),
]
MAX_LEN = 32768


def scenario(model: str, gpu: str, tp: int):
    version = None
    if "@" in model:
        model, version = model.split("@")
    section = {"hf_config": str(FIXTURES / model[3:])} if model.startswith("hf:") else \
        {"name": model.removesuffix("+nvfp4"), **({"dtype": "nvfp4"} if model.endswith("+nvfp4") else {})}
    engine = {"max_model_len": MAX_LEN, **({"vllm_version": version} if version else {})}
    data = {"model": section, "hardware": {"gpu": gpu, "tensor_parallel_size": tp, "gpu_memory_utilization": 0.9},
            "engine": engine, "policies": [{"name": "paged"}], "workload": {"num_requests": 1}}
    sc = scenario_from_dict(data, source="benchmarks/deployed_pricing.py")
    spec = model_spec(sc)
    if spec.max_position_embeddings < MAX_LEN:
        data["engine"]["max_model_len"] = spec.max_position_embeddings
        sc = scenario_from_dict(data, source="benchmarks/deployed_pricing.py")
    if spec.mla:  # vLLM forces FlashMLA's / CUTLASS MLA's block size
        data["engine"]["block_size"] = 64 if gpu != "B200" else 128
        sc = scenario_from_dict(data, source="benchmarks/deployed_pricing.py")
    return sc


def decode_step_ms(sc, model, gpu, capacity) -> float:
    from kvsim.backends.analytic import AnalyticBackend
    from kvsim.pipeline import resolve_policy

    _, settings = resolve_policy(sc, sc.policies[0], model, gpu)
    backend = AnalyticBackend(sc, sc.policies[0], model, gpu, capacity, settings)
    return backend.pricer.step_time(Batch(num_decode_seqs=64, decode_context_tokens=64 * 2048)) * 1e3


def row(family: str, model_key: str, gpu_name: str, tp: int) -> dict:
    out = {"family": family, "model": model_key, "gpu": gpu_name, "tp": tp}
    try:
        sc = scenario(model_key, gpu_name, tp)
        model, gpu = model_spec(sc), gpu_spec(sc)
        basis = pricing_basis(sc, model, gpu)
        cap = kv_capacity(sc, sc.policies[0], model, gpu)
        out.update(label=basis.label, pricing=basis.pricing, release=basis.vllm_version or "",
                   why=basis.why, parts=[p.to_dict() for p in basis.parts], weights_gib=round(cap.weights / GiB, 2),
                   kv_gib=round(cap.kv / GiB, 2), kv_blocks=cap.num_blocks, kv_tokens=cap.max_tokens,
                   quantization=model.quantization or model.dtype, decode_64x2k_ms=round(decode_step_ms(
                       sc, model, gpu, cap), 3))
    except KvsimError as err:
        out.update(label="refused", why=str(err).replace(str(FIXTURES) + "/", ""))
    return out


def llama2_check() -> dict:
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(FIXTURES / "Llama-2-7b-hf", Path(tmp) / "llama2")
        sc = scenario_from_dict({"model": {"hf_config": str(Path(tmp) / "llama2")},
                                 "hardware": {"gpu": "H100-SXM", "gpu_memory_utilization": 0.9},
                                 "engine": {"max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 128},
                                 "policies": [{"name": "paged"}], "workload": {"num_requests": 1}},
                                source="benchmarks/deployed_pricing.py")
        blocks = kv_capacity(sc, sc.policies[0], model_spec(sc), gpu_spec(sc)).num_blocks
    return {"model": "Llama-2-7B", "gpu": "H100-SXM", "tp": 1, "kvsim_blocks": blocks, "vllm_blocks": 7463,
            "error": blocks / 7463 - 1}


def block_fp8_floors() -> list[str]:
    """The cheapest call of each shipped release's GEMM rows per dtype: vLLM 0.24's (and H200 0.18's) block-fp8
    rows cost 55-155 us where their per-tensor fp8 rows cost 4-5 us, the host's time outside a CUDA graph
    (kvsim.perf.kernel_plan.BLOCK_FP8_FLOOR_RATIO): those releases price block-fp8 GEMMs with per-tensor fp8
    rows."""
    from kvsim.perf.kernel_plan import block_fp8_rows_usable
    from kvsim.perf.kernels import load_tables, shipped_path, shipped_versions

    out = []
    for gpu in ("H100-SXM", "H200", "B200", "A100-80GB"):
        for version in shipped_versions(gpu):
            t = load_tables(str(shipped_path(gpu, version)))
            floors = ", ".join(f"{d} {float(np.nanmin(g.ms)) * 1e3:.1f}" for d, g in t.gemm.items())
            use = "block-fp8 rows" if block_fp8_rows_usable(t) else "per-tensor fp8 rows" if "fp8" in t.gemm \
                else "Marlin estimate"
            out.append(f"{gpu} vLLM {version}: cheapest call (us) {floors}; block-fp8 GEMMs priced by {use}")
    return out


def parts_cell(r: dict) -> str:
    if r["label"] == "refused":
        return r["why"]
    if r["pricing"] != "measured":
        return r["why"]
    parts = "; ".join(f"{p['part']}: **{p['label']}** ({p['why']})" for p in r["parts"])
    return parts or "plain rows of its shapes"


def table(rows: list[dict]) -> str:
    head = ("| family | model as deployed | GPUs | release | label | weights | KV/GPU GiB | KV blocks | KV tokens "
            "| decode 64x2k ms | priced by (per part) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if r["label"] == "refused":
            lines.append(f"| {r['family']} | {r['model']} | {r['tp']}x {r['gpu']} | | refused | | | | | | "
                         f"{parts_cell(r)} |")
            continue
        lines.append(f"| {r['family']} | {r['model']} | {r['tp']}x {r['gpu']} | {r['release'] or r['pricing']} | "
                     f"{r['label']} | {r['quantization']} | {r['kv_gib']:.1f} | {r['kv_blocks']:,} | "
                     f"{r['kv_tokens']:,} | {r['decode_64x2k_ms']:.2f} | {parts_cell(r)} |")
    return "\n".join(lines)


def main() -> None:
    start = time.perf_counter()
    rows = [row(family, model, gpu, tp) for family, model, deploys in DEPLOYMENTS for gpu, tp in deploys]
    check = llama2_check()
    text = table(rows)
    roofline = [r for r in rows if r.get("pricing") == "roofline"]
    counts = {k: sum(r["label"] == k for r in rows) for k in ("measured", "estimated", "refused")}
    summary = (f"{len(rows)} deployments: {counts['measured']} measured, {counts['estimated']} estimated, "
               f"{counts['refused']} refused; {len(roofline)} priced by the roofline"
               + (f" ({', '.join(r['model'] + ' on ' + r['gpu'] for r in roofline)})" if roofline else ""))
    kv = (f"KV blocks, Llama-2-7B on one H100 at 0.9 (max_model_len 4096, 2,048 batched tokens, 128 sequences): "
          f"kvsim {check['kvsim_blocks']:,}, vLLM's log 7,463 ({check['error']:+.2%}; target within 2%)")
    block = block_fp8_floors()
    print(text, summary, kv, *block, sep="\n\n")
    results = ROOT / "benchmarks" / "results"
    (results / "deployed_pricing.json").write_text(json.dumps({"rows": rows, "llama2_kv_blocks": check},
                                                              indent=1) + "\n")
    (results / "deployed_pricing.md").write_text(
        "# Models as deployed: what prices them, part by part, and their KV capacity\n\n"
        f"`python benchmarks/deployed_pricing.py` ({time.perf_counter() - start:.0f} s here; settings in its "
        f"docstring). Label: the answer's (estimated when any part is); per part: how the measured tables price "
        f"what is not a plain 16-bit or fp8 layer of the model's shapes (kvsim.perf.kernel_plan).\n\n"
        f"{summary}.\n\n{kv}.\n\n{text}\n\n"
        "Block-fp8 checkpoints (DeepSeek-V3, Qwen3-*-FP8, MiniMax-M2.5, Kimi-K2) were priced with bfloat16 GEMM "
        "rows before; they take their own block-fp8 rows now, except where a release's block-fp8 rows cost far "
        "more for the smallest GEMM than its per-tensor fp8 rows (the host's time in vLLM's block-fp8 wrapper, "
        "timed outside a CUDA graph, which a graph-captured step does not pay): there per-tensor fp8 rows "
        "stand in, labelled estimated. The cheapest call of each table:\n\n" + "\n".join(f"- {line}" for line in block) + "\n")


if __name__ == "__main__":
    main()
