"""Every course notebook runs headless from top to bottom, the committed copy holds that run's outputs, and
each follows the chapter conventions (DESIGN §5): objectives and the engine map at the top; recap, self-check,
stretch ideas and references at the end; a widget; folded hints for each of its exercises."""

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor

import nbformat
import pytest

from minillm.course.markers import find_exercises
from minillm.course.notebooks import KERNELSPEC, execute, find_notebooks

NOTEBOOKS = find_notebooks()
IDS = [p.name for p in NOTEBOOKS]
# notebooks run two at a time, each in its own kernel: much of a notebook's time is a kernel starting, imports,
# servers coming up and waits, which the other notebook's work fills
NOTEBOOKS_AT_ONCE = 2


def run_in_jupyterlab(session) -> set[str]:
    """The notebooks this session's browser test runs top to bottom in JupyterLab, failing on any error output, when it
    must run (MINILLM_BROWSER_REQUIRED=1, as in CI): running them here as well would spend their minutes twice."""
    if os.environ.get("MINILLM_BROWSER_REQUIRED") != "1":
        return set()  # the browser test may skip (no Chromium): nbclient runs every notebook
    return {
        item.callspec.params["name"]
        for item in session.items
        if item.originalname == "test_notebook_runs_in_jupyterlab"
    }


@pytest.fixture(scope="session")
def notebook_runs(request, tmp_path_factory) -> dict[str, Future]:
    """Every selected notebook's run, started at the first notebook test, in a fresh kernel and a scratch folder;
    the later chapters (the longer runs) first, so that no long one starts last."""
    in_browser = run_in_jupyterlab(request.session)
    selected = [
        item.callspec.params["path"]
        for item in request.session.items
        if item.originalname == "test_notebook_runs_top_to_bottom"
        and item.callspec.params["path"].name not in in_browser
    ]
    pool = ThreadPoolExecutor(NOTEBOOKS_AT_ONCE, thread_name_prefix="notebook")
    request.addfinalizer(lambda: pool.shutdown(wait=False, cancel_futures=True))
    return {p.name: pool.submit(execute, p, tmp_path_factory.mktemp(p.stem)) for p in sorted(selected, reverse=True)}


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_top_to_bottom(path, notebook_runs):
    """In a fresh kernel and a scratch folder, within TIME_LIMIT_S; the committed file is not touched."""
    if path.name not in notebook_runs:
        pytest.skip(f"{path.name} runs top to bottom in JupyterLab, in test_browser.py, in this session")
    notebook_runs[path.name].result()  # raises what the run raised


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_holds_the_outputs_of_a_clean_run(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name} was not saved straight after a top-to-bottom run (execution counts {counts}): "
        "`make notebooks` re-executes it in place"
    )
    errors = [
        f"cell [{c.execution_count}]: {o.ename}: {o.evalue}"
        for c in cells
        for o in c.outputs
        if o.output_type == "error" and "raises-exception" not in c.metadata.get("tags", [])
    ]
    assert not errors, f"{path.name} was saved with errors: {errors}"
    assert nb_kernel(path) == KERNELSPEC["name"], (
        f"{path.name} asks for the kernel {nb_kernel(path)!r}, not the course's {KERNELSPEC['display_name']!r}: "
        "`make notebooks` saves it with the right one"
    )


def nb_kernel(path) -> str:
    return nbformat.read(path, as_version=4).metadata.get("kernelspec", {}).get("name")


def section(markdown: str, heading: str) -> str:
    """The text under `heading` (a whole markdown line) up to the next heading of the same or a higher level."""
    match = re.search(rf"^{re.escape(heading)}\s*$(.*?)(?=^#{{1,{heading.count('#')}}} |\Z)", markdown, re.M | re.S)
    return match.group(1) if match else ""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_chapter_follows_the_conventions(path):
    nb = nbformat.read(path, as_version=4)
    chapter = path.name[:2]
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = [c for c in nb.cells if c.cell_type == "code"]
    bullets = lambda text: len(re.findall(r"^[-*] ", text, re.M))
    assert 3 <= bullets(section(markdown, "### Learning objectives")) <= 5, "3-5 learning objectives at the top"
    assert re.search(r"\*\*Time:\*\*.*\d+ min", markdown), "a time estimate (**Time:** about N min)"
    assert bullets(section(markdown, "## Recap")) == 5, "a recap of five bullets at the end"
    assert section(markdown, "## Self-check").count("<details>") >= 3, "self-check questions with folded answers"
    assert bullets(section(markdown, "## Stretch ideas")) >= 2, "stretch ideas"
    references = section(markdown, "## References")
    assert "http" in references and "vllm" in references.lower(), "references: papers and the vLLM source"

    def outputs(pattern: str) -> list:
        return [o for c in code if re.search(pattern, c.source) for o in c.outputs]

    assert any("image/png" in o.get("data", {}) for o in outputs(rf"engine_map\(\"{chapter}\"\)")), (
        f"the 'you are here' map: a cell calling engine_map(\"{chapter}\") with its figure"
    )
    assert any(o.get("data", {}).keys() & {"image/png", "text/plain"} for o in outputs(r"\binteract\(")), (
        "at least one widget (minillm.course.interact) whose default output is committed"
    )
    for e in (e for e in find_exercises() if e.chapter == chapter):
        assert any("<details>" in o.get("data", {}).get("text/html", "") for o in outputs(rf"Hints\(\"{e.id}\"\)")), (
            f"folded hints for exercise {e.id}: a cell Hints(\"{e.id}\")"
        )
