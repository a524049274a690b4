"""The course harness: generated exercise files in sync and leak-free, stubs that fail as they should,
solutions that pass, grading, the plug-in that runs a student's code inside minillm, and `show`."""

import ast
import importlib.util
import inspect
import re
import subprocess
import sys
import types
import xml.etree.ElementTree as ET

import pytest
import torch

from minillm.course import CHAPTERS, ROOT, exercise_file, markers, show, use_impl
from minillm.course import build as builder
from minillm.course.build import build, check, edited, render
from minillm.course.grade import Result, scoreboard
from minillm.course.markers import MarkerError, find_exercises, scan_file

EXERCISES = find_exercises()


def asserted_attributes() -> dict[str, set[str]]:
    """Per exercise, the attribute names its tests assert on (`seq.num_cached_tokens` → num_cached_tokens),
    less torch's and str's own (shape, dtype, tolist, join) and the exercise functions' names."""
    generic = set(dir(torch)) | set(dir(torch.Tensor)) | set(dir(str)) | {e.qualname.split(".")[-1] for e in EXERCISES}
    found: dict[str, set[str]] = {e.id: set() for e in EXERCISES}
    for path in (ROOT / "tests" / "exercises").glob("test_*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            ids = [
                d.args[0].value
                for d in getattr(fn, "decorator_list", [])
                if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "exercise"
            ]
            for node in (n for n in ast.walk(fn) if ids and isinstance(n, ast.Assert)):
                for a in (a for a in ast.walk(node.test) if isinstance(a, ast.Attribute) and a.attr not in generic):
                    for id in ids:
                        found[id].add(a.attr)
    return found


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_the_stub_docstring_names_everything_its_tests_assert_on(exercise):
    """The stub is the whole spec: each attribute a test checks (say num_cached_tokens for 05.4) is named in it."""
    stub = load_impl_module(exercise_file("exercises", exercise.chapter))
    obj = stub
    for part in exercise.qualname.split("."):
        obj = getattr(obj, part)
    doc = inspect.getdoc(obj) or ""
    assert len(doc.split()) >= 40, f"{exercise.id}: {exercise.qualname}'s docstring is too short to be a spec"
    missing = sorted(a for a in asserted_attributes()[exercise.id] if a not in doc)
    assert not missing, f"{exercise.id}: the tests check {missing}, which {exercise.qualname}'s docstring never names"


def load_impl_module(path):
    spec = importlib.util.spec_from_file_location(f"_stub_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date():
    problems = check()
    assert not problems, "; ".join(problems) + ". Run `python -m minillm.course build`."


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_stub_contains_no_line_of_the_reference_body(exercise):
    body = exercise.path.read_text().splitlines()[exercise.begin : exercise.end - 1]
    stub = {line.strip() for line in exercise_file("exercises", exercise.chapter).read_text().splitlines()}
    leaked = [line.strip() for line in body if re.search(r"\w", line) and line.strip() in stub]
    assert not leaked, f"exercises/ shows lines of exercise {exercise.id}'s solution: {leaked}"


@pytest.fixture(scope="module")
def stub_run(tmp_path_factory) -> list[tuple[str, str | None, str, str]]:
    """tests/exercises run on the untouched stubs in a fresh interpreter: (test, exercise, outcome, message)."""
    report = tmp_path_factory.mktemp("stubs") / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "tests" / "exercises"),
            "--impl=exercises",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
        ],
        cwd=ROOT,
        capture_output=True,
    )
    rows = []
    for case in ET.parse(report).iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        rows.append(
            (
                case.get("name"),
                props.get("exercise"),
                "passed" if problem is None else problem.tag,
                "" if problem is None else problem.get("message", ""),
            )
        )
    return rows


def test_every_exercise_test_fails_on_the_untouched_stubs(stub_run):
    wrong = [
        (test, outcome, message[:200])
        for test, exercise, outcome, message in stub_run
        if outcome != "failure" or not message.startswith(f"NotImplementedError: Exercise {exercise} (")
    ]
    assert stub_run and not wrong, "each test must fail with its own exercise's NotImplementedError, not pass or crash"


def test_every_exercise_has_a_test(stub_run):
    untested = sorted({e.id for e in EXERCISES} - {exercise for _, exercise, _, _ in stub_run})
    assert not untested, f"no test in tests/exercises grades {untested}: mark some with @pytest.mark.exercise('NN.k')"


