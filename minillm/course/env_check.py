"""Chapter 00: is this machine ready for the course? Python and package versions, device, the default model.

In the spirit of rasbt's python_environment_check.py: one line per check, [OK] or [FAIL] with what to do.
The required versions are the ones minillm's pyproject.toml declares (read from the installed metadata).
"""

import importlib.metadata as md
import os
import platform
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

FIX = "`make setup` (or `pip install -e '.[dev]'`) installs it"
# the project's own test suite and style checks use these (`make test`); following the course does not
DEVELOPER_TOOLS = {"hypothesis", "playwright", "ruff", "schemathesis"}


def check_environment() -> bool:
    """Print one line per check; True when everything the course needs is in place. The developer tools are
    listed apart, on one line, and never fail the check."""
    reqs = _requirements()
    results = [_python(), *(_package(r) for r in reqs if r.name not in DEVELOPER_TOOLS), _device(), _default_model()]
    for ok, line in results:
        print(f"[{'OK' if ok else 'FAIL'}] {line}")
    tools = [_package(r) for r in reqs if r.name in DEVELOPER_TOOLS]
    if tools:
        print("(for the project's own tests, not needed by the course: " + "; ".join(line for _, line in tools) + ")")
    ok = all(ok for ok, _ in results)
    print("\nAll set: on to chapter 01." if ok else "\nFix the [FAIL] lines above, then run this check again.")
    return ok


def _requirements() -> list[Requirement]:
    """minillm's dependencies and its dev extra (the notebook and test tools), for this platform."""
    reqs = [Requirement(r) for r in md.requires("minillm") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": "dev"})]


def _python():
    needed = SpecifierSet(md.metadata("minillm")["Requires-Python"] or "")
    version = platform.python_version()
    return version in needed, f"Python {version} (minillm needs {needed})"


def _package(req: Requirement):
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        return False, f"{req.name} is not installed (needs {req.specifier}); {FIX}"
    if not req.specifier.contains(version, prereleases=True):
        return False, f"{req.name} {version} is installed, minillm needs {req.specifier}; {FIX}"
    return True, f"{req.name} {version}"


def _device():
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return True, (
            f"device: CUDA, {torch.cuda.device_count()} × {props.name} "
            f"({props.total_memory / 2**30:.0f} GiB); the engine uses bf16, CUDA graphs and Triton kernels"
        )
    return True, (
        f"device: CPU, {os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads; the engine "
        "runs in fp32 and the GPU-only steps are explained instead of run"
    )


def _default_model():
    import minillm
    from minillm.models import build_model
    from minillm.naive import generate_naive
    from minillm.tokenizer import Tokenizer

    path = minillm.default_model_path()
    where = path.relative_to(Path(minillm.__file__).parents[1]).as_posix()
    missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).exists()]
    missing += [] if list(path.glob("*.safetensors")) else ["*.safetensors"]
    if missing:
        return False, (
            f"default model: {where} has no {', '.join(missing)} yet. It ships with minillm; "
            "`python scripts/build_default_model.py` builds it"
        )
    start = time.perf_counter()
    model, tokenizer = build_model(path), Tokenizer(path)
    prompt = "Once upon a time"
    story = tokenizer.decode(list(generate_naive(model, tokenizer.encode(prompt), 12)))
    size = sum(p.numel() for p in model.parameters())
    return True, (
        f"default model: {model.config.architecture}, {size / 1e6:.1f} M parameters, loaded and ran in "
        f"{time.perf_counter() - start:.1f} s: {prompt!r} → {story!r}"
    )
