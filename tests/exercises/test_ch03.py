"""Chapter 03 exercises: RMSNorm (03.1), rotary embedding (03.2), causal grouped-query attention (03.3).

Each function is first checked on random inputs against an independent formula: torch's own rms_norm and
scaled_dot_product_attention, and RoPE written as a multiplication of complex numbers. Then it is plugged
into a real model: a tiny random-weight Qwen3 must give the same logits and the same greedy tokens with
your function as with minillm's.

    python -m minillm.course grade 03
"""

import pytest
import torch
import torch.nn.functional as F

from minillm.config import ModelConfig
from minillm.course import use_impl
from minillm.layers.rotary import rope_inv_freq
from minillm.models.qwen3 import Qwen3ForCausalLM
from minillm.naive import generate_naive

close = torch.testing.assert_close


# 03.1 RMSNorm


@pytest.mark.exercise("03.1")
@pytest.mark.parametrize("shape", [(1, 8), (5, 64), (7, 4, 16)], ids=["one token", "tokens-hidden", "tokens-heads-dim"])
def test_rms_norm_matches_torch(impl, shape):
    x, weight = torch.randn(shape) * 3, torch.randn(shape[-1])
    close(impl.rms_norm(x, weight, 1e-6), F.rms_norm(x, shape[-1:], weight, 1e-6))


@pytest.mark.exercise("03.1")
def test_rms_norm_adds_eps_inside_the_root(impl):
    x, weight = torch.randn(3, 16) * 0.1, torch.ones(16)
    close(impl.rms_norm(x, weight, 0.5), F.rms_norm(x, (16,), weight, 0.5))
    assert impl.rms_norm(torch.zeros(2, 16), weight, 1e-6).eq(0).all(), "a zero vector must stay zero, not NaN"


@pytest.mark.exercise("03.1")
def test_rms_norm_computes_in_fp32_and_returns_the_input_dtype(impl):
    x, weight = (torch.randn(4, 32) * 300).half(), torch.randn(32).half()  # in fp16, 300² overflows to inf
    out = impl.rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float16
    close(out, F.rms_norm(x.float(), (32,), weight.float(), 1e-6).half())


# 03.2 rotary embedding


def rotate_as_complex(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE as complex numbers: the pair (x1[i], x2[i]) is x1[i] + j·x2[i], multiplied by e^(j·angle[i])."""
    x1, x2 = x.chunk(2, dim=-1)
    z = torch.complex(x1, x2) * torch.polar(torch.ones_like(angles), angles)[:, None, :]
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.exercise("03.2")
@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 1, 2), (6, 4, 16), (9, 2, 64)])
def test_apply_rotary_matches_complex_rotation(impl, tokens, heads, head_dim):
    x, angles = torch.randn(tokens, heads, head_dim), torch.rand(tokens, head_dim // 2) * 10
    close(impl.apply_rotary(x, angles.cos(), angles.sin()), rotate_as_complex(x, angles))


@pytest.mark.exercise("03.2")
def test_apply_rotary_at_angle_zero_is_the_identity_and_keeps_dtype(impl):
    x = torch.randn(3, 2, 8).bfloat16()
    out = impl.apply_rotary(x, torch.ones(3, 4), torch.zeros(3, 4))
    assert out.dtype == torch.bfloat16
    close(out, x)


@pytest.mark.exercise("03.2")
def test_rotated_scores_depend_only_on_the_distance(impl):
    """The point of RoPE: q at position 7 meets k at 3 exactly as q at 104 meets k at 100."""
    q, k, inv_freq = torch.randn(1, 1, 32), torch.randn(1, 1, 32), rope_inv_freq(32, 10000.0)

    def at(x, position):
        angles = (position * inv_freq)[None]
        return impl.apply_rotary(x, angles.cos(), angles.sin())

    # float32 angles at position 104 carry rounding the ones at 7 do not: up to ~3e-5 on these sums of 32 products
    close((at(q, 7) * at(k, 3)).sum(), (at(q, 104) * at(k, 100)).sum(), rtol=1e-5, atol=1e-4)


# 03.3 causal grouped-query attention


@pytest.mark.exercise("03.3")
@pytest.mark.parametrize(
    "tokens, heads, kv_heads", [(1, 4, 2), (7, 4, 4), (7, 8, 2), (5, 4, 1)], ids=["one token", "MHA", "GQA", "MQA"]
)
def test_causal_attention_matches_sdpa(impl, tokens, heads, kv_heads):
    q, (k, v), scale = torch.randn(tokens, heads, 16), torch.randn(2, tokens, kv_heads, 16), 0.3
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True
    ).transpose(0, 1)
    close(impl.causal_attention(q, k, v, scale), expected)


@pytest.mark.exercise("03.3")
def test_causal_attention_does_not_look_ahead(impl):
    q, k, v = torch.randn(6, 4, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    out = impl.causal_attention(q, k, v, 0.35)
    k[4:], v[4:] = k[4:] + 5, v[4:] - 5  # change only the last two tokens
    close(impl.causal_attention(q, k, v, 0.35)[:4], out[:4])


# Your function inside a real model


TINY = ModelConfig(
    architecture="Qwen3ForCausalLM",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    qk_norm=True,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def tiny_qwen3():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait for each other on several threads (100× slower on a busy CPU)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(TINY).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    yield model
    torch.set_num_threads(threads)


@pytest.mark.parametrize("exercise", [pytest.param(e, marks=pytest.mark.exercise(e)) for e in ("03.1", "03.2", "03.3")])
def test_tiny_qwen3_generates_the_same_with_your_function(impl, tiny_qwen3, exercise):
    prompt, positions = [5, 17, 42, 8, 63], torch.arange(5)
    with torch.inference_mode():
        logits = tiny_qwen3.compute_logits(tiny_qwen3(torch.tensor(prompt), positions))
    tokens = list(generate_naive(tiny_qwen3, prompt, 8))
    with use_impl(impl, exercise), torch.inference_mode():
        close(tiny_qwen3.compute_logits(tiny_qwen3(torch.tensor(prompt), positions)), logits)
        assert list(generate_naive(tiny_qwen3, prompt, 8)) == tokens
