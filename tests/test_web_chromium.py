"""``moetune serve`` in a real headless Chromium: the server runs as ``python -m moetune serve``, the browser loads
``/?model=...`` (which fills the form and plans on load), and the test reads the DOM over the DevTools protocol.

It asserts that the page shows the CLI's #1 layout (``moetune plan --json`` on the same inputs), at least the two
charts (memory per pipeline rank, time per wall) drawn with their numbers, the itemised estimate, and that a what-if
toggle re-estimates and changes the numbers; it saves a full-page screenshot under the test's output.

``python tests/test_web_chromium.py OUT.png`` takes the same screenshot outside pytest (docs/serve_screenshot.png).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUERY = {"model": "Qwen3-30B-A3B", "system": "DGX-H100", "gpus": 16, "gbs": 1024, "seq": 4096}

pytestmark = pytest.mark.chromium


def chromium() -> str | None:
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return shutil.which(b)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, step: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Server:
    """``python -m moetune serve`` on a free localhost port (PYTHONPATH inherited)."""

    def __init__(self):
        self.port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "moetune", "serve", "--port", str(self.port)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"moetune serve exited: {self.proc.stdout.read().decode()[-2000:]}")
            try:
                return urllib.request.urlopen(self.url + "/assets/app.css", timeout=2).status == 200
            except OSError:
                return False

        _wait(up, 60, "moetune serve to listen")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Browser:
    """Headless Chromium driven over the DevTools protocol (websocket-client)."""

    def __init__(self, exe: str, width: int = 1320, height: int = 1000):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="moetune-chromium-")
        self.port = _free_port()
        self.proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                      "--no-first-run", "--no-default-browser-check", f"--user-data-dir={self.profile}",
                                      f"--remote-debugging-port={self.port}", f"--window-size={width},{height}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def page_ws() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
            except OSError:
                return None
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        ws_url = _wait(page_ws, 60, "chromium's DevTools endpoint")
        self.ws = websocket.create_connection(ws_url, timeout=120, suppress_origin=True)
        self.n = 0

    def send(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expr: str):
        r = self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path) -> None:
        h = self.js("Math.ceil(document.documentElement.scrollHeight)")
        w = self.js("Math.ceil(document.documentElement.scrollWidth)")
        r = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                      clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})
        path.write_bytes(base64.b64decode(r["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


def _js3(x: float) -> str:
    """app.js fmt(x, 3) for 1 <= x < 1000: three significant digits, no trailing zeros."""
    return f"{float(f'{x:.3g}'):g}"


def layout_text(lay: dict) -> str:
    """The page's layout label (app.js layoutText) for a plan JSON layout."""
    s = f"TP{lay['tp']} PP{lay['pp']}" + (f" VPP{lay['vpp']}" if lay["vpp"] > 1 else "")
    return s + f" CP{lay['cp']} EP{lay['ep']} ETP{lay['etp']} DP{lay['dp']} EDP{lay['edp']} MBS{lay['mbs']}"


def load_planned_page(b: Browser, url: str) -> None:
    from urllib.parse import urlencode

    b.send("Page.enable")
    b.send("Page.navigate", url=f"{url}/?{urlencode(QUERY)}")
    _wait(lambda: b.js("!!document.querySelector('#best-layout') && "
                       "!!document.querySelector('#chart-walls svg') && "
                       "!!document.querySelector('#memory-table') && "
                       "!!document.querySelector('#delta-table')") or
          (b.js("document.querySelector('#status.error')?.textContent") and
           pytest.fail(b.js("document.querySelector('#status').textContent"))), 240, "the planned page")


def take_screenshot(out: Path) -> None:
    """Screenshot of the page planned from QUERY, with a what-if applied (for docs/serve_screenshot.png)."""
    srv, b = Server(), Browser(chromium() or "chromium")
    try:
        load_planned_page(b, srv.url)
        _apply_whatif(b, "w-recompute", "full")
        b.screenshot(out)
    finally:
        b.close()
        srv.close()


