"""The package's layering, checked from its source (DESIGN.md §3): no import cycle in minillm/, no layer that reaches
into the engine, native code reached only through minillm/kernels/, and core files short enough to read
in one sitting.

The import graph is read with `ast`, so nothing is imported to build it: one node per module (a package's
`__init__.py` is a node of its own, `minillm.engine`), one edge per `import` or `from ... import`, those inside
functions included (an import moved into a function hides a cycle, it does not break it), those under
`if TYPE_CHECKING:` left out (they are never run: annotations only)."""

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minillm"
MAX_LINES = 300
CORE_FILES = [
    *sorted((PACKAGE / "engine").glob("*.py")),
    *sorted((PACKAGE / "config").glob("*.py")),
    *(PACKAGE / f for f in ("llm.py", "sampling_params.py")),
]


def module_name(path: Path) -> str:
    """minillm/engine/scheduler.py -> minillm.engine.scheduler; minillm/engine/__init__.py -> minillm.engine."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def walk(node: ast.AST):
    """ast.walk, less the bodies of `if TYPE_CHECKING:` (imports for annotations only, never run)."""
    yield node
    type_checking = isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
    for child in node.orelse if type_checking else ast.iter_child_nodes(node):
        yield from walk(child)


def resolve(name: str) -> str | None:
    """The minillm module that `name` is or lies in: minillm.config.Config -> minillm.config; None outside minillm."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The names one import statement in `module` imports, relative imports made absolute; `from pkg import name`
    gives pkg.name, which resolve() maps to the submodule pkg.name if there is one, else to pkg."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # `from . import x` in a package's __init__ is relative to the package itself
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        package = package.rsplit(".", node.level - 1)[0]  # each dot past the first goes up one package
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {module it imports: where, as "minillm/x.py:LINE"}."""
    graph = {}
    for module, path in MODULES.items():
        graph[module] = {}
        for node in walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in map(resolve, imported(module, node)):
                    if target and target != module:
                        graph[module].setdefault(target, f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def reachable(graph: dict, start: str) -> set[str]:
    """Every module that importing `start` imports, directly or not."""
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module: groups in which each module imports every other
    one, directly or not."""
    reach = {module: reachable(graph, module) for module in graph}
    components = {frozenset(m for m in reach[module] if module in reach[m]) for module in graph}
    return sorted(sorted(c) for c in components if len(c) > 1)


def shortest_cycle(graph: dict, component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself (breadth-first)."""
    start = component[0]
    paths, todo = {start: [start]}, deque([start])
    while todo:
        module = todo.popleft()
        for target in graph[module]:
            if target == start:
                return paths[module] + [start]
            if target in component and target not in paths:
                paths[target] = paths[module] + [target]
                todo.append(target)


def describe(graph: dict, component: list[str]) -> str:
    """The component's modules, and one of its cycles with the import line of each step."""
    cycle = shortest_cycle(graph, component)
    steps = [f"    {graph[a][b]}: {a} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return f"  {', '.join(component)}; e.g.\n" + "\n".join(steps)


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, (
        f"{len(found)} import cycle(s) in minillm/, each a group of modules that import one another, directly or not:\n"
        + "\n".join(describe(graph, component) for component in found)
        + "\nBreak each: import in one direction only (a lower layer never imports a higher one), or move what both "
        "sides need into a small module of its own that imports neither."
    )


@pytest.mark.parametrize("package", ["minillm.layers", "minillm.spec_decode"])
def test_layers_and_proposers_never_import_the_engine(package):
    """As in vLLM V1: layers see tensors and the step's context; proposers get what they need from the model runner
    that owns them (minillm.spec_decode.DraftInput, an injected runner). Neither reaches up into the engine."""
    graph = import_graph()
    wrong = [
        f"  {where}: {module} imports {target}"
        for module, targets in graph.items()
        if module == package or module.startswith(package + ".")
        for target, where in targets.items()
        if target == "minillm.engine" or target.startswith("minillm.engine.")
    ]
    assert not wrong, (
        f"{package} imports from minillm.engine:\n" + "\n".join(wrong) + "\nMove what it needs down (into the layer, "
        "minillm/utils/ or the values the engine passes in) and let the engine import it."
    )


def test_core_files_are_short():
    lengths = {path.relative_to(ROOT): len(path.read_text().splitlines()) for path in CORE_FILES}
    long = [f"  {path}: {n} lines" for path, n in lengths.items() if n > MAX_LINES]
    assert not long, (
        f"core files over {MAX_LINES} lines:\n" + "\n".join(long) + "\nSplit each: move a part with a name of its "
        "own (a class, a group of pure functions) into a module beside it (nano-vllm's largest file is ~260 lines)."
    )


def test_only_minillm_kernels_builds_or_calls_native_code():
    """The C++ extension is built, loaded and called in minillm/kernels/ alone (kernels/cpu.py wraps every op), as
    vLLM keeps its ops behind _custom_ops.py: elsewhere no torch.utils.cpp_extension, no torch.ops.minillm_cpu, no
    torch.ops.load_library."""
    wrong = []
    for module, path in MODULES.items():
        if module == "minillm.kernels" or module.startswith("minillm.kernels."):
            continue
        for node in walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [ast.unparse(node)]
            native = ("torch.utils.cpp_extension", "torch.ops.minillm_cpu", "torch.ops.load_library")
            wrong += [f"  {path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.startswith(native)]
    assert not wrong, (
        "native code reached outside minillm/kernels/:\n" + "\n".join(sorted(set(wrong))) + "\nCall the op through "
        "its wrapper in minillm/kernels/cpu.py (add one there if it has none)."
    )
