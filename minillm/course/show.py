"""Show minillm's real source in a notebook, so that the course never carries a stale copy of the code.

show(rms_norm)                  the function as minillm has it now, syntax highlighted
show(RMSNorm.forward)           a method; show(minillm.layers.rms_norm) a whole module
show(rms_norm, solution=True)   exercise bodies revealed (by default they are replaced by their stubs)
show_cpp("linear_cpu.cpp", "stream")   a function of the C++ kernels in minillm/kernels/csrc
"""

import html
import inspect
import textwrap
from pathlib import Path

from minillm.course.markers import scan_file
from minillm.course.root import PACKAGE, CourseNotFound, course_root


class Source:
    """Code with a title; Jupyter renders it highlighted (_repr_html_), a terminal prints it as text."""

    def __init__(self, code: str, title: str, language: str = "python"):
        self.code, self.title, self.language = code, title, language

    def __repr__(self) -> str:
        return f"# {self.title}\n{self.code}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name

        code = highlight(self.code, get_lexer_by_name(self.language), HtmlFormatter(noclasses=True))
        return f"<div><code style='font-size: 85%'>{html.escape(self.title)}</code>{code}</div>"


def show(obj, solution: bool = False) -> Source:
    """The source of a function, method, class or module, titled with its file and lines."""
    obj = inspect.unwrap(obj)  # a decorated function (@torch.inference_mode()): show the function itself
    if not inspect.isroutine(obj) and inspect.isfunction(getattr(obj, "fn", None)):
        obj = obj.fn  # a Triton kernel (@triton.jit): its Python function
    lines, start = inspect.getsourcelines(obj)
    start = max(start, 1)  # a module starts at line 0
    path = Path(inspect.getsourcefile(obj)).resolve()
    end = start + len(lines) - 1
    if not solution:
        for e in reversed(scan_file(path) if path.is_relative_to(PACKAGE) else []):
            if start <= e.begin and e.end <= end:
                lines[e.begin - start + 1 : e.end - start] = [s + "\n" for s in e.stub()]
    return Source(textwrap.dedent("".join(lines)).rstrip("\n"), f"{_where(path)}, lines {start}–{end}")


def show_cpp(file: str, name: str) -> Source:
    """A function of minillm's C++ kernels (a file of minillm/kernels/csrc): the comment lines and template line
    above its definition, which starts at column 0 and names `name(`, down to its closing brace at column 0."""
    path = PACKAGE / "kernels" / "csrc" / file
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line[:1].strip() and f" {name}(" in line), None)
    if start is None:
        raise ValueError(f"no function {name!r} is defined in {_where(path)}")
    end = lines.index("}", start)
    while start > 0 and lines[start - 1].startswith(("//", "template")):
        start -= 1
    return Source("\n".join(lines[start : end + 1]), f"{_where(path)}, lines {start + 1}–{end + 1}", "cpp")


def _where(path: Path) -> str:
    """minillm/… for the package's files, exercises/… for the course's, else the full path."""
    if path.is_relative_to(PACKAGE.parent):
        return path.relative_to(PACKAGE.parent).as_posix()
    try:
        return path.relative_to(course_root()).as_posix()
    except (CourseNotFound, ValueError):
        return path.as_posix()
