"""Chapter 08 exercises: add+RMSNorm as one fusible function (08.1), marking the token dimension so that one
compiled version serves every batch size (08.2).

08.1 is compared with torch's own RMSNorm, compiled to count its kernels, and plugged into the model; 08.2 is
checked by compiling a function through your marks and looking at what dynamo traced.

    python -m minillm.course grade 08
"""

import re

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from minillm.course import use_impl
from minillm.models import build_model
from minillm.naive import generate_naive


@pytest.mark.exercise("08.1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_returns_the_norm_and_the_new_residual(impl, dtype):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(5, 64, dtype=dtype), torch.randn(5, 64, dtype=dtype), torch.randn(64)
    x0, r0 = x.clone(), residual.clone()
    normed, new_residual = impl.add_rms_norm(x, residual, weight.to(dtype), 1e-6)
    assert torch.equal(new_residual, x0 + r0)
    assert normed.dtype == dtype and new_residual.dtype == dtype
    expected = F.rms_norm((x0 + r0).float(), (64,), weight, 1e-6).to(dtype)
    torch.testing.assert_close(normed, expected, atol=1e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)
    assert torch.equal(x, x0) and torch.equal(residual, r0), "the inputs must not be modified"


@pytest.mark.exercise("08.1")
def test_add_rms_norm_compiles_into_one_kernel(impl):
    x, residual, weight = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    impl.add_rms_norm(x, residual, weight, 1e-6)  # eager first: an unfinished stub fails here, not in inductor
    torch._dynamo.reset()
    (normed, new_residual), code = run_and_get_code(torch.compile(impl.add_rms_norm), x, residual, weight, 1e-6)
    kernels = set(re.findall(r"\b(cpp_fused_\w+|triton_\w+_fused_\w+)\s*=", "\n".join(code)))
    assert len(kernels) == 1, f"inductor generated {len(kernels)} kernels: {sorted(kernels)}"
    torch.testing.assert_close(new_residual, x + residual)


@pytest.mark.exercise("08.1")
def test_your_add_rms_norm_runs_the_model(impl, tiny_checkpoint):
    model = build_model(tiny_checkpoint)
    expected = list(generate_naive(model, [5, 80, 13, 200, 7], 12))
    with use_impl(impl, "08.1"):
        assert list(generate_naive(model, [5, 80, 13, 200, 7], 12)) == expected


def traced_shapes(fn, calls, mark):
    """Compile fn with a backend that records, per compiled version, the type of each tensor input's sizes
    (sorted: dynamo may order a graph's inputs differently from the function's arguments)."""
    versions = []

    def backend(gm, example_inputs):
        versions.append(
            sorted(
                tuple(type(s).__name__ for s in node.meta["example_value"].shape)
                for node in gm.graph.nodes
                if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.Tensor)
            )
        )
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    for args in calls:
        compiled(*mark(args))
    return versions


@pytest.mark.exercise("08.2")
def test_marked_token_dims_share_one_compiled_version(impl):
    def norm(x, weight, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    weight = torch.ones(16)
    calls = [(torch.randn(n, 16), weight, 1e-6) for n in (2, 3, 5)]
    unmarked = [[("int",), ("int", "int")], [("SymInt", "int"), ("int",)]]  # size 2, then a guess: dynamic
    assert traced_shapes(norm, calls, lambda args: args) == unmarked
    assert traced_shapes(norm, calls, impl.mark_token_dims) == [[("SymInt", "int"), ("int",)]]


@pytest.mark.exercise("08.2")
def test_mark_token_dims_marks_every_tensor_of_two_or_more_dims(impl):
    def rotate(x, cos, sin, scale):
        return (x * cos[:, None] + x.flip(-1) * sin[:, None]) * scale

    calls = [(torch.randn(n, 2, 8), torch.randn(n, 8), torch.randn(n, 8), 0.5) for n in (3, 4)]
    assert traced_shapes(rotate, calls, impl.mark_token_dims) == [
        [("SymInt", "int"), ("SymInt", "int"), ("SymInt", "int", "int")]
    ]
    args = calls[0]
    assert impl.mark_token_dims(args) is args, "return the same tuple"
