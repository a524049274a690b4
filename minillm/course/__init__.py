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
CHAPTERS, exercise_file() and notebook_file() name each chapter's files (minillm.course.chapters).
"""

from minillm.course.chapters import CHAPTERS, exercise_file, notebook_file
from minillm.course.env_check import check_environment
from minillm.course.figures import engine_map
from minillm.course.hints import Hints
from minillm.course.impl import load_impl, use_impl
from minillm.course.root import CourseNotFound, course_root
from minillm.course.show import show, show_cpp
from minillm.course.widgets import interact


def __getattr__(name: str):
    """`ROOT`, the course folder, looked up when asked for (from the working directory), not at import."""
    if name == "ROOT":
        return course_root()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
