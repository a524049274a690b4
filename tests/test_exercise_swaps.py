"""use_impl plugs a student's function in by setting it on the minillm modules (or the class) that hold the
reference, so the engine runs it only where it looks the function up at call time. A reference kept anywhere
else at import (a dict or list, a default argument, a class attribute, a functools.partial, a closure, a
decorator's wrapper) would keep calling minillm's own code: here no exercise's reference is held anywhere else.

That use_impl then reaches the engine is checked in tests/test_course.py (the RMSNorm layer runs the student's
rms_norm) and by every chapter's tests in tests/exercises/.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel is defined: before minillm.kernels.triton

import functools  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import pkgutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import minillm  # noqa: E402
from minillm.course.markers import chapter_exercises, find_exercises  # noqa: E402

# The attributes of functions, partials and bound methods that can hold a function.
ATTRIBUTES = ("__defaults__", "__kwdefaults__", "__closure__", "__dict__", "__func__", "func", "args", "keywords")
FIX = "look the function up when it is called (module.function(...), self.method(...)) instead of keeping it"


def import_minillm() -> list[str]:
    """Import every minillm module but the `__main__` ones (they run on import); return the ones skipped because
    an optional package they need is not installed."""
    skipped = []
    for info in pkgutil.walk_packages(minillm.__path__, "minillm."):
        if info.name.rpartition(".")[2] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            if e.name is None or e.name.partition(".")[0] == "minillm":
                raise
            skipped.append(f"{info.name} (needs {e.name})")
    return skipped


def find_bypasses(exercises) -> list[str]:
    """One message per object, other than a minillm module's namespace (for a function) or its class's (for a
    method), that holds an exercise's reference: the objects use_impl does not patch."""
    module_namespaces = {id(vars(m)) for name, m in list(sys.modules.items()) if m and name.split(".")[0] == "minillm"}
    found = []
    for e in exercises:
        source = importlib.import_module(e.module)
        reference = vars(getattr(source, e.owner))[e.name] if e.owner else getattr(source, e.name)
        # A class's namespace is the dict behind its mappingproxy. The reference's own parts (its __dict__, a
        # kernel's wrapped function) may point back at it; its __globals__ is its module's namespace, not a part.
        allowed = {id(gc.get_referents(vars(getattr(source, e.owner)))[0])} if e.owner else module_namespaces
        parts, namespace = gc.get_referents(reference), getattr(reference, "__globals__", None)
        allowed = allowed | {id(p) for p in parts if p is not namespace}  # no comprehension names `reference`
        # Frames are code running now (this test's, pytest's), not something kept from import.
        holders = [
            h for h in gc.get_referrers(reference) if id(h) not in allowed and not isinstance(h, types.FrameType)
        ]
        for holder in holders:
            where = _address(holder, {id(holders)}) + (_step(holder, reference) or "")
            owner = _namespace_owner(holder)
            kind = (
                "class attribute" if isinstance(owner, type) else "module attribute" if owner else type(holder).__name__
            )
            found.append(f"exercise {e.id}: {e.module}.{e.qualname} is held at {where} (a {kind})")
    return found


# The helpers below use plain loops: a comprehension or generator that named obj would hold it in a cell, which
# would then show up as one more holder.


