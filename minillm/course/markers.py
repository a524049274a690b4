"""Find the exercises: `# BEGIN EXERCISE NN.k: <task>` … `# END EXERCISE` regions in minillm's source.

A region sits inside a top-level function or inside a method of a top-level class; the lines between the two
markers are the reference body a student writes. Chapter NN is the exercise id's prefix. The markers are read
from the minillm package that is imported, wherever it is installed.
"""

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from minillm.course.chapters import CHAPTERS, exercise_file, notebook_file
from minillm.course.root import PACKAGE

BEGIN = re.compile(r"^(\s*)# BEGIN EXERCISE (\d\d\.\d+): (\S.*)$")
END = re.compile(r"^\s*# END EXERCISE\s*$")


class MarkerError(ValueError):
    """A marker that cannot be turned into an exercise; the message names the file and line."""


@dataclass(frozen=True)
class Exercise:
    id: str  # "03.1"
    task: str  # the one-line task after the colon
    module: str  # "minillm.layers.rms_norm"
    qualname: str  # "rms_norm", or "BlockManager.allocate" for a method
    path: Path
    source: str  # the path from the package's parent folder ("minillm/…"), as the generated files name it
    begin: int  # 1-based line numbers of the BEGIN and END marker lines
    end: int
    indent: str  # the BEGIN marker's indentation
    generator: bool = False  # the reference body yields: the stub must stay a generator

    @property
    def chapter(self) -> str:
        return self.id[:2]

    @property
    def name(self) -> str:
        """The function's (or method's) name."""
        return self.qualname.rpartition(".")[2]

    @property
    def owner(self) -> str | None:
        """The class a method belongs to, None for a function."""
        return self.qualname.rpartition(".")[0] or None

    def stub(self) -> list[str]:
        """What replaces the reference body in a student's file: a raise that says what to do and where."""
        student_file = exercise_file("exercises", self.chapter, Path()).as_posix()
        notebook = notebook_file(self.chapter, Path()).as_posix()
        i = self.indent
        return [
            f"{i}raise NotImplementedError(",
            f'{i}    "Exercise {self.id} ({self.task}) is not done yet: "',
            f'{i}    "implement {self.qualname} in {student_file} — see {notebook}"',
            f"{i})",
            *([f"{i}yield  # unreachable: keeps this function a generator, as its callers expect"] * self.generator),
        ]


def scan_file(path: Path, root: Path = PACKAGE.parent) -> list[Exercise]:
    """The exercises marked in one source file; its module name is its path relative to `root`."""
    text = path.read_text()
    if "EXERCISE" not in text:
        return []
    source = path.relative_to(root).as_posix()
    module = source.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    functions = dict(_functions(ast.parse(text)))
    found, open_ = [], None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{n}"
        if m := BEGIN.match(line):
            if open_:
                raise MarkerError(f"{where}: BEGIN EXERCISE {m[2]} inside exercise {open_[1][2]} (line {open_[0]})")
            open_ = n, m
        elif END.match(line):
            if not open_:
                raise MarkerError(f"{where}: END EXERCISE without a BEGIN")
            begin, m = open_
            qualname = next((q for q, (a, b) in functions.items() if a < begin <= b), None)
            if qualname is None:
                raise MarkerError(f"{where}: exercise {m[2]} is not inside a function or a method of a top-level class")
            body = text.splitlines()[begin : n - 1]
            generator = any(re.match(r"\s*yield\b", line) for line in body)  # a line that starts with yield
            found.append(Exercise(m[2], m[3].strip(), module, qualname, path, source, begin, n, m[1], generator))
            open_ = None
        elif "EXERCISE" in line and line.lstrip().startswith("# BEGIN"):
            raise MarkerError(f"{where}: malformed marker; write `# BEGIN EXERCISE NN.k: <one-line task>`")
    if open_:
        raise MarkerError(f"{source}:{open_[0]}: BEGIN EXERCISE {open_[1][2]} has no END EXERCISE")
    return found


def _functions(tree: ast.Module):
    """(qualname, (first line, last line)) of top-level functions and of methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, (node.lineno, node.end_lineno)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", (item.lineno, item.end_lineno)


@cache
def find_exercises() -> tuple[Exercise, ...]:
    """Every exercise in minillm (minillm/course itself excluded), ordered by id."""
    found = [
        e
        for path in sorted(PACKAGE.rglob("*.py"))
        if "course" not in path.relative_to(PACKAGE).parts
        for e in scan_file(path)
    ]
    seen = {}
    for e in found:
        if e.id in seen:
            raise MarkerError(f"exercise {e.id} is marked twice: in {seen[e.id].source} and {e.source}")
        if e.chapter not in CHAPTERS:
            raise MarkerError(f"{e.source}:{e.begin}: exercise {e.id}: there is no chapter {e.chapter}")
        seen[e.id] = e
    return tuple(sorted(found, key=lambda e: (e.chapter, int(e.id[3:]))))


def canonical_id(which: str) -> str:
    """An exercise id as the markers write it: "5.4" -> "05.4" (the chapter zero-padded)."""
    chapter, dot, k = which.strip().partition(".")
    return f"{chapter.zfill(2)}{dot}{k}"


def chapter_exercises(which: str) -> list[Exercise]:
    """The exercises of chapter "NN", or the one exercise "NN.k"; raises when there is none."""
    chosen = [e for e in find_exercises() if which in (e.id, e.chapter)]
    if not chosen:
        known = ", ".join(e.id for e in find_exercises())
        raise ValueError(f"no exercise {which!r} in minillm (known exercises: {known})")
    return chosen
