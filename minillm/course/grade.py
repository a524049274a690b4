"""`python -m minillm.course grade NN|all`: run the exercise tests against your code and print a scoreboard.

Each exercise test carries `@pytest.mark.exercise("NN.k")`; the scoreboard has one row per exercise: PASS when
all of its tests pass, otherwise FAIL with the first failing test and the first line of what went wrong.
"""
import contextlib
import io
from dataclasses import dataclass

import pytest

from minillm.course import CHAPTERS, ROOT, exercise_file
from minillm.course.markers import find_exercises

TESTS = ROOT / "tests" / "exercises"


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
        self.results[report.nodeid] = Result(report.nodeid.partition("::")[2], exercise, report.outcome,
                                             message.strip().partition("\n")[0])

    def pytest_collectreport(self, report):
        if report.failed:
            last_line = str(report.longrepr).strip().splitlines()[-1]
            self.results[report.nodeid] = Result(report.nodeid, None, "failed", last_line)


def run(chapters: list[str], impl: str = "exercises") -> tuple[list[Result], int, str]:
    """Run the tests of `chapters` in this process; returns the results, pytest's exit code and its output."""
    recorder, output = Recorder(), io.StringIO()
    with contextlib.redirect_stdout(output):  # the scoreboard replaces pytest's report
        code = pytest.main([str(TESTS), "-m", " or ".join(f"ch{c}" for c in chapters), f"--impl={impl}", "-q",
                            "-p", "no:cacheprovider"], plugins=[recorder])
    return list(recorder.results.values()), int(code), output.getvalue()


def scoreboard(chapters: list[str], results: list[Result], impl: str = "exercises") -> str:
    """One block per chapter, one row per exercise, then the total."""
    by_exercise = {}
    for r in results:
        by_exercise.setdefault(r.exercise, []).append(r)
    names = {e.id: e.qualname for e in find_exercises() if e.chapter in chapters}
    names |= {id: "?" for id in by_exercise if id and id not in names}  # a test naming an unknown exercise
    lines, graded, done = [], 0, 0
    for chapter in chapters:
        lines.append(f"Chapter {chapter} ({CHAPTERS[chapter]}): {exercise_file(impl, chapter).relative_to(ROOT)}")
        for id in sorted((i for i in names if i.startswith(chapter)), key=lambda i: int(i[3:])):
            rs = by_exercise.get(id, [])
            if not rs:
                lines.append(f"  --    {id}  {names[id]}: no tests yet, nothing to grade")
                continue
            graded, done = graded + 1, done + _all_pass(rs)
            passed = sum(r.outcome == "passed" for r in rs)
            lines.append(f"  {'PASS' if _all_pass(rs) else 'FAIL'}  {id}  {names[id]}: {passed}/{len(rs)} tests pass")
            if failed := next((r for r in rs if r.outcome == "failed"), None):
                lines.append(f"        {failed.test}: {failed.message}")
    for r in by_exercise.get(None, []):  # collection errors, and tests without an exercise marker
        lines.append(f"  FAIL  {r.test}: {r.message}")
    passed = sum(r.outcome == "passed" for r in results)
    lines.append(f"\n{done} of {graded} exercises done ({passed} of {len(results)} tests pass).")
    if done < graded:
        lines.append(f"Details: pytest tests/exercises -m '{' or '.join(f'ch{c}' for c in chapters)}' --impl={impl}")
    return "\n".join(lines)


def grade(which: str, impl: str = "exercises") -> int:
    """Print the scoreboard of chapter `which` ("03") or of every chapter with exercises ("all"); 0 if all pass."""
    chapters = sorted({e.chapter for e in find_exercises()}) if which == "all" else [which.zfill(2)]
    if not set(chapters) <= set(CHAPTERS):
        print(f"There is no chapter {which}; the chapters are {', '.join(CHAPTERS)}.")
        return 2
    results, code, output = run(chapters, impl) if chapters else ([], 0, "")
    if code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        print(output)
    if not results:
        where = "minillm" if which == "all" else f"chapter {chapters[0]}"
        print(f"Nothing to grade: {where} has no exercise tests yet.")
        return 2
    print(scoreboard(chapters, results, impl))
    return 0 if _all_pass(results) else 1


def _all_pass(results: list[Result]) -> bool:
    """Nothing failed and something passed (a skipped test neither passes nor fails)."""
    return all(r.outcome != "failed" for r in results) and any(r.outcome == "passed" for r in results)
