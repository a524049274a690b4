"""Every course notebook runs headless from top to bottom, and the committed copy holds that run's outputs."""
import nbformat
import pytest

from minillm.course.notebooks import execute, find_notebooks

NOTEBOOKS = find_notebooks()
IDS = [p.name for p in NOTEBOOKS]


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    """In a fresh kernel and a scratch folder, within TIME_LIMIT_S; the committed file is not touched."""
    execute(path, cwd=tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_notebook_holds_the_outputs_of_a_clean_run(path):
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name} was not saved straight after a top-to-bottom run (execution counts {counts}): "
        "`make notebooks` re-executes it in place")
    errors = [f"cell [{c.execution_count}]: {o.ename}: {o.evalue}" for c in cells for o in c.outputs
              if o.output_type == "error" and "raises-exception" not in c.metadata.get("tags", [])]
    assert not errors, f"{path.name} was saved with errors: {errors}"
