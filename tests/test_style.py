"""The code's style is checked, not argued: ruff's formatter and linter (configured in pyproject.toml: 120 columns,
pycodestyle, pyflakes, import order) report nothing on the package, the tests and the scripts."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]])
def test_ruff_reports_nothing(command):
    run = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"ruff {' '.join(command)} . (fix with `ruff format .` / `ruff check --fix .`):\n" + (
        run.stdout + run.stderr
    )
