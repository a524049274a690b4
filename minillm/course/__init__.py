"""The course plumbing: exercises built from markers in minillm's source, their grading, and notebook helpers.

An exercise is a region of minillm's own source fenced by marker comments:

    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 03.1: RMSNorm — divide by the root mean square of the last dimension, then scale by weight
    ...reference body...
    # END EXERCISE

`python -m minillm.course build` turns the markers of chapter NN into exercises/exNN_<topic>.py (the bodies
replaced by `raise NotImplementedError`) and solutions/exNN_<topic>.py (the bodies kept). From a notebook:

    show(obj)                        the real source of a function, class or module (exercise bodies hidden)
    show_cpp("linear_cpu.cpp", "linear")   a function of the C++ kernels (minillm/kernels/csrc)
    use_impl("exercises", "03.1")    run minillm with your code for exercise 03.1 in place of the reference
    load_impl("exercises", "03")     your exercises/ex03_transformer.py, freshly loaded
    check_environment()              chapter 00: versions, device and the default model
    Hints("05.4")                    the three hints of an exercise, folded, to open one at a time
    engine_map("05")                 the "you are here" map of the engine, chapter 05 highlighted
    interact(draw, temperature=...)  ipywidgets controls over a drawing that also renders headless

The course folders (exercises/, solutions/, notebooks/, tests/) are found from the working directory, so
minillm may be installed editable or not; `course_root()` says where they are (see minillm.course.root).
"""

from pathlib import Path

from minillm.course.root import CourseNotFound, course_root

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
    "12": "serving",
    "13": "speculative_decoding",
    "14": "quantization",
}


def exercise_file(kind: str, chapter: str, root: Path | None = None) -> Path:
    """exercises/exNN_<topic>.py (kind "exercises") or solutions/exNN_<topic>.py (kind "solutions") in the
    course folder, or under `root` (Path() gives the path relative to the course)."""
    return (course_root() if root is None else root) / kind / f"ex{chapter}_{CHAPTERS[chapter]}.py"


def notebook_file(chapter: str, root: Path | None = None) -> Path:
    """notebooks/NN_<topic>.ipynb in the course folder, or under `root` (as for exercise_file)."""
    return (course_root() if root is None else root) / "notebooks" / f"{chapter}_{CHAPTERS[chapter]}.ipynb"


def __getattr__(name: str):
    """`ROOT`, the course folder, looked up when asked for (from the working directory), not at import."""
    if name == "ROOT":
        return course_root()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from minillm.course.env_check import check_environment  # noqa: E402
from minillm.course.figures import engine_map  # noqa: E402
from minillm.course.hints import Hints  # noqa: E402
from minillm.course.impl import load_impl, use_impl  # noqa: E402
from minillm.course.show import show, show_cpp  # noqa: E402
from minillm.course.widgets import interact  # noqa: E402

__all__ = [
    "CHAPTERS",
    "CourseNotFound",
    "Hints",
    "check_environment",
    "course_root",
    "engine_map",
    "exercise_file",
    "interact",
    "load_impl",
    "notebook_file",
    "show",
    "show_cpp",
    "use_impl",
]
