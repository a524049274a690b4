"""The course as a student gets it from `make lab`: JupyterLab from .venv, opened in a real (headless) Chromium.

nbclient (test_notebooks.py) proves the code runs; this proves what a student sees: the kernel JupyterLab picks
for a notebook (the course's, from `make setup`), imports as JupyterLab's working directory allows them, figures
shown as images, widgets that render and redraw when moved. For each notebook: open it, Run All Cells from the
Run menu, wait for the kernel to finish, then check. Screenshots go to results/browser/.

JupyterLab serves a scratch copy of the course folders (the committed notebooks are never saved over), with
settings of its own (no autosave; every cell kept in the page so all outputs can be inspected). Chromium is the
machine's (`apt-get install chromium`; .ci/run installs it): nothing is downloaded. JupyterLab, its kernels and
the browser are stopped at the end whatever happens, and that none of them survives is checked.
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "results" / "browser"
NOTEBOOKS = ["02_embed.ipynb", "06_continuous_batching.ipynb", "12_serving.ipynb"]
COURSE = [
    "notebooks",
    "exercises",
    "solutions",
    "tests",
    "pyproject.toml",
]  # what the notebooks read from their folder up
KERNEL, KERNEL_DISPLAY = "minillm", "Python (minillm)"  # the kernelspec `make setup` installs
PART_PX = 12_000  # screenshot height per image
RUN_LIMIT_S = 600  # per notebook, as test_notebooks' TIME_LIMIT_S; 06 runs a real engine (a couple of minutes)
REQUIRED = os.environ.get("MINILLM_BROWSER_REQUIRED") == "1"  # .ci/run: a missing browser fails, not skips
SETTINGS = {  # JupyterLab user settings for the run
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},  # every cell in the DOM, not just visible ones
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}

pytestmark = pytest.mark.browser


def find_chromium() -> str | None:
    return os.environ.get("MINILLM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def missing(reason: str):
    if REQUIRED:
        pytest.fail(f"{reason} (MINILLM_BROWSER_REQUIRED=1: CI must run the browser test)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A running JupyterLab: its URL, token and REST API."""

    def __init__(self, port: int, token: str, course: Path):
        self.base, self.token, self.course = f"http://127.0.0.1:{port}", token, course

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={self.token}"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


def our_processes(before: set[int], scratch: Path) -> list:
    """Processes this test started that are alive: new descendants of pytest, and any process whose command line
    names the scratch folder (JupyterLab, its kernels and Chromium all do), wherever it was re-parented."""
    import psutil

    found = {p.pid: p for p in psutil.Process().children(recursive=True) if p.pid not in before}
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and str(scratch) in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p
    alive = []
    for p in found.values():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            pass
    return alive


