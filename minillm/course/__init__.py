"""The course plumbing: exercises built from markers in minillm's source, their grading, and notebook helpers.

An exercise is a region of minillm's own source fenced by marker comments:

    # BEGIN EXERCISE 03.1: RMSNorm — divide by the root mean square of the last dimension, then scale by weight
    ...reference body...
    # END EXERCISE

`python -m minillm.course build` turns the markers of chapter NN into exercises/exNN_<topic>.py (the bodies
replaced by `raise NotImplementedError`) and solutions/exNN_<topic>.py (the bodies kept). From a notebook:

    show(obj)                        the real source of a function, class or module (exercise bodies hidden)
    use_impl("exercises", "03.1")    run minillm with your code for exercise 03.1 in place of the reference
    load_impl("exercises", "03")     your exercises/ex03_transformer.py, freshly loaded
    check_environment()              chapter 00: versions, device and the default model
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the course repository: minillm/, exercises/, notebooks/, tests/

CHAPTERS = {
    "00": "setup",
    "01": "tokenize",
    "02": "embed",
    "03": "transformer",
    "04": "kv_cache",
    "05": "paged_blocks",
    "06": "continuous_batching",
    "07": "cuda_graphs",
    "08": "torch_compile",
    "09": "triton_kernels",
    "10": "tensor_parallel",
    "11": "full_engine",
}


def exercise_file(kind: str, chapter: str) -> Path:
    """exercises/exNN_<topic>.py (kind "exercises") or solutions/exNN_<topic>.py (kind "solutions")."""
    return ROOT / kind / f"ex{chapter}_{CHAPTERS[chapter]}.py"


def notebook_file(chapter: str) -> Path:
    return ROOT / "notebooks" / f"{chapter}_{CHAPTERS[chapter]}.ipynb"


from minillm.course.env_check import check_environment  # noqa: E402
from minillm.course.impl import load_impl, use_impl  # noqa: E402
from minillm.course.show import show  # noqa: E402

__all__ = ["CHAPTERS", "ROOT", "check_environment", "exercise_file", "load_impl", "notebook_file", "show", "use_impl"]