def _address(obj, skip: set[int], depth: int = 6) -> str:
    """Where obj can be reached from, as code: "minillm.engine.x.TABLE['norm']", "minillm.x.f.__defaults__[0]"."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, type) and getattr(sys.modules.get(obj.__module__), obj.__qualname__, None) is obj:
        return f"{obj.__module__}.{obj.__qualname__}"  # a class by the name it is defined under
    best_rank, best_step, best_holder = 3, None, None  # a module names obj best, then a namespace, then the rest
    holders = gc.get_referrers(obj) if depth else []
    for holder in holders:
        if id(holder) in skip or isinstance(holder, types.FrameType):
            continue
        step = _step(holder, obj)
        rank = 0 if isinstance(holder, types.ModuleType) else 1 if _namespace_owner(holder) is not None else 2
        if step is not None and rank < best_rank:
            best_rank, best_step, best_holder = rank, step, holder
    if best_holder is None:
        return f"<a {type(obj).__name__} that nothing named holds>"
    return _address(best_holder, skip | {id(holders), id(obj)}, depth - 1) + best_step


def _step(holder, obj) -> str | None:
    """How holder refers to obj, as code (".name", "[key]", ".func"); None when it is not one of these ways."""
    if isinstance(holder, dict):
        for key, value in holder.items():
            if value is obj:
                return f".{key}" if _namespace_owner(holder) is not None else f"[{key!r}]"
        return " (as a key)" if _holds(holder.keys(), obj) else None
    if isinstance(holder, (list, tuple)):
        for i, value in enumerate(holder):
            if value is obj:
                return f"[{i}]"
        return None
    if isinstance(holder, types.CellType):
        return ".cell_contents" if holder.cell_contents is obj else None
    if isinstance(holder, (types.ModuleType, type)):
        return "" if isinstance(obj, dict) and _holds(gc.get_referents(holder), obj) else None  # its namespace
    for attribute in ATTRIBUTES:
        if getattr(holder, attribute, None) is obj:
            return f".{attribute}"
    try:  # an instance whose attribute it is
        for key, value in vars(holder).items():
            if value is obj:
                return f".{key}"
    except TypeError:  # no __dict__
        pass
    return None


def _namespace_owner(d):
    """The module or class whose namespace d is, else None."""
    if isinstance(d, dict):
        for owner in gc.get_referrers(d):
            if isinstance(owner, (types.ModuleType, type)) and _holds(gc.get_referents(owner), d):
                return owner
    return None


def _holds(items, obj) -> bool:
    """Whether obj itself (not an equal object) is among items."""
    for item in items:
        if item is obj:
            return True
    return False


def test_no_exercise_function_is_held_where_use_impl_cannot_swap_it():
    """Checked in a fresh interpreter: nothing but minillm's imports has run there, so no other test's references
    (parametrize lists, helpers) count, and run-time memos such as minillm.utils.compile.compiled's cache (keyed by
    the function a caller looks up at call time, so a swapped function gets its own entry) are still empty."""
    env = dict(os.environ, PYTHONPATH=str(Path(minillm.__file__).parents[1]))  # this minillm
    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    print("skipped (optional packages missing):", report["skipped"] or "none")
    assert report["exercises"] == len(find_exercises())
    assert not report["bypasses"], "\n".join([*report["bypasses"], f"The fix: {FIX}."])


PLANTS = {  # the ways of keeping a reference at import that use_impl cannot reach, and where the finding is
    "dict": (lambda fn: {"norm": fn}, "._PLANTED['norm']"),
    "list": (lambda fn: [fn], "._PLANTED[0]"),
    "default argument": (lambda fn: lambda x, norm=fn: norm(x), "._PLANTED.__defaults__[0]"),
    "closure": (lambda fn: lambda x: fn(x), "._PLANTED.__closure__[0].cell_contents"),
    "partial": (lambda fn: functools.partial(fn, eps=1e-6), "._PLANTED.func"),
    "class attribute": (lambda fn: type("Layer", (), {"norm": fn}), "._PLANTED.norm"),
}


@pytest.mark.parametrize("kind", PLANTS)
def test_the_detector_finds_a_reference_planted_on_a_minillm_module(kind, monkeypatch):
    """The check above can fail: a reference to rms_norm kept by a minillm module is reported, with its address."""
    (exercise,) = chapter_exercises("03.1")
    module = importlib.import_module(exercise.module)
    plant, address = PLANTS[kind]
    monkeypatch.setattr(module, "_PLANTED", plant(module.rms_norm), raising=False)  # undone after the test
    expected = f"exercise 03.1: minillm.layers.rms_norm.rms_norm is held at {module.__name__}{address} ("
    assert any(f.startswith(expected) for f in find_bypasses([exercise])), expected


if __name__ == "__main__":  # the fresh interpreter of the first test
    skipped = import_minillm()
    exercises = find_exercises()
    print(json.dumps({"exercises": len(exercises), "skipped": skipped, "bypasses": find_bypasses(exercises)}))