def stop(server: subprocess.Popen, lab: Lab | None):
    """JupyterLab shuts its kernels down (the shutdown API, then SIGTERM); whatever is left is killed."""
    import psutil

    try:
        family = psutil.Process(server.pid).children(recursive=True)  # the kernels and their children
    except psutil.Error:
        family = []
    if lab is not None and server.poll() is None:
        try:
            lab.api("/api/shutdown", method="POST")
        except Exception:
            pass
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and server.poll() is None:
            try:
                os.killpg(server.pid, sig)  # its own process group (start_new_session)
            except ProcessLookupError:
                pass
        try:
            server.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue
    for p in family:  # kernels start in sessions of their own: not in the server's process group
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab from .venv serving a scratch copy of the course, as `make lab` serves notebooks/; a
    Chromium page factory. Everything is stopped at the end and checked gone."""
    chromium = find_chromium()
    if chromium is None:
        missing("no Chromium on this machine: `apt-get install chromium` to run the browser test (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed: `make setup` installs the dev extra")
    import psutil

    jupyter = Path(sys.prefix) / "bin" / "jupyter"
    assert jupyter.exists(), f"no {jupyter}: run the tests from the project's .venv (`make test`)"

    scratch = tmp_path_factory.mktemp("browser")
    course = scratch / "course"
    for name in COURSE:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name,
                course / name,
                ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", ".pytest_cache"),
            )
        else:
            shutil.copy2(ROOT / name, course / name)
    for plugin, values in SETTINGS.items():
        path = scratch / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    SHOTS.mkdir(parents=True, exist_ok=True)

    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("MINILLM_COURSE_ROOT", "PYTHONPATH", "MPLBACKEND")}
    env.update(
        JUPYTER_CONFIG_DIR=str(scratch / "config"),
        JUPYTER_DATA_DIR=str(scratch / "data"),
        JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
    )  # kernels: .venv's (sys-prefix), as `make setup` installs
    command = [
        str(jupyter),
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={course / 'notebooks'}",  # `make lab`: jupyter lab notebooks/
        f"--LabApp.user_settings_dir={scratch / 'settings'}",
        f"--LabApp.workspaces_dir={scratch / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True",
    ]  # window.jupyterapp: the notebook's model, for its error outputs
    if os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root; JupyterLab refuses to without this
    log_path = SHOTS / "jupyterlab.log"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    server, lab = None, None
    try:
        with open(log_path, "w") as log, sync_playwright() as playwright:
            server = subprocess.Popen(
                command,
                cwd=course,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            candidate, deadline = Lab(port, token, course), time.monotonic() + 90
            while lab is None:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start (exit code {server.poll()}):\n{tail(log_path)}")
                try:
                    candidate.api("/api/status")
                    lab = candidate
                except OSError:
                    time.sleep(0.5)
            context = playwright.chromium.launch_persistent_context(
                scratch / "chromium", executable_path=chromium, headless=True, viewport={"width": 1280, "height": 900}
            )
            try:
                lab.new_page, lab.log = context.new_page, log_path
                yield lab
            finally:
                context.close()
    finally:
        if server is not None:
            stop(server, lab)
        survivors = []
        for _ in range(20):
            survivors = our_processes(before, scratch)
            if not survivors:
                break
            time.sleep(0.5)
        assert not survivors, "processes started by the browser test outlived it:\n" + "\n".join(survivors)


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


BUSY_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const status = panel.sessionContext.kernelDisplayStatus;
  const queued = [...panel.node.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
  return queued || status !== 'idle' ? status : null;
}"""
CELLS_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = [];
  for (let i = 0; i < panel.content.model.cells.length; i++) {
    const cell = panel.content.model.cells.get(i);
    if (cell.type !== 'code') continue;
    const outputs = cell.outputs.toJSON().map(o => ({type: o.output_type, ename: o.ename, evalue: o.evalue,
      lines: (o.traceback || []).join('\\n').replace(/\\x1b\\[[0-9;]*m/g, '').split('\\n')}));
    cells.push({index: i, count: cell.executionCount, source: cell.sharedModel.getSource(), outputs});
  }
  return {kernel: panel.sessionContext.session?.kernel?.name, display: panel.sessionContext.kernelDisplayName,
          status: panel.sessionContext.kernelDisplayStatus, cells};
}"""


def failing_line(cell: dict, error: dict) -> str:
    """The line IPython's traceback points at (---->), else the cell's first line."""
    arrows = [line for line in error["lines"] if re.match(r"\s*-+>", line)]
    return (arrows[-1] if arrows else cell["source"].strip().splitlines()[0]).strip()[:160]


def open_notebook(lab, name: str):
    page = lab.new_page()
    page.goto(lab.url(f"/lab/tree/{name}?reset"))  # reset: no other notebook reopened from the last page
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.kernelDisplayStatus === 'idle'", timeout=60_000
    )
    panel = page.locator(f'[id="{page.evaluate("() => window.jupyterapp.shell.currentWidget.id")}"]')
    return page, panel


def run_all(page, name: str, lab) -> dict:
    """Run > Run All Cells, as a student does; wait until no cell is queued or running and the kernel is idle."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(BUSY_JS, timeout=30_000)
    deadline, quiet = time.monotonic() + RUN_LIMIT_S, 0
    while quiet < 3:  # idle with nothing queued, three polls in a row (the kernel is idle between cells too)
        if time.monotonic() > deadline:
            page.screenshot(path=SHOTS / f"{Path(name).stem}-timeout.png")
            pytest.fail(f"{name}: still running after {RUN_LIMIT_S} s of Run All Cells")
        busy = page.evaluate(BUSY_JS)  # the kernel's status while it works, None when all is done
        if busy == "dead":
            page.screenshot(path=SHOTS / f"{Path(name).stem}-dead.png")
            pytest.fail(f"{name}: the kernel died during Run All Cells:\n{tail(lab.log)}")
        quiet = 0 if busy else quiet + 1
        time.sleep(1)
    return page.evaluate(CELLS_JS)