def _whatif_cell(b: Browser, metric: str) -> str:
    return b.js(f"document.querySelector('#delta-table tr[data-metric=\"{metric}\"] td.whatif')?.textContent || ''")


def _apply_whatif(b: Browser, select_id: str, value: str) -> None:
    b.js(f"(() => {{ const s = document.getElementById('{select_id}'); s.value = '{value}'; "
         "s.dispatchEvent(new Event('change')); })()")
    _wait(lambda: _whatif_cell(b, "step time (s)") not in ("", "–") or b.js("!!document.querySelector('#whatif-error')"),
          240, "the what-if estimate")


def test_served_page_shows_the_cli_plan_charts_and_whatif(tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("headless chromium not installed (.ci/setup-chromium.sh)")
    pytest.importorskip("websocket")
    from tests.conftest import run_cli

    args = [x for k, v in QUERY.items() for x in (f"--{k}", str(v))]
    r = run_cli("plan", *args, "--json")
    assert r.returncode == 0, r.stderr
    cli_plan = json.loads(r.stdout)
    cli_best = cli_plan["candidates"][0]

    srv = Server()
    b = Browser(exe)
    try:
        load_planned_page(b, srv.url)
        # the CLI's #1 layout, first row and verdict
        assert b.js("document.querySelector('#best-layout').textContent") == layout_text(cli_best["layout"])
        assert b.js("document.querySelector('#candidates tr.cand td.layout').textContent") == \
            layout_text(cli_best["layout"])
        shown_step = b.js("document.querySelector('#candidates tr.cand td.step').textContent")
        assert float(shown_step.split()[0]) == pytest.approx(cli_best["time"]["step_time_s"], rel=1e-3)
        band = cli_best["time"].get("band")
        if band:  # the model's prediction band, when the plan JSON carries one
            assert shown_step.split()[1] == f"[{_js3(band['lo_s'])}–{_js3(band['hi_s'])}]"
        # distinct candidates: one row per group of near-duplicates when the plan groups them
        rows = b.js("document.querySelectorAll('#candidates tr.cand').length")
        assert rows == len(cli_plan.get("groups") or cli_plan["candidates"])
        assert b.js("document.querySelectorAll('#three-walls .wall').length") == 3  # memory, comm, compute
        dom = cli_best["time"]["dominant_wall"]
        expected = ["communication wall"] if dom.startswith("comm_") else \
            ["compute efficiency wall"] if dom in ("compute", "recompute", "host", "optimizer") else []
        assert b.js("[...document.querySelectorAll('#three-walls .wall.dominant b')].map(x => x.textContent)") == \
            expected
        assert b.js("document.querySelector('#why-1').textContent").startswith("Why #1: beats #2 by")
        # the charts: memory per pipeline rank (one stacked bar per PP rank, against HBM) and time per wall
        n_charts = b.js("document.querySelectorAll('#results svg.mt-chart').length")
        assert n_charts >= 2
        pp = cli_best["layout"]["pp"]
        assert b.js("document.querySelectorAll('#chart-memory svg[data-chart=memory] text')."
                    "length") > 0
        seg_sum = b.js("[...document.querySelectorAll('#chart-memory rect.seg')].reduce((a, r) => a + "
                       "Number(r.dataset.gib), 0)")
        cli_total = sum(sum(st["components"].values()) for st in cli_best["memory"]["stages"])
        assert seg_sum == pytest.approx(cli_total, rel=1e-3)
        assert b.js("[...document.querySelectorAll('#chart-memory text')].filter(t => /^PP\\d+$/.test("
                    "t.textContent)).length") == pp
        assert b.js("Number(document.querySelector('#chart-memory line.hbm').dataset.gib)") == \
            pytest.approx(cli_best["memory"]["capacity_gib"], rel=1e-3)
        walls = b.js("Object.fromEntries([...document.querySelectorAll('#chart-walls rect.bar')]"
                     ".map(r => [r.dataset.label, Number(r.dataset.value)]))")
        cli_walls = {k: v["seconds"] for k, v in cli_best["time"]["walls"].items() if v["seconds"] > 0}
        assert walls.keys() == cli_walls.keys()
        for k, v in cli_walls.items():
            assert walls[k] == pytest.approx(v, rel=1e-4)
        # launch config with copy buttons
        assert b.js("document.querySelectorAll('#launch button.copy').length") >= 4
        assert "#SBATCH" in b.js("document.querySelector('#launch-slurm').textContent")

        # the itemised estimate is the candidate's own job: its reproduce line gives the plan's numbers
        if cli_best.get("reproduce"):
            assert b.js("document.querySelector('#reproduces').textContent").startswith("estimate reproduces")
            assert b.js("document.querySelector('#w-ep_overlap').disabled") is False
        # a what-if toggle re-estimates: full recompute changes step time and memory
        base_step = b.js("document.querySelector('#delta-table tr[data-metric=\"step time (s)\"] td.base')"
                         ".textContent")
        base_mem = b.js("document.querySelector('#delta-table tr[data-metric=\"peak allocated (GiB)\"] td.base')"
                        ".textContent")
        _apply_whatif(b, "w-recompute", "full")
        assert not b.js("!!document.querySelector('#whatif-error')"), b.js(
            "document.querySelector('#whatif-error').textContent")
        new_step = _whatif_cell(b, "step time (s)")
        new_mem = _whatif_cell(b, "peak allocated (GiB)")
        assert float(new_step) > float(base_step)       # recomputing every layer costs time ...
        assert float(new_mem) < float(base_mem)         # ... and frees activation memory
        assert b.js("document.querySelector('#delta-table tr[data-metric=\"step time (s)\"] td.delta')"
                    ".textContent").startswith("+")
        assert b.js("!!document.querySelector('#chart-whatif-memory svg[data-chart=memory]')")

        png = tmp_path / "serve.png"
        b.screenshot(png)
        assert png.stat().st_size > 50_000
    finally:
        b.close()
        srv.close()


def _set_files(b: Browser, selector: str, paths: list[Path]) -> None:
    root = b.send("DOM.getDocument")["root"]["nodeId"]
    node = b.send("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
    b.send("DOM.setFileInputFiles", nodeId=node, files=[str(p) for p in paths])


def test_evidence_panes_show_check_logs_and_trace(tmp_path):
    """Uploads through the page's file inputs: check findings, a log's steady numbers and diagnosis, a trace's
    hidden vs exposed communication - the numbers the CLI prints for the same files."""
    exe = chromium()
    if exe is None:
        pytest.skip("headless chromium not installed (.ci/setup-chromium.sh)")
    pytest.importorskip("websocket")
    from tests.conftest import DATA, run_cli

    log, oom = DATA / "logs" / "log_iteration_1.txt", DATA / "logs" / "log_oom_message_1.txt"
    trace = DATA / "traces" / "deepseek_profile_data_train.json"
    cfg = REPO / "tests" / "fixtures" / "memory_bridge_small.yaml"
    steady = json.loads(run_cli("logs", str(log), "--json").stdout)["runs"][0]
    tr = json.loads(run_cli("trace", str(trace), "--json").stdout)
    checked = json.loads(run_cli("check", str(cfg), "--system", "DGX-H100", "--gpus", "16", "--json").stdout)

    srv, b = Server(), Browser(exe)
    try:
        b.send("Page.enable")
        b.send("Page.navigate", url=srv.url + "/")
        _wait(lambda: b.js("document.body?.dataset.ready === '1'"), 60, "the page")
        _set_files(b, "#c-file", [cfg])
        b.js("document.querySelector('#check-form').requestSubmit()")
        _wait(lambda: b.js("!!document.querySelector('#check-summary') || !!document.querySelector('#check-out .error')"),
              120, "check findings")
        assert b.js("document.querySelector('#check-summary').textContent").startswith(
            f"{len(checked['findings'])} findings")
        assert b.js("document.querySelectorAll('#check-table tr').length") == len(checked["findings"]) + 1

        _set_files(b, "#l-file", [log])
        b.js("document.querySelector('#logs-form').requestSubmit()")
        _wait(lambda: b.js("!!document.querySelector('#logs-out table.steady')"), 120, "steady-state numbers")
        text = b.js("document.querySelector('#logs-out table.steady').textContent")
        assert f"median {steady['step_time_s']['median']:.4g} s" in text
        _set_files(b, "#l-file", [oom])
        b.js("document.querySelector('#logs-form').requestSubmit()")
        _wait(lambda: b.js("!!document.querySelector('#logs-out .finding')"), 120, "the diagnosis")
        assert "[error] oom" in b.js("document.querySelector('#logs-out .finding').textContent")

        _set_files(b, "#t-file", [trace])
        b.js("document.querySelector('#trace-form').requestSubmit()")
        _wait(lambda: b.js("!!document.querySelector('#trace-out svg[data-chart=comm]')"), 120, "the trace pane")
        bars = b.js("Object.fromEntries([...document.querySelectorAll('#trace-out svg[data-chart=comm] rect.bar')]"
                    ".map(r => [r.dataset.label, Number(r.dataset.value)]))")
        r0 = tr["ranks"][0]
        assert bars["hidden communication"] == pytest.approx(r0["hidden_comm_s"], rel=1e-4)
        assert bars["exposed communication"] == pytest.approx(r0["exposed_comm_s"], rel=1e-4)
        assert bars["host-bound gaps"] == pytest.approx(r0["idle"]["host_bound_s"], rel=1e-4)
        # a Bridge YAML as the job: estimated (itemised, with what-ifs) and checked as given
        est = json.loads(run_cli("estimate", "--bridge-config", str(cfg), "--system", "DGX-H100", "--gpus", "16",
                                 "--json").stdout)
        _set_files(b, "#f-model-file", [cfg])
        b.js("document.querySelector('#plan-form').requestSubmit()")
        _wait(lambda: b.js("!!document.querySelector('#memory-table')") or
              b.js("document.querySelector('#itemised .error')?.textContent"), 120, "the config's estimate")
        assert b.js("!!document.querySelector('#memory-table')"), b.js("document.querySelector('#itemised').textContent")
        base = b.js("document.querySelector('#delta-table tr[data-metric=\"peak allocated (GiB)\"] td.base')"
                    ".textContent")
        assert float(base) == pytest.approx(est["memory"]["peak_allocated_gib"], rel=1e-3)
        # its what-ifs are Bridge overrides: full recompute as the CLI would take it
        full = json.loads(run_cli("estimate", "--bridge-config", str(cfg), "--system", "DGX-H100", "--gpus", "16",
                                  "model.recompute_granularity=full", "model.recompute_method=uniform",
                                  "model.recompute_num_layers=1", "--json").stdout)
        _apply_whatif(b, "w-recompute", "full")
        assert not b.js("!!document.querySelector('#whatif-error')"), b.js(
            "document.querySelector('#whatif-error').textContent")
        assert float(_whatif_cell(b, "peak allocated (GiB)")) == pytest.approx(
            full["memory"]["peak_allocated_gib"], rel=1e-3)
        assert full["memory"]["peak_allocated_gib"] != est["memory"]["peak_allocated_gib"]
        b.screenshot(tmp_path / "evidence.png")
    finally:
        b.close()
        srv.close()


if __name__ == "__main__":  # pragma: no cover - docs screenshot
    target = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "serve_screenshot.png")
    target.parent.mkdir(parents=True, exist_ok=True)
    take_screenshot(target)
    print(target)
