"""Plug an implementation of the exercises into minillm, so that your code runs inside the real engine.

    with use_impl("exercises", "03.1"):      # your rms_norm from exercises/ex03_transformer.py
        logits = model.compute_logits(model(input_ids, positions))

Inside the `with`, minillm calls your function wherever it called the reference one; on leaving, the
reference is back. How: a function is replaced on every minillm module that holds it (its defining module,
and any module that did `from … import` it), so callers that look it up by name at call time find yours. A
method is set on its class, so every instance, existing or new, uses it.
"""

import importlib
import importlib.util
import sys
from contextlib import contextmanager
from types import ModuleType

from minillm.course.chapters import exercise_file
from minillm.course.markers import chapter_exercises


def load_impl(kind: str, chapter: str) -> ModuleType:
    """Import exercises/exNN_<topic>.py or solutions/exNN_<topic>.py afresh, so that your latest edits count."""
    path = exercise_file(kind, chapter)
    if not path.exists():
        raise FileNotFoundError(f"{kind}/{path.name} does not exist; `python -m minillm.course build` writes it")
    name = f"{kind}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    spec.loader.exec_module(module)
    return module


@contextmanager
def use_impl(impl: str | ModuleType, which: str):
    """Run minillm with `impl`'s code for exercise "NN.k", or for every exercise of chapter "NN".

    impl is "exercises" (your file), "solutions" (the reference copies) or an already loaded module.
    Yields the module whose code is plugged in.
    """
    exercises = chapter_exercises(which)
    module = load_impl(impl, exercises[0].chapter) if isinstance(impl, str) else impl
    patches = []  # (object, attribute, reference, replacement)
    for e in {e.qualname: e for e in exercises}.values():
        source = importlib.import_module(e.module)
        try:
            replacement = vars(getattr(module, e.owner))[e.name] if e.owner else getattr(module, e.name)
        except (AttributeError, KeyError):
            raise AttributeError(f"{module.__name__} has no {e.qualname}: keep the names that `build` wrote") from None
        if e.owner:
            cls = getattr(source, e.owner)
            patches.append((cls, e.name, vars(cls)[e.name], replacement))
        else:
            reference = getattr(source, e.name)
            patches += [
                (m, attr, reference, replacement)
                for m in _package_modules(e.module)
                for attr, value in list(vars(m).items())
                if value is reference
            ]
    try:
        for obj, attr, _, replacement in patches:
            setattr(obj, attr, replacement)
        yield module
    finally:
        for obj, attr, reference, _ in reversed(patches):
            setattr(obj, attr, reference)


def _package_modules(module: str) -> list[ModuleType]:
    """The loaded modules of `module`'s top-level package (minillm's, for minillm's exercises)."""
    package = module.partition(".")[0]
    return [m for name, m in list(sys.modules.items()) if name.partition(".")[0] == package and m is not None]
