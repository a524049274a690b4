"""Where an engine step's time goes: schedule, prepare, forward, sample, postprocess, and the rest ("other").

The engine's own methods are wrapped with timers on the instance: an instance attribute shadows the class's
method, and deleting it brings the method back, so the engine runs unchanged code and knows nothing of the
measurement. The wrappers cost one or two microseconds per call (~15 us a step) against steps of
milliseconds, so the breakdown is taken during the timed run itself; a second, separate run would find its
prompts in the prefix cache and time other prefills than the ones the throughput figures count.
"""

import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Callable, NamedTuple

from torch import nn

# part of a step -> the engine methods it is made of (attribute paths from the engine)
PARTS = {
    "schedule": ["scheduler.schedule"],
    "prepare": ["model_runner.prepare_prefill", "model_runner.prepare_decode", "model_runner.load"],
    "forward": ["model_runner.run_model"],
    "sample": ["model_runner.prepare_sample", "model_runner.sampler"],
    "postprocess": ["scheduler.update_from_output"],
}


class Step(NamedTuple):
    is_prefill: bool
    batch_size: int
    seconds: float
    parts: dict[str, float]


def find(engine, path: str) -> tuple[object, str]:
    """The (object, attribute) to wrap for engine.<path>; a module (the sampler) is timed through its forward."""
    *owners, name = path.split(".")
    obj = engine
    for owner in owners:
        obj = getattr(obj, owner, None)
    target = getattr(obj, name, None)
    if not callable(target):
        expected = ", ".join(f"engine.{p}()" for p in ["step", *sum(PARTS.values(), [])])
        raise RuntimeError(
            f"the bench times engine.{path}(), which this engine does not have: the step "
            f"breakdown needs {expected} (names in minillm/bench/breakdown.py)"
        )
    return (target, "forward") if isinstance(target, nn.Module) else (obj, name)


@contextmanager
def wrapped(obj, name: str, make_wrapper: Callable):
    """obj.<name> is make_wrapper(original) on the instance while the block runs, then what it was before."""
    before = vars(obj).get(name)
    setattr(obj, name, make_wrapper(getattr(obj, name)))
    try:
        yield
    finally:
        if before is None:
            delattr(obj, name)  # the class's method shows through again
        else:
            setattr(obj, name, before)


class StepBreakdown:
    """While active, times every engine.step() and its parts; on_step(seqs) is called after each step with
    the sequences it scheduled. summary() gives the shares."""

    def __init__(self, engine, on_step: Callable[[list], None] | None = None):
        self.on_step = on_step
        self.steps: list[Step] = []
        self.targets = [(part, *find(engine, path)) for part, paths in PARTS.items() for path in paths]
        self.targets.append(("step", *find(engine, "step")))

    def __enter__(self) -> "StepBreakdown":
        self.stack = ExitStack()
        for part, obj, name in self.targets:
            make_wrapper = self.timed_step if part == "step" else partial(self.timed, part)
            self.stack.enter_context(wrapped(obj, name, make_wrapper))
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def timed(self, part: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.times[part] += time.perf_counter() - start
            self.results[part] = out
            return out

        return wrapper

    def timed_step(self, fn):
        def wrapper(*args, **kwargs):
            self.times, self.results = defaultdict(float), {}
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            seconds = time.perf_counter() - start
            output = self.results["schedule"]
            seqs, is_prefill = output.scheduled, output.is_prefill
            self.steps.append(Step(is_prefill, len(seqs), seconds, dict(self.times)))
            if self.on_step:
                self.on_step(seqs)
            return out

        return wrapper

    def summary(self) -> dict:
        """For prefill and decode steps apart: how many, their mean batch size (sequences) and duration, and
        each part's share of their total time; "other" is the step's time outside the parts."""
        out = {}
        for kind, is_prefill in (("prefill", True), ("decode", False)):
            steps = [s for s in self.steps if s.is_prefill == is_prefill]
            if not steps:
                continue
            total = sum(s.seconds for s in steps)
            share = {part: sum(s.parts.get(part, 0.0) for s in steps) / total for part in PARTS}
            out[kind] = dict(
                num_steps=len(steps),
                mean_batch_size=sum(s.batch_size for s in steps) / len(steps),
                mean_step_ms=total / len(steps) * 1000,
                share=share | {"other": 1 - sum(share.values())},
            )
        return out
