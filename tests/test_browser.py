"""Notebook 07 in JupyterLab, in a real browser: JupyterLab starts on a free local port with a token, headless
Chromium (Debian's package, driven by Playwright's Python package) opens notebook 07 on the smoke run's merged model,
runs every cell, types a query into the search box, and checks that the hits table and its attention shading render.

It needs the system's `chromium` and the `playwright` package (`.ci/run` installs both; Playwright's own browser
download is never used) and skips cleanly without them. A screenshot of the hits is saved in the test's temporary
folder, or in `C2LLM_SCREENSHOT_DIR` when set: `make browser-test` writes `benchmarks/results/search-jupyterlab.png`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from c2llm_lib.notebook import NOTEBOOK_DIR
from c2llm_lib.params import load_params, resolve

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
NOTEBOOK = "07_search_code"
QUERY = "read a chunk of data from the stream"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs the system's chromium (apt-get install chromium)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_notebook(folder: Path, outputs: Path) -> Path:
    """Notebook 07 with the smoke run's parameters put in as papermill would (an injected cell after the
    parameters cell), in a folder JupyterLab serves."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    values = resolve(load_params(REPO / "params" / "smoke.yaml"), "params/smoke.yaml")[NOTEBOOK]
    values.update(run="smoke", outputs_dir=str(outputs))
    nb = parameterize_notebook(load_notebook_node(str(NOTEBOOK_DIR / f"{NOTEBOOK}.ipynb")), values)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{NOTEBOOK}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def lab(smoke_merged, tmp_path):
    """(base URL, token) of a JupyterLab serving the parameterised notebook 07; stopped after the test."""
    lab_notebook(tmp_path / "lab", smoke_merged)
    port, token = free_port(), secrets.token_hex(16)
    home = tmp_path / "jupyter"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "HF_HUB_OFFLINE": "1"}  # fmt: skip
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path / 'lab'}",
               f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
               "--ServerApp.port_retries=0", "--LabApp.extension_manager=readonly"]  # fmt: skip
    command += ["--allow-root"] if os.geteuid() == 0 else []  # CI runs as root
    settings = {
        "notebook-extension/tracker": {"windowingMode": "none"},  # every cell in the page, scrolled or not
        "apputils-extension/notification": {"fetchNews": "false"},
    }  # no news prompt over the screenshot
    for name, values in settings.items():
        path = home / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    started = (tmp_path / "lab.log").read_text()[-2000:]
                    raise RuntimeError(f"JupyterLab did not start: {started}") from None
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()  # the server shuts its kernels down
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(10)
        log.close()


def test_notebook_07_runs_in_jupyterlab_and_its_search_box_shows_shaded_hits(lab, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install -e .[dev])")
    base, token = lab
    shots = Path(os.environ.get("C2LLM_SCREENSHOT_DIR") or tmp_path)
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1500, "height": 1100},
        )  # fmt: skip
        try:
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{NOTEBOOK}.ipynb?token={token}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.locator("#jp-main-statusbar").get_by_text("Idle").wait_for(timeout=120_000)  # the kernel is up
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            box = page.locator(".widget-text input[placeholder^='describe the function']")
            box.wait_for(timeout=300_000)
            box.fill(QUERY)
            box.press("Enter")
            widget = page.locator(".c2llm-search-hits")
            hits = widget.locator("table.c2llm-hits")
            hits.wait_for(timeout=60_000)
            assert QUERY in widget.inner_text()
            assert hits.locator(".c2llm-hit").count() >= 2  # the model's hits and BM25's
            shaded = hits.locator("pre span").evaluate_all(
                "spans => spans.map(s => getComputedStyle(s).backgroundColor)")  # fmt: skip
            assert shaded and any(c not in ("rgba(0, 0, 0, 0)", "transparent") for c in shaded), shaded[:5]
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]"
                ".every(p => /\\[\\d+\\]/.test(p.textContent))",
                timeout=300_000,
            )  # every cell ran
            outputs = " ".join(page.locator(".jp-OutputArea-output").all_inner_texts())
            assert "Traceback (most recent call last)" not in outputs
            widget.first.scroll_into_view_if_needed()
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "search-jupyterlab.png"))
        finally:
            context.close()
    assert (shots / "search-jupyterlab.png").stat().st_size > 10_000
