"""A Streamlit app and headless Chromium for tests and benchmarks, driven over the DevTools protocol
(a websocket; no Playwright).

Chromium's one-shot `--screenshot`/`--dump-dom` modes stop at the page's load event, before
Streamlit has drawn anything: its elements arrive over a websocket afterwards, and
`--virtual-time-budget` does not wait for websocket traffic. So the browser is kept open and asked,
every 50 ms, whether a JavaScript condition holds yet.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
                  "--disable-dev-shm-usage", "--hide-scrollbars")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (localhost only)
        return r.read()


@contextlib.contextmanager
def streamlit_app(script: Path = ROOT / "app" / "Home.py", timeout: float = 60.0):
    """`streamlit run script` headless on a free local port; yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
           "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if _get(url + "/_stcore/health") == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"streamlit did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class Browser:
    """One headless Chromium with one tab, controlled over the DevTools protocol."""

    def __init__(self, exe: str, width: int = 1400, height: int = 1000, timeout: float = 30.0):
        from websockets.sync.client import connect

        self.profile = tempfile.TemporaryDirectory(prefix="kvsim-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile.name}",
                                      "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        active = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (active.is_file() and active.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{exe} did not open its DevTools port")
            time.sleep(0.05)
        port = int(active.read_text().split()[0])
        pages = [t for t in json.loads(_get(f"http://127.0.0.1:{port}/json/list")) if t["type"] == "page"]
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                                                    open_timeout=timeout))
        self.next_id = 0
        self.urls: list[str] = []  # every request the page made (Network.requestWillBeSent), in order
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Network.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("method") == "Network.requestWillBeSent":
                self.urls.append(msg["params"]["request"]["url"])
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> float:
        """Seconds until `expression` is truthy (checked every 50 ms); TimeoutError after `timeout`."""
        t0 = time.perf_counter()
        while not self.evaluate(expression):
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"after {timeout:.0f} s still false: {expression}")
            time.sleep(0.05)
        return time.perf_counter() - t0

    def open(self, url: str, until: str, timeout: float = 30.0) -> float:
        """Navigate to `url`; seconds from the navigation until `until` holds. The tab goes to a blank
        page first, so `until` is never true of the page it leaves."""
        self.call("Page.navigate", url="about:blank")
        self.wait_for("document.URL === 'about:blank' && document.readyState === 'complete'", timeout)
        t0 = time.perf_counter()
        self.call("Page.navigate", url=url)
        self.wait_for(until, timeout)
        return time.perf_counter() - t0

    def click(self, element: str) -> None:
        """A left click at the middle of the element the JavaScript expression `element` finds (scrolled to)."""
        box = self.evaluate(f"(() => {{ const e = {element}; if (!e) return null; e.scrollIntoView({{block: 'center'}}); "
                            "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        if box is None:
            raise LookupError(f"nothing to click: {element}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def choose(self, label: str, option: str) -> None:
        """Pick `option` in the Streamlit selectbox labelled `label`, as a user does: open it, click the option."""
        self.click(f"{widget('stSelectbox', label)}?.querySelector('input')")
        self.wait_for("document.querySelector('[role=option]') !== null", 10)
        self.click(f"Array.from(document.querySelectorAll('[role=option]')).find(o => o.innerText.trim() === "
                   f"{json.dumps(option)})")

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def close(self) -> None:
        if hasattr(self, "_stack"):
            self._stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for _ in range(50):  # Chromium's helper processes may still be writing to the profile
            shutil.rmtree(self.profile.name, ignore_errors=True)
            if not Path(self.profile.name).exists():
                break
            time.sleep(0.1)
        self.profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# JavaScript conditions on a Streamlit page
FIRST_FIGURE = "document.querySelector('[data-testid=\"stPlotlyChart\"] .main-svg') !== null"
DRAWN = """(() => {
  const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]');
  return document.querySelector('h1') !== null && charts.length > 0
    && Array.from(charts).every(c => c.querySelector('.main-svg') !== null)
    && document.querySelector('[data-testid="stStatusWidget"]') === null
    && document.querySelector('[data-stale="true"]') === null;
})()"""  # heading and every figure drawn, nothing left over from the previous script run
HEADINGS = "Array.from(document.querySelectorAll('h1')).map(h => h.innerText.trim())"
ANSWERED = """(() => document.querySelector('h1') !== null
  && document.querySelector('[data-testid="stAlertContentSuccess"]') !== null
  && document.querySelector('[data-testid="stStatusWidget"]') === null
  && document.querySelector('[data-stale="true"]') === null)()"""  # the Answer page: cards and the target line


SETTLED = """(() => document.querySelector('h1') !== null
  && document.querySelector('[data-testid="stStatusWidget"]') === null
  && document.querySelector('[data-stale="true"]') === null)()"""  # a script run ended and its elements drawn
LOG_TICKS = """Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(gd =>
  Object.entries(gd._fullLayout || {}).filter(([k, ax]) => /^[xy]axis\\d*$/.test(k) && ax.type === 'log')
    .flatMap(([k, ax]) => (ax._vals || []).map(v => [Math.pow(10, v.x), v.text])))"""  # [value, label] of each log tick


def widget(testid: str, label: str) -> str:
    """JavaScript: the Streamlit widget of `testid` (stSelectbox, stNumberInput, ...) labelled `label`."""
    return (f"Array.from(document.querySelectorAll('[data-testid=\"{testid}\"]')).find(w => "
            f"(w.querySelector('label') || {{innerText: ''}}).innerText.trim() === {json.dumps(label)})")


def link(title: str) -> str:
    """JavaScript: the sidebar's link to the page titled `title`."""
    return (f"Array.from(document.querySelectorAll('a[data-testid=stSidebarNavLink]'))"
            f".find(a => a.innerText.trim().endsWith({json.dumps(title)}))")


def count(testid: str) -> str:
    """How many elements carry Streamlit's `data-testid` (stException, stAlertContentError, stPlotlyChart)."""
    return f"document.querySelectorAll('[data-testid=\"{testid}\"]').length"
