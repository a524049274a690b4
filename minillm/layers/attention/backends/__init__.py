"""Attention backends: how a layer stores its keys and values in the paged cache and attends over them. Each
backend is one file; the platform (minillm.platforms) picks one per engine and hands it to every Attention layer."""

from torch import device as Device  # by name: the submodule .torch below takes the name `torch` in this package

from minillm.layers.attention.backends.cpu import CPUAttentionBackend
from minillm.layers.attention.backends.torch import TorchAttentionBackend
from minillm.layers.attention.backends.triton import TritonAttentionBackend

ATTENTION_BACKENDS = {"torch": TorchAttentionBackend, "cpu": CPUAttentionBackend, "triton": TritonAttentionBackend}


def triton_compiles() -> bool:
    """Whether Triton kernels would be compiled here: Triton imports (CUDA builds of torch ship it) and
    TRITON_INTERPRET is off (the interpreter copies every tensor to the host on each launch)."""
    try:
        import triton
    except ImportError:
        return False
    return not triton.knobs.runtime.interpret


def select_attention_backend(
    name: str = "auto", device: str | Device = "cpu", native: bool = True
) -> TorchAttentionBackend:
    """The one place an attention backend is chosen: "auto" takes the fastest one for `device` (the Triton
    kernels on CUDA when they compile, the C++ kernels on a CPU; the torch reference otherwise, or when `native`
    kernels are off), or name one of ATTENTION_BACKENDS."""
    if name == "auto":
        cuda = Device(device).type == "cuda"
        fast = ("triton" if triton_compiles() else "torch") if cuda else "cpu"
        name = fast if native else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention_backend {name!r}: choose 'auto' or one of {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()
