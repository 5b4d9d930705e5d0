"""The four sizing questions of issue 11 answered on the dashboard alone, as a newcomer would click them
(Streamlit's AppTest sets the sidebar and page widgets and presses the buttons), each beside the
`python -m kvsim plan` command that gives the same numbers, which is run and compared.

    python benchmarks/dashboard_questions.py            # about 3-4 minutes on 2 cores

(a) req/s of Llama-3.1-8B on one H100 under chat's SLO (p99 TTFT ≤ 2 s, TPOT ≤ 60 ms);
(b) how many H100s for Llama-3.1-70B at 20 req/s; (c) does fp8 KV help for 32k prompts;
(d) what if H200 or A100. Every search uses the command line's defaults (3 seeds, ±2%, the
scenario's requests up to 3000 a point), set in the page's search settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "app"))

from tests.test_dashboard import open_app, widget  # noqa: E402


def page(sidebar: dict, shipped: str = "chat"):
    """The Capacity page after the sidebar widgets are set, with the command line's search settings."""
    at = open_app()
    if shipped != "chat":
        at.sidebar.selectbox(key="kvsim.shipped").set_value(shipped).run()
    for (kind, key), value in sidebar.items():
        widget(at, kind, key).set_value(value)
        at.run()
    at.session_state["kvsim.capacity.plan"] = None  # skip the first visit's quick plan: the buttons below search
    at.switch_page("views/capacity.py").run()
    return at.button(key="kvsim.capacity.cli_settings").click().run()  # kvsim plan's defaults


def press(at, label: str):
    [button] = [b for b in at.button if b.label == label]
    t0 = time.perf_counter()
    button.click().run(timeout=600)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    return time.perf_counter() - t0


def cli_plan(scenario: str, *args: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "kvsim", "plan", f"scenarios/{scenario}.toml", *args, "--quiet",
                        "--out", f"{tmp}/out"], cwd=ROOT, check=True)
        return json.loads(Path(f"{tmp}/out/plan.json").read_text())


def plan_rows(at) -> list[dict]:
    return at.dataframe[0].value.to_dict("records")


def same_plan(at, plan: dict) -> bool:
    return [(r["policy"], r["max req/s"], r["CI low"], r["CI high"]) for r in plan_rows(at)] == \
        [(p["policy"], p["max_rate"], p["ci_low"], p["ci_high"]) for p in plan["policies"]]


def rates_text(at) -> str:
    return "; ".join(f"{r['policy']} {r['max req/s']:.3g} ({r['CI low']:.3g}–{r['CI high']:.3g}, binds: "
                     f"{r['binds at the knee']})" for r in plan_rows(at))


def question_a() -> tuple:
    at = page({})
    wall = press(at, "Find the maximum rates")
    return (rates_text(at), wall, "kvsim plan scenarios/chat.toml", same_plan(at, cli_plan("chat")))


def question_b() -> tuple:
    at = page({("selectbox", "model.name"): "Llama-3.1-70B"})
    at.number_input(key="kvsim.capacity.target_rate").set_value(20.0)
    at.selectbox(key="kvsim.capacity.policy").set_value("paged")
    at.multiselect(key="kvsim.capacity.gpus").set_value(["H100-SXM"])
    wall = press(at, "Search deployments")
    [table] = [d.value.to_dict("records") for d in at.dataframe if "TP × replicas" in d.value.columns]
    answer = "; ".join(f"TP {r['TP × replicas']} = {r['GPUs']} GPUs {r['meets']} max {r['max req/s']} req/s, "
                       f"${r['$/hour']:.2f}/h, ${r['$/M output']:.3f}/M output tokens" for r in table)
    args = ("--set", 'model.name="Llama-3.1-70B"', "--target-rate", "20", "--policy", "paged", "--gpu", "H100-SXM")
    plan = cli_plan("chat", *args)
    same = [(r["GPU"], r["GPUs"], r["$/hour"], r["$/M output"], r["max req/s"]) for r in table] == \
        [(d["gpu"], d["num_gpus"], d["usd_per_hour"], d["usd_per_m_output"],
          f"{d['max_rate']:.3g}" if d["max_rate"] is not None else "≥20" if d["meets_target"] else "<20")
         for d in plan["deployments"]]
    return answer, wall, "kvsim plan scenarios/chat.toml " + " ".join(args), same


def question_c() -> tuple:
    sidebar = {("selectbox", "workload.prompt_len.dist"): "fixed", ("number_input", "workload.prompt_len.value"): 32768}
    at = page(sidebar, shipped="long_context")
    wall = press(at, "Find the maximum rates")
    args = ("--set", 'workload.prompt_len.dist="fixed"', "--set", "workload.prompt_len.value=32768")
    return (rates_text(at), wall, "kvsim plan scenarios/long_context.toml " + " ".join(args),
            same_plan(at, cli_plan("long_context", *args)))


def question_d(gpu: str) -> tuple:
    at = page({("selectbox", "hardware.gpu"): gpu})
    wall = press(at, "Find the maximum rates")
    args = ("--set", f'hardware.gpu="{gpu}"')
    return rates_text(at), wall, "kvsim plan scenarios/chat.toml " + " ".join(args), same_plan(at, cli_plan("chat", *args))


def main() -> None:
    rows = [("(a) Llama-3.1-8B, one H100, chat SLO", question_a()),
            ("(b) Llama-3.1-70B at 20 req/s on H100s (policy paged)", question_b()),
            ("(c) 32k-token prompts (long_context), bf16 vs fp8 KV", question_c()),
            ("(d) chat on one H200", question_d("H200")),
            ("(d) chat on one A100-80GB", question_d("A100-80GB"))]
    print("| question | the dashboard's answer | search, s | CLI command (same numbers) | equal |")
    print("| --- | --- | ---: | --- | --- |")
    for name, (answer, wall, command, same) in rows:
        print(f"| {name} | {answer} | {wall:.1f} | `python -m {command}` | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
