"""Finding the course folders from the working directory, --root or MINILLM_COURSE_ROOT, so that minillm works
installed as a regular package too; and a clear error outside the course."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import minillm.course
from minillm.course import root
from minillm.course.__main__ import main
from minillm.course.root import ENV, CourseNotFound, course_root

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def nowhere(tmp_path, monkeypatch) -> Path:
    """A folder outside any course, with minillm seen as installed outside it too and MINILLM_COURSE_ROOT unset."""
    monkeypatch.setenv(ENV, "")  # empty counts as unset; setenv restores the real value afterwards
    monkeypatch.setattr(root, "PACKAGE", tmp_path / "site-packages" / "minillm")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path / "elsewhere"


def make_course(path: Path) -> Path:
    for folder in ("exercises", "tests/exercises", "notebooks/deep/er"):
        (path / folder).mkdir(parents=True)
    return path


def test_the_course_is_found_from_a_subdirectory(nowhere, tmp_path, monkeypatch):
    course = make_course(tmp_path / "course")
    monkeypatch.chdir(course / "notebooks" / "deep" / "er")
    assert course_root() == course and minillm.course.ROOT == course
    assert minillm.course.exercise_file("exercises", "05") == course / "exercises" / "ex05_paged_blocks.py"
    monkeypatch.chdir(REPO / "tests" / "exercises")
    assert course_root() == REPO


def test_root_option_and_environment_variable_name_the_course(nowhere, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV, str(make_course(tmp_path / "course")))
    assert course_root() == tmp_path / "course"
    monkeypatch.setenv(ENV, str(REPO / "notebooks"))
    with pytest.raises(
        CourseNotFound,
        match=r"names .*notebooks, which is not the minillm course: it has no "
        r"exercises/, tests/exercises/ and notebooks/\.",
    ):
        course_root()
    monkeypatch.setenv(ENV, "")
    assert main(["build", "--check", "--root", str(REPO)]) == 0, capsys.readouterr().out


def test_outside_the_course_the_error_says_what_was_looked_for_and_where(nowhere, capsys):
    with pytest.raises(CourseNotFound) as error:
        course_root()
    message = str(error.value)
    assert message.startswith(
        "Not inside the minillm course: looked for a folder with exercises/, tests/exercises/ and notebooks/ in "
    )
    assert str(nowhere) in message and str(root.PACKAGE.parent) in message
    assert "--root DIR" in message and f"{ENV}=DIR" in message
    assert main(["grade", "01"]) == 2
    assert capsys.readouterr().err.startswith("Not inside the minillm course")
    assert main(["hint", "01.1"]) == 0  # hints need only the package


@pytest.mark.slow
def test_a_regular_install_grades_from_the_course(tmp_path):
    """`pip install .` (not -e) into a fresh venv, then `grade 01` in the checkout runs the installed minillm.

    The venv borrows this interpreter's packages (torch and the rest) through a .pth line rather than
    --system-site-packages, which would reach the base interpreter's and not a venv's. A plain path line
    runs none of that folder's own .pth files, so an editable minillm installed there stays out of sight.
    """
    source = tmp_path / "source"  # a copy, so that pip's in-tree build leaves the checkout untouched
    shutil.copytree(REPO / "minillm", source / "minillm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    borrowed = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "borrowed.pth").write_text("".join(f"{p}\n" for p in borrowed))
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--ignore-installed",
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    safe = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTHONPATH")}
    safe["PYTHONSAFEPATH"] = "1"  # so that the checkout's minillm/ is not on sys.path: the installed one runs
    where = subprocess.run(
        [python, "-c", "import minillm; print(minillm.__file__)"],
        cwd=REPO,
        env=safe,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(site), f"the installed minillm should run, not {where}"
    done = subprocess.run(
        [python, "-m", "minillm.course", "grade", "01", "--impl", "solutions"],
        cwd=REPO,
        env=safe,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and re.search(r"\n(\d+) of \1 exercises done", done.stdout), done.stdout + done.stderr
    lost = subprocess.run(
        [python, "-m", "minillm.course", "grade", "01"], cwd=tmp_path, env=safe, capture_output=True, text=True
    )
    assert lost.returncode == 2 and lost.stderr.startswith("Not inside the minillm course"), lost.stderr
