"""The chapters of the course, and the files each one has: its exercises, its solutions and its notebook.

Kept apart from minillm.course's `__init__` so that the modules it re-exports (hints, impl, markers, ...) can
import these without importing the package that imports them (no import cycle)."""

from pathlib import Path

from minillm.course.root import course_root

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
    "15": "scaling_out",
    "16": "structured_outputs",
}


def exercise_file(kind: str, chapter: str, root: Path | None = None) -> Path:
    """exercises/exNN_<topic>.py (kind "exercises") or solutions/exNN_<topic>.py (kind "solutions") in the
    course folder, or under `root` (Path() gives the path relative to the course)."""
    return (course_root() if root is None else root) / kind / f"ex{chapter}_{CHAPTERS[chapter]}.py"


def notebook_file(chapter: str, root: Path | None = None) -> Path:
    """notebooks/NN_<topic>.ipynb in the course folder, or under `root` (as for exercise_file)."""
    return (course_root() if root is None else root) / "notebooks" / f"{chapter}_{CHAPTERS[chapter]}.ipynb"
