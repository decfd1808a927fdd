"""Open an HTML report in a real headless Chromium (Debian's `chromium`, driven by Playwright) and say
what a user would see: console errors, and for every plot whether it drew SVG traces."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

# per plot div: the number of drawn trace groups with at least one SVG path in them, and the x tick labels
_PLOT_STATS_JS = """() => Array.from(document.querySelectorAll('div.plotly-graph-div')).map(d => ({
    id: d.id,
    svg: d.querySelectorAll('svg.main-svg').length,
    traces: Array.from(d.querySelectorAll('svg.main-svg g.trace')).filter(t => t.querySelector('path')).length,
    paths: d.querySelectorAll('svg.main-svg g.trace path').length,
    xticks: Array.from(d.querySelectorAll('g.xtick text')).map(t => t.textContent),
}))"""


def chromium_path() -> str:
    """/usr/bin/chromium; skip (fail under LUMOS_SIM_REQUIRE_SHARED=1, as in CI) when it or Playwright is missing."""
    path = os.environ.get("LUMOS_SIM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    problem = None
    if not Path(path).exists():
        problem = "chromium not found (apt-get install -y chromium)"
    else:
        if importlib.util.find_spec("playwright") is None:
            problem = "playwright not installed (pip install -e '.[dev]')"
    if problem:
        if os.environ.get("LUMOS_SIM_REQUIRE_SHARED") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return path


def render(html_path: Path, screenshot: Path) -> tuple[list[str], list[dict]]:
    """(console errors and page errors, per-plot stats) of `html_path`; saves a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(html_path.resolve().as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('div.plotly-graph-div svg.main-svg').length > 0",
                                   timeout=20000)
            page.wait_for_timeout(300)  # let the last plot finish drawing
            stats = page.evaluate(_PLOT_STATS_JS)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return errors, stats
