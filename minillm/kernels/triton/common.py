"""What every kernel launcher shares: the interpreter switch, the device check, and readable errors.

Triton reads TRITON_INTERPRET when a kernel is *defined* (at `@triton.jit`), so it must be set before
minillm.kernels.triton is first imported. Set to 1, every launch runs the kernel's Python source on the CPU, one
program after another, with numpy standing in for the GPU: slow, but the same code, and exact enough to
compare with torch at 1e-5. triton.language's own helpers (tl.sum, tl.max, tl.cdiv, tl.zeros ...) are
kernels too, defined when triton is first imported, often earlier (torch.compile imports it): see
`interpret_triton_language`.
"""

from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.runtime.errors import InterpreterError

INTERPRET = bool(triton.knobs.runtime.interpret)  # fixed at import, as the kernels below are


def interpret_triton_language() -> None:
    """Make triton.language's helper kernels interpretable, as if TRITON_INTERPRET=1 had been set before
    triton was first imported: each compiled-mode helper (tl.sum and the rest of triton.language.standard)
    is swapped, wherever triton.language binds it, for an interpreted wrapper of the same Python function.
    Called once, at import, under the interpreter; a no-op when triton was imported with it already set."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: dict[int, InterpretedFunction] = {}
    for module in (tl, tl.core, tl.math, tl.standard, tl.random):
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, name, swapped.setdefault(id(value), InterpretedFunction(value.fn)))


if INTERPRET:
    interpret_triton_language()


def jit(fn):
    """triton.jit that keeps the kernel's docstring (the interpreter's wrapper drops it; the course shows it)."""
    kernel = triton.jit(fn)
    kernel.__doc__, kernel.__module__, kernel.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__
    return kernel


def check_device(*tensors: torch.Tensor) -> None:
    """Raise a clear error where a kernel cannot run: CPU tensors without the interpreter."""
    if not INTERPRET and any(t.is_cpu for t in tensors):
        raise RuntimeError(
            "minillm's Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 in the environment "
            "before minillm.kernels.triton is first imported, to run them on the CPU in Triton's "
            "interpreter (slow; for tests and the course). attention_backend='torch' runs anywhere."
        )


@contextmanager
def kernel_errors():
    """Under the interpreter, raise the kernel's own error (with its line) rather than Triton's wrapper of it."""
    try:
        yield
    except InterpreterError as e:
        cause = e
        while isinstance(cause, InterpreterError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is e:
            raise
        raise cause.with_traceback(cause.__traceback__) from None
