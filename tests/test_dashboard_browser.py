"""The dashboard in a real browser: `streamlit run app/Home.py` on a free port, every page of its
PAGES list opened in headless Chromium, drawn with its title as the heading, its figures, no
exception and no error. Screenshots and DOMs of the last run are kept in artifacts/dashboard/
(git-ignored); docs/ holds committed copies."""

import io
import re
import time

import pytest
from PIL import Image, ImageStat

from tests.browser import DRAWN, HEADINGS, ROOT, Browser, count, find_chromium, streamlit_app

CHROMIUM = find_chromium()
ARTIFACTS = ROOT / "artifacts" / "dashboard"
MIN_FIGURES = {"What-if": 4, "Capacity": 3, "Memory": 3, "Validation": 1}  # on the default scenario; any other
# page: at least one (Capacity: its first visit plans the default scenario with the page's quick settings)


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
    assert [t for _, t in pages()][:4] == ["What-if", "Capacity", "Memory", "Validation"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with streamlit_app() as url, Browser(CHROMIUM, width=1400, height=2000) as browser:
        for path, title in pages():
            seconds = browser.open(f"{url}/{path}", DRAWN, timeout=60)
            time.sleep(0.5)  # plotly's transitions
            name = path or "whatif"
            png = browser.screenshot(ARTIFACTS / f"{name}.png")
            (ARTIFACTS / f"{name}.html").write_text(browser.dom())
            assert browser.evaluate(HEADINGS) == [title]
            assert browser.evaluate(count("stException")) == 0
            assert browser.evaluate(count("stAlertContentError")) == 0
            assert browser.evaluate(count("stPlotlyChart")) >= MIN_FIGURES.get(title, 1)
            assert_not_blank(png)
            print(f"{title}: first drawn in {seconds:.2f} s")
