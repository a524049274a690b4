"""torch.compile on the hot functions of a step (chapter 08): RMSNorm, add+RMSNorm, rotary, SiLU-and-mul and
the sampler's top-k/top-p.

A layer calls `hot(rms_norm)(x, weight, eps)`: outside `compiled_layers(True)` that is rms_norm itself; inside,
it is rms_norm compiled by torch.compile once per function (inductor fuses its chain of elementwise ops and
its reduction into one kernel), with the number of tokens marked as a dynamic size so that steps of every
batch size share one compiled version. The model runner turns it on for its steps when Config.compile_layers
says so. A function is looked up by name at each call, so an exercise plugged in by use_impl is compiled too.

Each compiled call pays a fixed host cost (dynamo's guards, the AOT wrappers): about 60-100 µs on this
course's 2-core CPU, more than the few eager ops it replaces cost at decode sizes. So it pays where the device
is fast and inside a CUDA graph (which replays the fused kernels without the host), not op by op on a CPU.
"""

from contextlib import contextmanager
from functools import cache

import torch

_ENABLED = False


def mark_token_dims(args: tuple) -> tuple:
    """Mark the leading dimension of each tensor argument with two or more dimensions as dynamic, so that
    torch.compile traces it as a symbol instead of a constant; return args unchanged.

    args is a function call's positional arguments: tensors and other values (floats such as eps, ints). In
    minillm's hot functions, a tensor with ≥ 2 dimensions has the step's tokens (or rows) first — x
    [tokens, hidden], q [tokens, heads, head_dim], logits [rows, vocab] — and that number changes with every
    batch; a 1-D tensor is a weight [hidden] whose size is fixed by the model. Mark dimension 0 of each tensor
    with tensor.dim() ≥ 2 with torch._dynamo.maybe_mark_dynamic(tensor, 0) (the "maybe" lets dynamo still
    specialise the size where the code needs a constant, such as 0 or 1, instead of raising), leave 1-D and
    0-D tensors and non-tensors alone, and return the same tuple.

    Without the marks, the first call compiles for its exact size and the second, at another size, compiles
    again (dynamo then guesses the size is dynamic). With them, calls at sizes 2, 3 and 5 share one compiled
    version, in which x's dimension 0 is a SymInt and the weight's size is a plain int: the tests compile a
    function through your marks and count the compiled versions and their symbolic sizes.

    Example: args (x [5, 64], weight [64], 1e-6) → x's dimension 0 marked; weight and eps untouched.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 08.2: mark the token dimension — dimension 0 of every tensor with two or more dimensions
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.dim() >= 2:
            torch._dynamo.maybe_mark_dynamic(arg, 0)
    return args
    # END EXERCISE


@cache
def compiled(fn):
    """fn compiled once: the returned function marks its arguments' token dimension and calls the compiled fn."""
    graph = torch.compile(fn)

    def run(*args):
        return graph(*mark_token_dims(args))

    return run


def hot(fn):
    """fn compiled when the current step runs with compiled layers, else fn itself (also inside a model that is
    already being compiled whole, whose graph takes fn in)."""
    return compiled(fn) if _ENABLED and not torch.compiler.is_compiling() else fn


def layers_compiled() -> bool:
    """Whether the hot functions run compiled now: inside compiled_layers(True), or traced into a compiled step.
    A layer with a native kernel of its backend's (the CPU's C++ ones) runs the function instead then, which the
    compiler fuses."""
    return _ENABLED or torch.compiler.is_compiling()


@contextmanager
def compiled_layers(enabled: bool):
    """Run the hot functions compiled (or not) inside the `with`; the previous setting comes back after."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, enabled
    try:
        yield
    finally:
        _ENABLED = previous
