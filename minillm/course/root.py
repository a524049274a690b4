"""Where the course is: the folder holding exercises/, tests/exercises/ and notebooks/ (your checkout).

minillm's source may be installed anywhere (`pip install .` copies it into site-packages; `pip install -e .`
leaves it in the checkout), so the course folders are looked for, in this order:

1. the folder named by `--root DIR` on the command line, or by the MINILLM_COURSE_ROOT environment variable;
2. the working directory and the folders above it (run the commands from anywhere inside your checkout);
3. the folder above minillm's package, which is the checkout when minillm was installed with `-e`.
"""

import os
from pathlib import Path

import minillm

ENV = "MINILLM_COURSE_ROOT"
LANDMARKS = ("exercises", "tests/exercises", "notebooks")  # the folders that make a folder the course
PACKAGE = Path(minillm.__file__).resolve().parent  # minillm's installed source, where the exercise markers are


class CourseNotFound(FileNotFoundError):
    """Not run inside the course; the message says what was looked for, where, and how to point at it."""


def is_course(path: Path) -> bool:
    """Whether `path` holds exercises/, tests/exercises/ and notebooks/."""
    return all((path / landmark).is_dir() for landmark in LANDMARKS)


def course_root() -> Path:
    """The course folder (see the module's docstring for the order); raises CourseNotFound if there is none."""
    if explicit := os.environ.get(ENV):
        path = Path(explicit).expanduser().resolve()
        if not is_course(path):
            missing = _listed([m for m in LANDMARKS if not (path / m).is_dir()])
            raise CourseNotFound(
                f"{ENV} (or --root) names {path}, which is not the minillm course: it has no "
                f"{missing}. Point it at your checkout, the folder with {_listed(LANDMARKS)}."
            )
        return path
    here = Path.cwd().resolve()
    for path in (here, *here.parents):
        if is_course(path):
            return path
    if is_course(PACKAGE.parent):
        return PACKAGE.parent
    raise CourseNotFound(
        f"Not inside the minillm course: looked for a folder with {_listed(LANDMARKS)} in {here} and every "
        f"folder above it, and in the folder that holds the minillm package ({PACKAGE.parent}), and found none. "
        f"Run this from your course checkout (the folder you cloned), or name it with --root DIR or {ENV}=DIR."
    )


def _listed(folders) -> str:
    """The folders as a sentence lists them: "a/, b/ and c/"."""
    names = [f"{f}/" for f in folders]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