def test_grade_all_passes_on_the_solutions():
    done = subprocess.run(
        [sys.executable, "-m", "minillm.course", "grade", "all", "--impl", "solutions"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and re.search(r"PASS  \d\d\.\d+", done.stdout)


def test_grade_one_exercise_runs_only_its_tests():
    done = subprocess.run(
        [sys.executable, "-m", "minillm.course", "grade", "05.4", "--impl", "solutions"],
        cwd=ROOT / "notebooks",
        capture_output=True,
        text=True,
    )  # from inside the course
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.findall(r"(PASS|FAIL|--) +(\d\d\.\d+)", done.stdout) == [("PASS", "05.4")], done.stdout
    row, total = (
        re.search(r"05\.4  BlockManager\.allocate: (\d+)/\1 tests pass", done.stdout),
        re.search(r"1 of 1 exercises done \((\d+) of \1 tests pass\)", done.stdout),
    )
    assert row and total and row[1] == total[1], "every test that ran must be one of 05.4's"


def test_scoreboard_names_the_first_failure():
    results = [
        Result("test_a", "03.1", "passed"),
        Result("test_b[x]", "03.1", "failed", "AssertionError: off"),
        Result("test_c", "03.2", "passed"),
        Result("test_d", "03.3", "skipped"),
        Result("test_e", "03.3", "passed"),
    ]
    board = scoreboard(["03"], results)
    assert "FAIL  03.1  rms_norm: 1/2 tests pass\n        test_b[x]: AssertionError: off\n" in board
    assert "PASS  03.2  apply_rotary: 1/1 tests pass" in board and "PASS  03.3" in board
    assert "2 of 3 exercises done (3 of 5 tests pass)." in board


def test_build_writes_both_files_and_never_overwrites_a_students_edits(tmp_path):
    assert build(root=tmp_path)[1] == [] and check(tmp_path) == []
    student = tmp_path / "exercises" / exercise_file("exercises", "03").name
    assert not edited(student)
    mine = re.sub(r"raise NotImplementedError\((.|\n)*?\n    \)", "return x", student.read_text(), count=1)
    student.write_text(mine)
    assert edited(student)
    assert check(tmp_path) == [f"exercises/{student.name} is out of date"]
    done, refused = build(root=tmp_path)
    assert (done, student.read_text()) == ([], mine) and "has your edits" in refused[0]
    without_exercises = next(c for c in CHAPTERS if c not in {e.chapter for e in EXERCISES})
    stale = tmp_path / "solutions" / exercise_file("solutions", without_exercises).name
    stale.write_text("")
    assert f"solutions/{stale.name} is not generated from any exercise marker" in check(tmp_path)
    build(root=tmp_path, force=True)
    assert not stale.exists() and not edited(student) and check(tmp_path) == []


@pytest.mark.parametrize(
    "source, error",
    [
        ("def f():\n    # BEGIN EXERCISE 03.9: x\n    pass\n", "m.py:2: BEGIN EXERCISE 03.9 has no END"),
        ("def f():\n    pass\n    # END EXERCISE\n", "m.py:3: END EXERCISE without a BEGIN"),
        ("# BEGIN EXERCISE 03.9: x\nX = 1\n# END EXERCISE\n", "m.py:3: exercise 03.9 is not inside a function"),
        ("def f():\n    # BEGIN EXERCISE 3.9 x\n    pass\n", "m.py:2: malformed marker"),
    ],
)
def test_a_bad_marker_is_reported_with_its_file_and_line(tmp_path, source, error):
    (tmp_path / "m.py").write_text(source)
    with pytest.raises(MarkerError, match=re.escape(error)):
        scan_file(tmp_path / "m.py", root=tmp_path)


def test_use_impl_swaps_a_function_wherever_minillm_holds_it_and_restores_it(monkeypatch):
    from minillm.layers import rms_norm as module

    reference, norm = module.rms_norm, module.RMSNorm(8)
    importer = types.ModuleType("minillm._importer")  # a module that did `from … import rms_norm as norm`
    importer.norm = reference
    monkeypatch.setitem(sys.modules, importer.__name__, importer)
    with use_impl("exercises", "03.1") as impl:
        assert module.rms_norm is impl.rms_norm is importer.norm
        with pytest.raises(NotImplementedError, match=r"^Exercise 03\.1 \(RMSNorm .*implement rms_norm in exercises/"):
            norm(torch.randn(2, 8))
    assert module.rms_norm is reference is importer.norm
    norm(torch.randn(2, 8))


SHOP = '''"""A module whose exercises are methods, as in later chapters."""
import math
from collections import Counter

TAX = 0.5


def price(n):
    return n * (1 + TAX)


class Cart:
    def __init__(self):
        self.items = Counter()

    def add(self, item, n=1):
        """Put n of item into the cart."""
        assert n > 0  # an unmarked line: the stub keeps it
        # BEGIN EXERCISE 05.8: count the item
        self.items[item] += n
        # END EXERCISE
        return self

    def total(self):
        # BEGIN EXERCISE 05.9: add up the prices
        return math.fsum(price(n) for n in self.items.values())
        # END EXERCISE
'''


def test_methods_are_served_in_a_subclass_that_use_impl_plugs_in(tmp_path, monkeypatch):
    (tmp_path / "course_shop").mkdir()
    (tmp_path / "course_shop" / "__init__.py").write_text("")
    (tmp_path / "course_shop" / "cart.py").write_text(SHOP)
    monkeypatch.syspath_prepend(tmp_path)
    found = tuple(scan_file(tmp_path / "course_shop" / "cart.py", root=tmp_path))
    monkeypatch.setattr(markers, "find_exercises", lambda: found)
    monkeypatch.setattr(builder, "find_exercises", lambda: found)
    impls = {}
    for kind in ("exercises", "solutions"):
        (tmp_path / f"{kind}.py").write_text(render("05", kind))
        spec = importlib.util.spec_from_file_location(f"shop_{kind}", tmp_path / f"{kind}.py")
        spec.loader.exec_module(impls.setdefault(kind, importlib.util.module_from_spec(spec)))
    stub = (tmp_path / "exercises.py").read_text()
    assert "import math\n" in stub and "from course_shop.cart import price\n" in stub and "Counter" not in stub
    assert "class Cart(course_shop.cart.Cart):" in stub and "assert n > 0" in stub and "+= n" not in stub

    from course_shop.cart import Cart

    with use_impl(impls["solutions"], "05"):
        assert Cart().add("pear", 2).total() == 3.0
    with use_impl(impls["exercises"], "05.9"):
        cart = Cart().add("pear", 2)  # add (05.8) is still minillm's
        with pytest.raises(NotImplementedError, match=r"Exercise 05\.9 .*implement Cart\.total in exercises/ex05_"):
            cart.total()
    assert cart.total() == 3.0


def test_show_hides_exercise_bodies_unless_asked_for_the_solution():
    from minillm.layers.rms_norm import rms_norm

    body = [
        line.strip()
        for e in EXERCISES
        if e.id == "03.1"
        for line in e.path.read_text().splitlines()[e.begin : e.end - 1]
    ]
    hidden, revealed = repr(show(rms_norm)), repr(show(rms_norm, solution=True))
    assert hidden.startswith("# minillm/layers/rms_norm.py, lines ") and "def rms_norm(" in hidden
    assert "raise NotImplementedError(" in hidden and not any(line in hidden for line in body)
    assert all(line in revealed for line in body)
    assert "<span" in show(rms_norm)._repr_html_()


def test_show_gives_a_triton_kernels_python_source_with_its_exercise_as_a_stub():
    from minillm.kernels.triton.kv_cache import store_kvcache_kernel

    source = str(show(store_kvcache_kernel))
    assert "def store_kvcache_kernel(" in source and "Exercise 09.1" in source


def test_show_cpp_gives_a_kernel_function_with_its_comment_and_template_lines():
    from minillm.course import show_cpp

    source = show_cpp("linear_cpu.cpp", "stream")
    lines = repr(source).splitlines()
    assert lines[0].startswith("# minillm/kernels/csrc/linear_cpu.cpp, lines ")
    assert (
        lines[1].startswith("// y[b] = x[b] @ panels") and lines[4] == "template <int B, int HINT>" and lines[-1] == "}"
    )
    assert sum(line.startswith("void ") for line in lines) == 1  # this one function, not the next
    assert "<span" in source._repr_html_()
    with pytest.raises(
        ValueError, match="no function 'no_such_function' is defined in minillm/kernels/csrc/linear_cpu"
    ):
        show_cpp("linear_cpu.cpp", "no_such_function")
