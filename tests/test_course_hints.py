"""Hints: three per exercise, printed level by level by `python -m minillm.course hint NN.k`, never the solution."""

import ast
import re
import textwrap

import pytest

from minillm.course.__main__ import main
from minillm.course.hints import HINTS, LEVELS, hint
from minillm.course.markers import find_exercises

EXERCISES = find_exercises()


def normal(text: str) -> str:
    """Code or prose with the whitespace taken out and one kind of quote, so that layout cannot hide a copy."""
    return re.sub(r"\s+", "", text).replace('"', "'")


def leaks(body: list[str], text: str) -> list[str]:
    """The lines (12 characters or more, comments dropped) and whole statements of `body` that `text` contains;
    statements that read as words (break, continue, pass, return x) do not count."""
    lines = [line.strip().partition("  #")[0] for line in body if not line.strip().startswith("#")]
    tree = ast.parse("def _():\n" + textwrap.indent(textwrap.dedent("\n".join(body)), "    "))
    trivial = (ast.FunctionDef, ast.Break, ast.Continue, ast.Pass)
    statements = [
        ast.unparse(s)
        for s in ast.walk(tree)
        if isinstance(s, ast.stmt)
        and not isinstance(s, trivial)
        and not (isinstance(s, ast.Return) and isinstance(s.value, (ast.Constant, ast.Name, type(None))))
    ]
    found = [line for line in lines if len(normal(line)) >= 12 and normal(line) in normal(text)]
    return found + [s for s in statements if normal(s) in normal(text)]


def reference_body(exercise) -> list[str]:
    return exercise.path.read_text().splitlines()[exercise.begin : exercise.end - 1]


def test_every_exercise_has_a_hint_at_every_level():
    assert set(HINTS) == {e.id for e in EXERCISES}, "hints for exercises that do not exist, or exercises without"
    for e in EXERCISES:
        assert len(HINTS[e.id]) == len(LEVELS) == 3 and all(h.strip() for h in HINTS[e.id]), e.id
        for level in (1, 2, 3):
            assert HINTS[e.id][level - 1] in hint(e.id, level).replace("\n", " ")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_no_hint_shows_a_line_or_a_statement_of_the_solution(exercise):
    for level, text in enumerate(HINTS[exercise.id], 1):
        assert not leaks(reference_body(exercise), text), f"hint {level} of {exercise.id} shows solution code"


def test_the_leak_check_finds_a_copied_line_and_a_reformatted_statement():
    body = [
        "    dtype = x.dtype",
        "    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # scale",
        "    if hit:",
        "        break",
        "    return x",
    ]
    assert leaks(body, "Write x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) and go on.")
    assert leaks(body, "first: dtype=x.dtype")  # a short statement, reformatted
    assert not leaks(body, "Use torch.rsqrt of the mean square; break out of the loop when done, then return x.")


def test_hint_prints_the_levels_asked_for_and_how_to_get_the_next(capsys):
    assert main(["hint", "05.4", "--level", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Exercise 05.4: BlockManager.allocate (")
    assert "Hint 1 of 3 (approach)" in out and "Hint 2 of 3 (key operation)" in out and "Hint 3 of 3" not in out
    assert "More: python -m minillm.course hint 05.4 --level 3" in out
    assert main(["hint", "5.4"]) == 0  # the chapter may be written without its zero
    out = capsys.readouterr().out
    assert "Hint 1 of 3" in out and "Hint 2 of 3" not in out and "--level 2" in out
    assert main(["hint", "05.4", "--level", "3"]) == 0
    assert "That was the last hint" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, error",
    [
        (["hint", "05.9"], "There is no exercise 05.9; the exercises are 00.1, 00.2, "),
        (
            ["hint", "05.4", "--level", "4"],
            "There are hint levels 1, 2 and 3 (approach, key operation, shapes and pitfalls); 4 is not one of them.",
        ),
        (["hint", "05.4", "--level", "0"], "0 is not one of them"),
    ],
)
def test_hint_errors_name_the_valid_choices(capsys, args, error):
    assert main(args) == 2
    assert error in capsys.readouterr().err