def screenshot(page, stem: str) -> list[Path]:
    """The whole notebook, top to bottom: the window made as tall as the notebook, in parts of at most
    PART_PX (Chromium caps an image at 16384 px): results/browser/<stem>-1.png, -2.png, ..."""
    page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    scroller = "window.jupyterapp.shell.currentWidget.node.querySelector('.jp-WindowedPanel-outer')"
    height = page.evaluate(f"() => {scroller}.scrollHeight")
    chrome = page.evaluate(f"() => window.innerHeight - {scroller}.clientHeight")
    page.set_viewport_size({"width": 1280, "height": min(PART_PX, height) + chrome})
    paths = []
    for top in range(0, height, PART_PX):
        page.evaluate(f"() => {{ {scroller}.scrollTop = {top}; }}")
        page.wait_for_timeout(300)  # let the page repaint
        paths.append(SHOTS / f"{stem}-{len(paths) + 1}.png")
        page.screenshot(path=paths[-1], full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    return paths


@pytest.mark.parametrize("name", NOTEBOOKS, ids=[Path(n).stem for n in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(lab, name):
    page, panel = open_notebook(lab, name)
    try:
        state = run_all(page, name, lab)
        screenshot(page, Path(name).stem)
        sessions = [s for s in lab.api("/api/sessions") if s["path"].endswith(name)]
        assert [s["kernel"]["name"] for s in sessions] == [KERNEL] and state["kernel"] == KERNEL, (
            f"{name} runs on the kernel {state['kernel']!r} ({state['display']}), not the course's {KERNEL_DISPLAY!r}: "
            "`make setup` installs it into .venv"
        )
        toolbar = panel.locator(".jp-NotebookPanel-toolbar .jp-KernelName").inner_text()
        assert toolbar.strip() == KERNEL_DISPLAY, f"the toolbar shows the kernel {toolbar!r}, not {KERNEL_DISPLAY!r}"

        errors = [
            f"cell {c['index']} [{c['count']}]: {o['ename']}: {o['evalue']}, at: {failing_line(c, o)}"
            for c in state["cells"]
            for o in c["outputs"]
            if o["type"] == "error"
        ]
        assert not errors, f"{name}: error outputs after Run All Cells:\n" + "\n".join(errors)
        not_run = [
            f"cell {c['index']}: {c['source'][:80]!r}" for c in state["cells"] if c["source"].strip() and not c["count"]
        ]
        assert not not_run, f"{name}: cells Run All Cells did not run:\n" + "\n".join(not_run)

        images = panel.locator(".jp-OutputArea-output img")
        drawn = images.evaluate_all("images => images.filter(i => i.complete && i.naturalWidth > 0).length")
        assert images.count() > 0 and drawn == images.count(), (
            f"{name}: {images.count()} figures as <img> in the outputs, {drawn} of them drawn"
        )

        widgets = panel.locator(".jp-OutputArea-output .jupyter-widgets:not(.jp-OutputArea-output)")
        broken = panel.locator(".jp-OutputArea-output", has_text=re.compile(r"Error displaying widget|Loading widget"))
        assert widgets.count() > 0, f"{name}: no widget rendered (no .jupyter-widgets element in any output)"
        assert broken.count() == 0, f"{name}: a widget failed to render: {broken.first.inner_text()[:200]!r}"
        if name.startswith("02_"):
            move_the_temperature_slider(page, panel, name)
        if name.startswith("12_"):
            check_the_dashboard(page, panel, name)
    finally:
        page.close()
        try:
            for s in lab.api("/api/sessions"):  # free the kernel's memory and cores before the next notebook
                lab.api(f"/api/sessions/{s['id']}", method="DELETE")
        except OSError:
            pass  # the fixture stops everything anyway


def move_the_temperature_slider(page, panel, name: str):
    """One step of the slider (the arrow key on its handle) redraws the figure below it."""
    labelled = page.locator(".widget-label", has_text="temperature")
    cell = panel.locator(".jp-CodeCell", has=page.locator(".widget-slider", has=labelled))
    assert cell.count() == 1, f"{name}: {cell.count()} cells with a temperature slider rendered, expected one"
    slider = cell.locator(".widget-slider", has=labelled)
    figure = cell.locator(".jp-OutputArea-output img").last
    readout = slider.locator(".widget-readout").inner_text()
    before = figure.get_attribute("src")
    cell.screenshot(path=SHOTS / f"{Path(name).stem}-slider-before.png")
    slider.locator(".noUi-handle").focus()
    page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + 60  # the output is replaced in place (display_id): a new <img>, found afresh
    while figure.get_attribute("src") == before and time.monotonic() < deadline:
        time.sleep(0.5)
    if figure.get_attribute("src") == before:
        cell.screenshot(path=SHOTS / f"{Path(name).stem}-slider-after.png")
        pytest.fail(
            f"{name}: the temperature slider moved from {readout} to "
            f"{slider.locator('.widget-readout').inner_text()} but its figure was not redrawn within 60 s"
        )
    cell.screenshot(path=SHOTS / f"{Path(name).stem}-slider-after.png")
    assert slider.locator(".widget-readout").inner_text() != readout, "the slider's readout did not change"


def check_the_dashboard(page, panel, name: str):
    """The instructor dashboard rendered as a live panel: its load controls and its figure, drawn."""
    button = page.locator(".widget-button", has_text="Start load")
    cell = panel.locator(".jp-CodeCell", has=button)
    assert cell.count() == 1, f"{name}: {cell.count()} cells with the dashboard's Start load button, expected one"
    assert cell.locator(".widget-slider", has=page.locator(".widget-label", has_text="requests/s")).count() == 1, (
        f"{name}: the dashboard has no requests/s slider"
    )
    figure = cell.locator(".jupyter-widgets img")
    drawn = figure.evaluate_all("images => images.filter(i => i.complete && i.naturalWidth > 200).length")
    assert drawn >= 1, f"{name}: the dashboard's figure was not drawn ({figure.count()} <img> in its widget)"
    cell.screenshot(path=SHOTS / f"{Path(name).stem}-dashboard.png")
