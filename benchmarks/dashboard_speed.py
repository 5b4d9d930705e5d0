"""Dashboard speed in a real browser: time from opening the Answer page (the first screen) to its
answer, from a widget change to the new answer, from opening each other page to its first figure,
and from a widget change on the chat scenario to the refreshed What-if preview.

    python benchmarks/dashboard_speed.py              # needs chromium on PATH
    python benchmarks/dashboard_speed.py --repeat 9 --screenshots docs/

Starts `streamlit run app/Home.py` headless, drives headless Chromium over the DevTools protocol
(tests/browser.py) and prints a markdown table of medians. "Cold" is the first page a fresh server
serves (Python imports, first simulation; for Capacity, its first visit's quick plan of the chat
scenario; for Validation, the built-in example simulated); "warm" reopens the page in a new session
(the preview, plan and validation cached). A refresh types a new arrival rate (a value not
seen before, so the preview is simulated again; now the question's arrival rate, in the main area) and waits until the first figure holds new data and the script run is over.
The Answer page: "answered" is its cards and its target line drawn and the script run over
(tests/browser.py ANSWERED); a question change (the arrival rate, typed) to a setting planned before
redraws from the cache; to a new one, the page answers at once with a progress bar (the response)
and then with the plan. Issue 20's targets: first answer <= 3 s warm, widget change <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import ANSWERED, DRAWN, FIRST_FIGURE, Browser, find_chromium, streamlit_app  # noqa: E402

FIRST_DATA = ("JSON.stringify(document.querySelector('[data-testid=\"stPlotlyChart\"] .js-plotly-plot')"
              ".data.map(t => t.y))")
PAGES = (("What-if", "whatif"), ("Capacity", "capacity"), ("Memory", "memory"), ("Validation", "validation"))
ANSWER_TEXT = ("Array.from(document.querySelectorAll('[data-testid=\"stMain\"] [data-testid=\"stMarkdownContainer\"]'))"
               ".map(e => e.innerText).join('|')")
PROGRESS = "document.querySelector('[data-testid=\"stProgress\"]') !== null"
RATE = "arrival rate (req/s)"


INPUTS = f"document.querySelector('input[aria-label=\"{RATE}\"]') !== null"  # widgets load after the text


def answer_change(browser: Browser, text: str, new_plan: bool) -> tuple[float, float]:
    """Seconds from typing the arrival rate until the page responds (a progress bar for a new plan, else
    the answer) and until the new answer is drawn."""
    browser.wait_for(INPUTS, timeout=120)
    before = browser.evaluate(ANSWER_TEXT)
    t0 = time.perf_counter()
    set_number(browser, RATE, text)
    changed = f"({ANSWER_TEXT}) !== {json.dumps(before)} && {ANSWERED}"
    browser.wait_for(f"({PROGRESS}) || ({changed})" if new_plan else changed, timeout=600)
    first = time.perf_counter() - t0
    browser.wait_for(changed, timeout=600)
    return first, time.perf_counter() - t0


def answer_rows(browser: Browser, url: str, repeat: int) -> list:
    rows = []
    cold = browser.open(f"{url}/", ANSWERED, timeout=900)
    rows.append(("Answer: open, cold (plans chat: 5 policies, 3 seeds, ±2%, safe checks)", [cold], [cold]))
    warm, ready = [], []
    for _ in range(repeat):
        warm.append(browser.open(f"{url}/", ANSWERED, timeout=120))
        ready.append(warm[-1] + browser.wait_for(INPUTS, timeout=120))
    rows.append(("Answer: open, warm (a new session; the plan cached): answer / its widgets loaded", warm, ready))
    first = answer_change(browser, "15", new_plan=True)
    rows.append(("Answer: arrival rate 14 → 15 req/s, a new plan: progress bar / answer", [first[0]], [first[1]]))
    cached = [answer_change(browser, rate, new_plan=False) for _ in range(repeat) for rate in ("14", "15")]
    rows.append(("Answer: arrival rate 14 ↔ 15 req/s, planned before (cached)", [a for a, _ in cached],
                 [b for _, b in cached]))
    return rows
BASELINE = """import plotly.graph_objects as go
import streamlit as st
st.title("Baseline")
st.plotly_chart(go.Figure({"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}]}), theme=None)
"""  # the least a Streamlit page with one plotly figure costs in this browser


def baseline(exe: str, repeat: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "baseline.py"
        script.write_text(BASELINE)
        with streamlit_app(script) as url, Browser(exe, width=1400, height=2000) as browser:
            browser.open(url, DRAWN, timeout=120)
            return [browser.open(url, FIRST_FIGURE, timeout=60) for _ in range(repeat)]


def set_number(browser: Browser, label: str, text: str) -> None:
    """Type `text` into the number input labelled `label` and press Enter, as a user would."""
    browser.evaluate(f"(() => {{ const el = document.querySelector('input[aria-label=\"{label}\"]');"
                     " el.scrollIntoView(); el.focus(); el.select(); return true; })()")
    browser.call("Input.insertText", text=text)
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                     nativeVirtualKeyCode=13)


def refresh_seconds(browser: Browser, label: str, text: str) -> tuple[float, float]:
    """Seconds from pressing Enter until the first figure shows new data, and until all is redrawn."""
    before = browser.evaluate(FIRST_DATA)
    t0 = time.perf_counter()
    set_number(browser, label, text)
    browser.wait_for(f"({FIRST_DATA}) !== {json.dumps(before)}", timeout=60)
    first = time.perf_counter() - t0
    browser.wait_for(DRAWN, timeout=60)
    return first, time.perf_counter() - t0


def server_seconds(repeat: int) -> list[tuple[str, list[float]]]:
    """The same steps without a browser (Streamlit's AppTest runs the scripts in this process)."""
    from streamlit.testing.v1 import AppTest

    t0 = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=900).switch_page("views/whatif.py").run()
    rows = [("What-if: script run, cold (imports, first preview)", [time.perf_counter() - t0])]
    key = next(w for w in at.sidebar.number_input if w.key.endswith(":hardware.gpu_memory_utilization"))
    for label, values in (("preview simulated", [0.79 - 0.01 * i for i in range(repeat)]),
                          ("preview cached", [0.79 - 0.01 * i for i in range(repeat)])):
        times = []
        for v in values:
            t0 = time.perf_counter()
            at.sidebar.number_input(key=key.key).set_value(round(v, 2)).run()
            times.append(time.perf_counter() - t0)
        rows.append((f"What-if: script run after a widget change, {label}", times))
    sys.path.insert(0, str(ROOT / "app"))
    from kvdash import measured, plans

    at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=900).switch_page(
        "views/whatif.py").run()  # the chat scenario as shipped
    t0 = time.perf_counter()
    at.switch_page("views/answer.py").run()
    rows.append(("Answer: script run, first (the plan and the target line)", [time.perf_counter() - t0]))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
    rows.append(("Answer: script run again, cached", times))
    at.switch_page("views/whatif.py").run()
    for title, cached_fn in (("Memory", None), ("Capacity", plans.plan), ("Validation", measured.validate)):
        script = f"views/{title.lower()}.py"
        times, cached = [], []
        for _ in range(repeat):
            if cached_fn is not None:
                cached_fn.clear()  # time the search itself (kvsim.plan, kvsim.validate), then the cache
            t0 = time.perf_counter()
            at.switch_page(script).run()
            times.append(time.perf_counter() - t0)
            if cached_fn is not None:
                t0 = time.perf_counter()
                at.run()
                cached.append(time.perf_counter() - t0)
            at.switch_page("views/whatif.py").run()
        label = {"Capacity": ", the plan (kvsim plan's defaults: 3 seeds, ±2%, 3000 requests a point)",
                 "Validation": ", the built-in example simulated"}.get(title, "")
        rows.append((f"{title}: script run{label}", times))
        if cached:
            rows.append((f"{title}: script run again, cached", cached))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--screenshots", type=Path, help="write dashboard-<page>.png here (docs/ for the README)")
    args = ap.parse_args()
    exe = find_chromium()
    if exe is None:
        sys.exit("no chromium on PATH")
    rows = []
    with streamlit_app() as url, Browser(exe, width=1400, height=2000) as browser:
        rows += answer_rows(browser, url, args.repeat)
        if args.screenshots:
            browser.open(f"{url}/", ANSWERED, timeout=120)
            time.sleep(1.0)
            browser.screenshot(args.screenshots / "dashboard-answer.png")
    with streamlit_app() as url, Browser(exe, width=1400, height=2000) as browser:
        for title, path in PAGES:  # cold: the server's first session on each page
            first = browser.open(f"{url}/{path}", FIRST_FIGURE, timeout=120)
            drawn = first + browser.wait_for(DRAWN, timeout=120)
            rows.append((f"{title}: open, cold", [first], [drawn]))
        for title, path in PAGES:
            firsts, drawns = [], []
            for _ in range(args.repeat):
                firsts.append(browser.open(f"{url}/{path}", FIRST_FIGURE, timeout=60))
                drawns.append(firsts[-1] + browser.wait_for(DRAWN, timeout=60))
            rows.append((f"{title}: open, warm", firsts, drawns))
            if args.screenshots:
                time.sleep(2.0)  # plotly's transitions and the data grids' canvas
                browser.screenshot(args.screenshots / f"dashboard-{path}.png")
        browser.open(f"{url}/whatif", DRAWN, timeout=60)
        for label in ("preview simulated (chat, 500 requests)", "preview cached"):
            browser.wait_for(INPUTS, timeout=120)
            runs = [refresh_seconds(browser, RATE, f"{14.1 + 0.1 * i:.1f}")
                    for i in range(args.repeat)]  # the second round revisits the first round's values
            rows.append((f"What-if: widget change, {label}", [a for a, _ in runs], [b for _, b in runs]))
    base = baseline(exe, args.repeat)
    rows.append(("baseline: a page with one plotly figure and nothing else, warm", base, base))
    print("In headless Chromium (software rendering):\n")
    print("| step | first response: figure or answer, s (median) | all drawn, s (median) | runs |")
    print("| --- | ---: | ---: | ---: |")
    for name, firsts, drawns in rows:
        print(f"| {name} | {statistics.median(firsts):.2f} | {statistics.median(drawns):.2f} | {len(firsts)} |")
    print("\nThe server's part (the page scripts under AppTest, no browser):\n")
    print("| step | s (median) | runs |")
    print("| --- | ---: | ---: |")
    for name, times in server_seconds(args.repeat):
        print(f"| {name} | {statistics.median(times):.2f} | {len(times)} |")


if __name__ == "__main__":
    main()
