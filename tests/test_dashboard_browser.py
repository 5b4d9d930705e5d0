"""The dashboard in a real browser: `streamlit run app/Home.py` on a free port, every page of its
PAGES list opened in headless Chromium, drawn with its title as the heading, its answer or figures,
no exception and no error, and nothing fetched from outside this machine (it works offline).
Screenshots and DOMs of the last run are kept in artifacts/dashboard/ (git-ignored); docs/ holds
committed copies."""

import io
import re
import time

import pytest
from PIL import Image, ImageStat

from tests.browser import (
    ANSWERED,
    DRAWN,
    HEADINGS,
    LOG_TICKS,
    ROOT,
    SETTLED,
    Browser,
    count,
    find_chromium,
    link,
    streamlit_app,
)

CHROMIUM = find_chromium()
ARTIFACTS = ROOT / "artifacts" / "dashboard"
MIN_FIGURES = {"Answer": 0, "What-if": 4, "Capacity": 3, "Memory": 3, "Validation": 1}  # on the default scenario;
# any other page: at least one. The Answer page (cards, no figure) plans the default scenario on a first open.
LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:")


NO_CHROMIUM = "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"


def pages() -> list[tuple[str, str]]:
    """(url path, title) of each page in app/Home.py's PAGES; the default page is served at /."""
    found = re.findall(r'st\.Page\("views/(\w+)\.py", title="([^"]+)"[^)]*?(default=True)?\)',
                       (ROOT / "app" / "Home.py").read_text())
    return [("" if default else stem, title) for stem, title, default in found]


def assert_not_blank(png: bytes) -> None:
    image = Image.open(io.BytesIO(png)).convert("L")
    assert image.size[0] >= 1000
    assert ImageStat.Stat(image).stddev[0] > 20, "the screenshot is (nearly) one colour"
    dark = sum(image.histogram()[:128]) / (image.size[0] * image.size[1])
    assert dark > 0.01, "the screenshot has (almost) nothing drawn on it"


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_every_page_draws_in_chromium():
    assert [t for _, t in pages()][:5] == ["Answer", "What-if", "Capacity", "Memory", "Validation"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with streamlit_app() as url, Browser(CHROMIUM, width=1400, height=2000) as browser:
        for path, title in pages():
            seconds = browser.open(f"{url}/{path}", ANSWERED if title == "Answer" else DRAWN, timeout=300)
            time.sleep(0.5)  # plotly's transitions
            name = path or "answer"
            png = browser.screenshot(ARTIFACTS / f"{name}.png")
            (ARTIFACTS / f"{name}.html").write_text(browser.dom())
            assert browser.evaluate(HEADINGS) == [title]
            assert browser.evaluate(count("stException")) == 0
            assert browser.evaluate(count("stAlertContentError")) == 0
            assert browser.evaluate(count("stPlotlyChart")) >= MIN_FIGURES.get(title, 1)
            assert_not_blank(png)
            print(f"{title}: first drawn in {seconds:.2f} s")
        outside = [u for u in browser.urls if not u.startswith(LOCAL)]
        assert browser.urls and not outside, outside  # no favicon or font from a server elsewhere


def texts(browser: Browser, selector: str) -> list[str]:
    return browser.evaluate(f"Array.from(document.querySelectorAll('{selector}')).map(e => (e.innerText ?? e.textContent).trim())")


def settle(browser: Browser, until: str = SETTLED) -> None:
    time.sleep(0.5)  # the rerun starts
    browser.wait_for(until, 120)
    time.sleep(0.5)  # plotly's transitions


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_what_the_pages_show_in_chromium_log_ticks_a_model_that_does_not_fit_and_no_upload_yet():
    """As a user sees them: every log axis labels its ticks with their values (plotly's own labels read
    a bare "2" and "5" between decades); Llama-3.1-70B on one H100 shows the library's line, the layouts
    that fit best and a memory chart with no negative bar and the GPU's lines; choosing to upload a
    scenario asks for it without an error."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with streamlit_app() as url, Browser(CHROMIUM, width=1400, height=1400) as browser:
        browser.open(f"{url}/whatif", DRAWN, timeout=120)
        settle(browser, DRAWN)
        ticks = browser.evaluate(LOG_TICKS)  # the report's latency panels and TTFT CDF
        assert len(ticks) >= 10
        assert [t for t in ticks if abs(float(t[1].replace(",", "")) / t[0] - 1) > 0.01] == []
        browser.choose("model", "Llama-3.1-70B")
        settle(browser)
        browser.click(link("Memory"))
        settle(browser, DRAWN)
        browser.screenshot(ARTIFACTS / "memory_does_not_fit.png")
        assert browser.evaluate(HEADINGS) == ["Memory"] and browser.evaluate(count("stException")) == 0
        [error] = texts(browser, '[data-testid="stAlertContentError"]')
        assert "does not fit on H100-SXM" in error
        assert [b for b in texts(browser, '[data-testid="stMain"] button') if b.startswith("Use ")] == [
            "Use 1 × MI300X (TP 1), $2.49/h", "Use 1 × B200 (TP 1), $5.99/h", "Use 2 × H100-SXM (TP 2), $5.98/h"]
        axis = texts(browser, '[data-testid="stPlotlyChart"] .xtick text')
        assert axis and not [t for t in axis if t.startswith(("−", "-"))]  # no bar below zero
        assert browser.evaluate("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .shapelayer path')"
                                ".length") == 2  # the GPU's memory and the budget
        assert {"GPU memory", "budget at gpu_memory_utilization"} <= {
            t.split(":")[0] for t in texts(browser, '[data-testid="stPlotlyChart"] .legendtext')}
        browser.click("Array.from(document.querySelectorAll('label')).find(e => e.innerText.trim() === 'uploaded TOML')")
        settle(browser)
        assert browser.evaluate(count("stAlertContentError")) == 0
        assert texts(browser, '[data-testid="stAlertContentInfo"]') == [
            "Upload a scenario TOML file (Advanced, in the sidebar), or start from a shipped scenario."]
