"""Chapter 09 exercises, graded in Triton's interpreter on the CPU: the store kernel (09.1), the online-softmax
update of the paged decode kernel (09.2) and the fused add+RMSNorm kernel (09.3).

Your kernel is plugged into minillm.kernels.triton and launched by its launcher, then compared with the torch
reference of chapters 04, 05 and 08. Cases are small: the interpreter runs every program in Python.

    python -m minillm.course grade 09
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel is defined: before minillm.kernels.triton

import pytest  # noqa: E402
import torch  # noqa: E402

from minillm.kernels import triton as kernels  # noqa: E402
from minillm.course import use_impl  # noqa: E402
from minillm.layers.attention import paged_attention as ref  # noqa: E402
from minillm.layers.rms_norm import add_rms_norm  # noqa: E402

pytestmark = pytest.mark.skipif(not kernels.INTERPRET, reason="graded in Triton's interpreter: unset TRITON_INTERPRET")
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.exercise("09.1")
@pytest.mark.parametrize("kv_heads,head_dim", [(2, 8), (3, 4)], ids=["D=16", "D=12"])
def test_store_kernel_writes_each_token_to_its_slot_and_skips_minus_one(impl, kv_heads, head_dim):
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(4, 4, kv_heads, head_dim), torch.randn(4, 4, kv_heads, head_dim)
    qkv = torch.randn(5, 3 * kv_heads * head_dim)  # k and v as views into qkv: rows further apart than D
    k = qkv[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(5, kv_heads, head_dim)
    v = qkv[:, 2 * kv_heads * head_dim :].view(5, kv_heads, head_dim)
    slots = torch.tensor([0, 7, 3, -1, 15])
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    ref.store_kvcache(k, v, expected_k, expected_v, slots)
    with use_impl(impl, "09.1"):
        kernels.store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k), "the key cache differs from the torch store_kvcache"
    assert torch.equal(v_cache, expected_v), "the value cache differs from the torch store_kvcache"


@pytest.mark.exercise("09.2")
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1)], ids=["MHA", "GQA"])
def test_paged_decode_with_your_update_equals_torch(impl, heads, kv_heads):
    """Contexts of 1 key, one full block, a block and one key, and two blocks and a partial third."""
    torch.manual_seed(0)
    block_size, lens = 4, [1, 4, 5, 11]
    k_cache, v_cache = torch.randn(9, block_size, kv_heads, 8), torch.randn(9, block_size, kv_heads, 8)
    tables = torch.tensor([[6, -1, -1], [2, -1, -1], [0, 8, -1], [5, 1, 3]])
    q, context_lens = torch.randn(4, heads, 8), torch.tensor(lens)
    expected = ref.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, 0.3)
    with use_impl(impl, "09.2"):
        out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, context_lens, 0.3)
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.exercise("09.3")
@pytest.mark.parametrize("hidden,eps", [(32, 1e-6), (24, 0.5)], ids=["N=32", "N=24-eps-0.5"])
def test_add_rms_norm_kernel_equals_torch(impl, hidden, eps):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(3, hidden), torch.randn(3, hidden), torch.randn(hidden)
    x0, r0 = x.clone(), residual.clone()
    expected_normed, expected_residual = add_rms_norm(x, residual, weight, eps)
    with use_impl(impl, "09.3"):
        normed, new_residual = kernels.add_rms_norm(x, residual, weight, eps)
    assert torch.equal(new_residual, expected_residual), "the new residual is x + residual"
    torch.testing.assert_close(normed, expected_normed, **TOL)
    assert torch.equal(x, x0) and torch.equal(residual, r0), "the inputs must not be modified"
