"""`python -m minillm.course grade NN.k|NN|all`: run the exercise tests against your code and print a scoreboard.

Each exercise test carries `@pytest.mark.exercise("NN.k")`; the scoreboard has one row per exercise: PASS when
all of its tests pass, otherwise FAIL with the first failing test and the first line of what went wrong.
`grade 05.4` runs only exercise 05.4's tests (the pytest plugin's `--exercise` option), `grade 05` a chapter's.
"""

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from minillm.course.chapters import CHAPTERS, exercise_file
from minillm.course.markers import canonical_id, find_exercises
from minillm.course.root import course_root


@dataclass
class Result:
    test: str  # the test's name, with its parameters
    exercise: str | None
    outcome: str  # "passed", "failed" or "skipped"
    message: str = ""  # first line of the failure or skip reason


class Recorder:
    """A pytest plugin that keeps one Result per test; a failure in setup, call or teardown fails the test."""

    def __init__(self):
        self.results: dict[str, Result] = {}

    def pytest_runtest_logreport(self, report):
        done = self.results.get(report.nodeid)
        if (done and done.outcome == "failed") or not (report.when == "call" or report.failed or report.skipped):
            return
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash else report.longrepr[2] if report.skipped else str(report.longrepr or "")
        exercise = dict(report.user_properties).get("exercise")
        self.results[report.nodeid] = Result(
            report.nodeid.partition("::")[2], exercise, report.outcome, message.strip().partition("\n")[0]
        )

    def pytest_collectreport(self, report):
        if report.failed:
            last_line = str(report.longrepr).strip().splitlines()[-1]
            self.results[report.nodeid] = Result(report.nodeid, None, "failed", last_line)
        elif report.skipped and report.nodeid:  # a whole module skipped (chapter 09 without Triton): say why
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.results[report.nodeid] = Result(report.nodeid, None, "skipped", reason.removeprefix("Skipped: "))


def run(chapters: list[str], impl: str = "exercises", exercise: str | None = None) -> tuple[list[Result], int, str]:
    """Run the tests of `chapters` (of one `exercise` only, if given) in this process; returns the results,
    pytest's exit code and its output."""
    args = [
        str(course_root() / "tests" / "exercises"),
        "-m",
        " or ".join(f"ch{c}" for c in chapters),
        f"--impl={impl}",
        "-q",
        "-p",
        "no:cacheprovider",
        *([f"--exercise={exercise}"] if exercise else []),
    ]
    recorder, output = Recorder(), io.StringIO()
    with contextlib.redirect_stdout(output):  # the scoreboard replaces pytest's report
        code = pytest.main(args, plugins=[recorder])
    return list(recorder.results.values()), int(code), output.getvalue()


def scoreboard(chapters: list[str], results: list[Result], impl: str = "exercises", exercise: str | None = None) -> str:
    """One block per chapter, one row per exercise (only `exercise`'s row, if given), then the total."""
    by_exercise = {}
    for r in results:
        by_exercise.setdefault(r.exercise, []).append(r)
    names = {e.id: e.qualname for e in find_exercises() if e.chapter in chapters and exercise in (None, e.id)}
    names |= {id: "?" for id in by_exercise if id and id not in names}  # a test naming an unknown exercise
    lines, graded, done, failing = [], 0, 0, []
    skipped = any(r.outcome == "skipped" for r in by_exercise.get(None, []))  # a whole test module skipped
    for chapter in chapters:
        lines.append(f"Chapter {chapter} ({CHAPTERS[chapter]}): {exercise_file(impl, chapter, Path()).as_posix()}")
        for id in sorted((i for i in names if i.startswith(chapter)), key=lambda i: int(i[3:])):
            rs = by_exercise.get(id, [])
            if not rs and skipped:
                lines.append(f"  SKIP  {id}  {names[id]}: not graded on this machine (below)")
                continue
            if not rs:
                lines.append(f"  --    {id}  {names[id]}: no tests yet, nothing to grade")
                continue
            graded, done = graded + 1, done + _all_pass(rs)
            passed = sum(r.outcome == "passed" for r in rs)
            lines.append(f"  {'PASS' if _all_pass(rs) else 'FAIL'}  {id}  {names[id]}: {passed}/{len(rs)} tests pass")
            if failed := next((r for r in rs if r.outcome == "failed"), None):
                lines.append(f"        {failed.test}: {failed.message}")
                failing.append(id)
    for r in by_exercise.get(None, []):  # collection errors and skipped modules, tests without an exercise marker
        lines.append(f"  {'SKIP' if r.outcome == 'skipped' else 'FAIL'}  {r.test}: {r.message}")
    passed = sum(r.outcome == "passed" for r in results)
    tests = sum(r.exercise is not None or r.outcome != "skipped" for r in results)  # a skipped module is no test
    lines.append(f"\n{done} of {graded} exercises done ({passed} of {tests} tests pass).")
    if done < graded:
        select = f"--exercise={exercise}" if exercise else f"-m '{' or '.join(f'ch{c}' for c in chapters)}'"
        lines.append(f"Details: pytest tests/exercises {select} --impl={impl}")
    if failing:
        lines.append(
            f"Stuck on {failing[0]}? `python -m minillm.course hint {failing[0]}` gives a hint "
            "(--level 2 and 3 say more)."
        )
    return "\n".join(lines)


def selection(which: str) -> tuple[list[str], str | None]:
    """The chapters and the one exercise (or None) that "NN.k", "NN" or "all" asks to grade.

    Raises ValueError naming the valid choices for a chapter or an exercise that does not exist.
    """
    if which == "all":
        return sorted({e.chapter for e in find_exercises()}), None
    if "." in which:
        id = canonical_id(which)
        known = [e.id for e in find_exercises()]
        if id not in known:
            raise ValueError(f"There is no exercise {which}; the exercises are {', '.join(known)}.")
        return [id[:2]], id
    if which.zfill(2) not in CHAPTERS:
        raise ValueError(f"There is no chapter {which}; the chapters are {', '.join(CHAPTERS)} (or all).")
    return [which.zfill(2)], None


def grade(which: str, impl: str = "exercises") -> int:
    """Print the scoreboard of one exercise ("05.4"), one chapter ("05") or every chapter with exercises ("all");
    returns 0 if everything graded passes, 1 if something fails, 2 if there was nothing to grade (no tests, or
    every test module skipped on this machine, as chapter 09's are without Triton)."""
    try:
        chapters, exercise = selection(which)
    except ValueError as e:
        print(e)
        return 2
    results, code, output = run(chapters, impl, exercise) if chapters else ([], 0, "")
    if code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        print(output)
    if not results:
        where = "minillm" if which == "all" else f"exercise {exercise}" if exercise else f"chapter {chapters[0]}"
        print(f"Nothing to grade: {where} has no exercise tests yet.")
        return 2
    print(scoreboard(chapters, results, impl, exercise))
    if all(r.outcome == "skipped" and r.exercise is None for r in results):
        return 2  # every module skipped on this machine (chapter 09 without Triton): nothing was graded
    return 0 if _all_pass(results) else 1


def _all_pass(results: list[Result]) -> bool:
    """Nothing failed and something passed (a skipped test neither passes nor fails)."""
    return all(r.outcome != "failed" for r in results) and any(r.outcome == "passed" for r in results)
