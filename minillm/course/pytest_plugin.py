"""pytest glue for the exercise tests in tests/exercises/ (registered by tests/conftest.py).

- `--impl=solutions|exercises` picks the code under test: solutions/exNN_<topic>.py (the default, so a
  fresh clone is green) or the student's exercises/exNN_<topic>.py.
- `@pytest.mark.exercise("03.1")` says which exercise a test grades; the test also gets the chapter's
  marker (`ch03`), so `pytest -m ch03` selects it, and the id travels in the report for the scoreboard.
- `--exercise=03.1` (repeatable) keeps only the tests of that exercise; the others are deselected.
- The `impl` fixture is the selected module for the test's chapter: `impl.rms_norm(x, w, eps)`.
- A test module that cannot import Triton on macOS or Windows, where Triton does not exist (chapter 09), is
  skipped with the reason (minillm.course.portability), not reported as an error; on Linux a missing Triton
  stays an error, since `make setup` installs it there.
"""

import re

import pytest

from minillm.course.impl import load_impl


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        choices=("solutions", "exercises"),
        default="solutions",
        help="grade solutions/exNN_*.py (default) or the student's exercises/exNN_*.py",
    )
    parser.addoption(
        "--exercise",
        action="append",
        default=[],
        metavar="NN.k",
        help="run only the tests of exercise NN.k (repeat it for several)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "exercise(id): the test grades exercise id ('NN.k'); adds marker chNN")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    chosen, kept, dropped = set(config.getoption("exercise")), [], []
    for item in items:
        if marker := item.get_closest_marker("exercise"):
            item.add_marker(f"ch{marker.args[0][:2]}")
            item.user_properties.append(("exercise", marker.args[0]))
        (kept if not chosen or (marker and marker.args[0] in chosen) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


TRITON_IMPORT_ERROR = re.compile(r"ModuleNotFoundError: .*\btriton\b")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module whose import failed for want of Triton, on a system Triton does not ship for: skipped, with why."""
    report = yield
    if report.failed and isinstance(collector, pytest.Module) and TRITON_IMPORT_ERROR.search(str(report.longrepr)):
        from minillm.course import portability

        if portability.system() == "Linux":
            return report
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {portability.triton_missing()}")
    return report


@pytest.fixture(scope="session")
def _impl_modules(pytestconfig):
    """Each chapter's module, loaded once per session."""
    modules = {}

    def get(chapter: str):
        if chapter not in modules:
            modules[chapter] = load_impl(pytestconfig.getoption("impl"), chapter)
        return modules[chapter]

    return get


@pytest.fixture
def impl(request, _impl_modules):
    """The implementation under test for this test's chapter (see --impl)."""
    marker = request.node.get_closest_marker("exercise")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses `impl` without @pytest.mark.exercise('NN.k')")
    return _impl_modules(marker.args[0][:2])
