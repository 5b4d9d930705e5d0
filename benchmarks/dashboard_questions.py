"""The four sizing questions answered from the dashboard's first screen (the Answer page), as a
newcomer would click them (Streamlit's AppTest sets the question's widgets, the Advanced sidebar's and
the buttons), each beside the `python -m kvsim plan` command the page names, which is run and
compared.

    python benchmarks/dashboard_questions.py            # about 5-8 minutes on 2 cores

(a) req/s of Llama-3.1-8B on one H100 under chat's SLO (p99 TTFT ≤ 2 s, TPOT ≤ 60 ms);
(b) how many H100s for Llama-3.1-70B at 20 req/s; (c) does fp8 KV help for 32k prompts;
(d) what if H200 or A100. The page plans with `kvsim plan`'s defaults (3 seeds, ±2%, the scenario's
requests up to 3000 a point; safe = every seed and a run four times longer sustainable). "equal": each
card's safe rate, knee and interval are the CLI's plan.json's (to the digits shown), or the target
line's GPUs, layout and $/hour are the CLI deployment's.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "app"))

from tests.test_dashboard import open_app, widget  # noqa: E402
from tests.test_dashboard_answer import card_text  # noqa: E402
from tests.test_dashboard_capacity import keyed  # noqa: E402


def answer(widgets: list, shipped: str = "chat"):
    """The Answer page after the widgets are set (on the What-if page, so nothing is planned before);
    the seconds its script run took (the plan, cached by scenario, and the target line)."""
    at = open_app()
    if shipped != "chat":
        at.sidebar.selectbox(key="kvsim.shipped").set_value(shipped).run()
    for kind, key, value in widgets:
        widget(at, kind, key).set_value(value)
        at.run()
    t0 = time.perf_counter()
    at.switch_page("views/answer.py").run(timeout=900)
    return at, time.perf_counter() - t0


def ok(at) -> None:
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]


def cli(command: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, *shlex.split(command)[1:], "--quiet", "--out", f"{tmp}/out"], cwd=ROOT,
                       check=True)
        return json.loads(Path(f"{tmp}/out/plan.json").read_text())


def plan_command(at) -> str:
    return next(c.value for c in at.caption if "Safe: every one of" in c.value).split("`")[1]


def cards(at, plan: dict) -> tuple[str, bool]:
    """The cards as text, and whether each shows the CLI's numbers."""
    texts, same = [], True
    for p in plan["policies"]:
        text = card_text(at, p["policy"])
        same &= f"safe up to **{p['safe_rate']:.3g} req/s**" in text
        same &= f"knee {p['mean_rate']:.3g} (95% CI {p['ci_low']:.3g}–{p['ci_high']:.3g})" in text
        tie = text.split("= tie with ")[1].split("\n")[0] if "= tie with" in text else ""
        texts.append(f"{'★ ' if '★' in text else ''}{p['policy']} **{p['safe_rate']:.3g}** (knee {p['mean_rate']:.3g}, "
                     f"{p['ci_low']:.3g}–{p['ci_high']:.3g}{'; tie: ' + tie if tie else ''}; binds {p['binding']})")
    return "; ".join(texts), same


def planned(widgets: list, shipped: str = "chat") -> tuple:
    at, wall = answer(widgets, shipped)
    ok(at)
    command = plan_command(at)
    text, same = cards(at, cli(command))
    return text, wall, command, same


def question_b() -> tuple:
    at, _ = answer([("selectbox", "model.name", "Llama-3.1-70B")])
    message = at.error[0].value  # the model does not fit one H100: the page says so and offers layouts
    fix = next(b for b in at.button if "× H100-SXM (TP" in b.label)  # the question asks for H100s
    t0 = time.perf_counter()
    fix.click().run(timeout=900)
    ok(at)
    keyed(at, "number_input", "kvsim.answer.target").set_value(20.0).run(timeout=900)
    ok(at)
    wall = time.perf_counter() - t0
    [line] = [s.value for s in at.success]
    command = next(c.value for c in at.caption if "--target-rate" in c.value).split("`")[1]
    d = cli(command)["deployments"][0]
    same = line.startswith(f"**{d['num_gpus']} × {d['gpu']} as TP {d['tensor_parallel_size']} × {d['num_replicas']} ")
    same &= f"${d['usd_per_hour']:,.2f}/h" in line
    text = (f"the page says '{message.split(': ', 1)[1].split('):')[0]})' and offers *{fix.label}*; with it, target 20: "
            + line.split("  \n")[0].replace("**", ""))
    return text, wall, command, same


def main() -> None:
    rows = [("(a) Llama-3.1-8B, one H100, chat SLO", planned([])),
            ("(b) Llama-3.1-70B at 20 req/s on H100s", question_b()),
            ("(c) 32k-token prompts (long_context), bf16 vs fp8 KV",
             planned([("selectbox", "workload.prompt_len.dist", "fixed"),
                      ("number_input", "workload.prompt_len.value", 32768)], shipped="long_context")),
            ("(d) chat on one H200", planned([("selectbox", "hardware.gpu", "H200")])),
            ("(d) chat on one A100-80GB", planned([("selectbox", "hardware.gpu", "A100-80GB")]))]
    print("| question | the first screen's answer | page, s | CLI command (same numbers) | equal |")
    print("| --- | --- | ---: | --- | --- |")
    for name, (text, wall, command, same) in rows:
        print(f"| {name} | {text} | {wall:.1f} | `{command}` | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
