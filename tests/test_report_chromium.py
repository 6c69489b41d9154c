"""The HTML report rendered in headless Chromium: the screenshot must show real plots (many colours, large
non-white area), read back with matplotlib's PNG reader."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.chromium

PLAN = REPO / "tests" / "fixtures" / "sweep" / "PLAN.json"


def _chromium() -> str | None:
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return shutil.which(b)
    return None


def screenshot(html, png, width=1200, height=1400) -> None:
    exe = _chromium()
    if exe is None:
        pytest.skip("headless chromium not installed (.ci/setup-chromium.sh)")
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri()],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and png.is_file(), r.stderr[-2000:]


def pixel_stats(png) -> tuple[int, float]:
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))[..., :3]
    q = (img * 255).astype(np.uint8).reshape(-1, 3)
    colours = len(np.unique(q[:, 0].astype(np.int32) << 16 | q[:, 1].astype(np.int32) << 8 | q[:, 2]))
    non_white = float((q.min(axis=1) < 240).mean())
    return colours, non_white


def test_plan_report_screenshot_has_plots(tmp_path):
    html = tmp_path / "plan.html"
    assert run_cli("report", str(PLAN), "--html", str(html)).returncode == 0
    png = tmp_path / "plan.png"
    screenshot(html, png)
    colours, non_white = pixel_stats(png)
    assert colours > 200, colours          # anti-aliased coloured bars and markers, not a blank page
    assert non_white > 0.05, non_white     # plots cover a real share of the page

    # the same page with the plots removed is visibly poorer: the plots are what fills it
    bare = tmp_path / "bare.html"
    text = html.read_text()
    start, end = text.index("<div class='plots'>"), text.index("<h2>Candidates</h2>")
    bare.write_text(text[:start] + text[end:])
    png2 = tmp_path / "bare.png"
    screenshot(bare, png2)
    colours2, non_white2 = pixel_stats(png2)
    assert non_white > 3 * non_white2 and colours > colours2
