"""Run the course notebooks headless, top to bottom, in a fresh kernel: what CI and `make notebooks` do.

A cell that is meant to fail (say, calling an exercise stub to show its message) carries the cell tag
`raises-exception`; any other error stops the run. The kernel is told where the course is (MINILLM_COURSE_ROOT),
since it may run in a scratch folder outside it.
"""

import os
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minillm.course.root import ENV, course_root

TIME_LIMIT_S = 600  # per notebook; the course promises a few minutes each on a 2-core CPU
KERNEL = "python3"  # ipykernel's kernel for the running interpreter
# What a saved notebook asks JupyterLab for: the kernel `make setup` installs into .venv (the README's name).
KERNELSPEC = {"name": "minillm", "display_name": "Python (minillm)", "language": "python"}


def find_notebooks(chapters: list[str] = ()) -> list[Path]:
    """notebooks/NN_<topic>.ipynb, all of them or those of `chapters`."""
    found = sorted((course_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found if not chapters or p.name[:2] in {c.zfill(2) for c in chapters}]


def execute(path: Path, cwd: Path, time_limit: float = TIME_LIMIT_S) -> nbformat.NotebookNode:
    """Execute the notebook at `path` in a new kernel started in `cwd`, and return it with its outputs.

    Raises nbclient's CellExecutionError at the first failing cell, CellTimeoutError past `time_limit`.
    The file itself is not touched.
    """
    nb = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + time_limit
    NotebookClient(
        nb,
        kernel_name=KERNEL,
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),  # what is left of the notebook's budget
    ).execute(env={**os.environ, ENV: str(course_root())})
    return nb


def run(chapters: list[str] = (), inplace: bool = False) -> int:
    """Execute notebooks, in place (saving their outputs) or in a scratch folder; prints one line each."""
    failed, root = 0, course_root()
    for path in find_notebooks(chapters):
        start = time.monotonic()
        try:
            with tempfile.TemporaryDirectory() as scratch:
                nb = execute(path, path.parent if inplace else Path(scratch))
        except Exception as e:  # a cell error, a timeout or a dead kernel: report it and go on
            failed += 1
            print(f"FAILED {path.relative_to(root)} after {time.monotonic() - start:.0f} s:\n{e}\n")
            continue
        if inplace:
            nb.metadata.kernelspec = KERNELSPEC
            nbformat.write(nb, path)
        print(f"ok     {path.relative_to(root)} ({time.monotonic() - start:.0f} s{', saved' if inplace else ''})")
    return 1 if failed else 0
