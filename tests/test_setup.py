"""The conda path (environment.yml) and the pip path (pyproject.toml) install the same packages."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_deps = set(project["dependencies"]) | set(project["optional-dependencies"]["dev"])
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    conda_pip = {re.sub(r"^\s*- ", "", line) for line in lines[start + 1 :] if line.strip().startswith("- ")}
    assert conda_pip - {"-e ."} == pip_deps
    assert "-e ." in conda_pip


def test_torch_is_pinned_exactly():
    """A bare or open-ended torch requirement pulls a multi-GB CUDA build on a CPU-only machine."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [d for d in project["dependencies"] if d.startswith("torch")] == ["torch==2.13.0"]
