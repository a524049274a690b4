"""Chapter 03 exercise 03.4: the SwiGLU activation, silu_and_mul.

The MLP's first matmul computes the gate and up projections together: its output row is [gate | up]. Your
function splits that row in half and returns silu(gate) * up, where silu(g) = g * sigmoid(g). It is checked
against that formula written out by hand, then plugged into a tiny random-weight Qwen3 loaded from a
checkpoint directory, which must give the same logits and greedy tokens as with minillm's own function.

    python -m minillm.course grade 03
"""

import pytest
import torch

from minillm.course import use_impl
from minillm.models import build_model
from minillm.naive import generate_naive

close = torch.testing.assert_close


def swiglu_by_hand(x: torch.Tensor) -> torch.Tensor:
    """The formula, with no torch activation function: g * sigmoid(g) * u, sigmoid(g) = 1 / (1 + e^-g)."""
    half = x.shape[-1] // 2
    gate, up = x[..., :half], x[..., half:]
    return gate / (1 + torch.exp(-gate)) * up


@pytest.mark.exercise("03.4")
@pytest.mark.parametrize(
    "shape", [(1, 2), (3, 14), (5, 768), (2, 3, 10)], ids=["one pair", "odd half width", "tokens-intermediate", "3-d"]
)
def test_silu_and_mul_matches_the_formula(impl, shape):
    x = torch.randn(shape) * 4
    out = impl.silu_and_mul(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2), f"expected the last dimension halved, got {tuple(out.shape)}"
    close(out, swiglu_by_hand(x))


@pytest.mark.exercise("03.4")
def test_the_gate_is_the_first_half(impl):
    """gate_up_proj stacks gate_proj's rows first (shard 0), then up_proj's (shard 1)."""
    gate, up = torch.tensor([[-2.0, 0.0, 3.0]]), torch.tensor([[5.0, 7.0, -1.0]])
    out = impl.silu_and_mul(torch.cat([gate, up], dim=-1))
    close(out, torch.tensor([[-2 / (1 + torch.e**2) * 5, 0.0, 3 / (1 + torch.e**-3) * -1]]))


@pytest.mark.exercise("03.4")
def test_silu_and_mul_keeps_the_dtype(impl):
    x = torch.randn(4, 8).bfloat16()
    out = impl.silu_and_mul(x)
    assert out.dtype == torch.bfloat16
    close(out, swiglu_by_hand(x.float()).bfloat16())


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait for each other on several threads (slow on a busy CPU)
    yield build_model(tiny_checkpoint)
    torch.set_num_threads(threads)


@pytest.mark.exercise("03.4")
def test_tiny_qwen3_generates_the_same_with_your_silu_and_mul(impl, tiny_model):
    prompt, positions = [72, 101, 108, 108, 111, 32], torch.arange(6)  # "Hello " in the checkpoint's byte tokens
    with torch.inference_mode():
        logits = tiny_model.compute_logits(tiny_model(torch.tensor(prompt), positions))
    tokens = list(generate_naive(tiny_model, prompt, 8))
    with use_impl(impl, "03.4"), torch.inference_mode():
        close(tiny_model.compute_logits(tiny_model(torch.tensor(prompt), positions)), logits)
        assert list(generate_naive(tiny_model, prompt, 8)) == tokens
