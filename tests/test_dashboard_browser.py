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

from tests.browser import ANSWERED, DRAWN, HEADINGS, ROOT, Browser, count, find_chromium, streamlit_app

CHROMIUM = find_chromium()
ARTIFACTS = ROOT / "artifacts" / "dashboard"
MIN_FIGURES = {"Answer": 0, "What-if": 4, "Capacity": 3, "Memory": 3, "Validation": 1}  # on the default scenario;
# any other page: at least one. The Answer page (cards, no figure) plans the default scenario on a first open.
LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:")


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


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; "
                                             ".ci/run installs it)")
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
