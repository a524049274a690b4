"""The attention backends: the CPU backend's torch path (no kernels) decodes in chunks of rows, which equals one
call over the whole batch; packed prefill
equals chapter 03's causal attention, sequence by sequence, and over a prefix never holds the scores."""

import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from minillm.layers.attention import causal_attention
from minillm.layers.attention.backends import CPUAttentionBackend
from minillm.layers.attention.paged_attention import paged_decode_attention, prefill_attention
from minillm.utils.context import Context


def test_decode_in_chunks_of_rows_equals_one_call():
    torch.manual_seed(0)
    block_size, heads, kv_heads, head_dim = 4, 8, 2, 16
    lens = torch.randint(1, 40, (37,))  # more than two chunks, the last one partial
    widths = (lens + block_size - 1) // block_size
    perm, tables, used = torch.randperm(400), [], 0
    for w in widths.tolist():
        tables.append(perm[used : used + w].tolist() + [-1] * (int(widths.max()) - w))
        used += w
    k_cache, v_cache = (
        torch.randn(400, block_size, kv_heads, head_dim),
        torch.randn(400, block_size, kv_heads, head_dim),
    )
    q = torch.randn(len(lens), heads, head_dim)
    ctx = Context(block_tables=torch.tensor(tables), context_lens=lens, context_lens_cpu=lens.tolist())
    backend = CPUAttentionBackend()
    backend.built = False  # as where the C++ kernels cannot be built: the chunked torch path
    assert backend.decode_rows < len(lens)
    chunked = backend.decode(q, k_cache, v_cache, ctx, 0.25)
    torch.testing.assert_close(chunked, paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, lens, 0.25))


def test_packed_prefill_equals_causal_attention_per_sequence():
    torch.manual_seed(0)
    cu = [0, 5, 6, 18]  # sequences of 5, 1 and 12 tokens
    q, k, v = torch.randn(18, 8, 16), torch.randn(18, 2, 16), torch.randn(18, 2, 16)
    out = prefill_attention(q, k, v, cu, cu, 0.25)
    for s, e in zip(cu, cu[1:]):
        torch.testing.assert_close(out[s:e], causal_attention(q[s:e], k[s:e], v[s:e], 0.25))


def prefix_batch(lens_q=(3, 40, 1), lens_k=(10, 64, 33), heads=8, kv_heads=2, head_dim=16):
    """Packed queries that are the last positions of longer sequences (a cached prefix or earlier chunks)."""
    torch.manual_seed(0)
    cu_q, cu_k = [0, *itertools.accumulate(lens_q)], [0, *itertools.accumulate(lens_k)]
    full = [
        (torch.randn(n, heads, head_dim), torch.randn(n, kv_heads, head_dim), torch.randn(n, kv_heads, head_dim))
        for n in lens_k
    ]
    q = torch.cat([fq[-nq:] for (fq, _, _), nq in zip(full, lens_q)])
    k, v = torch.cat([fk for _, fk, _ in full]), torch.cat([fv for _, _, fv in full])
    return full, q, k, v, cu_q, cu_k


def test_prefill_over_a_prefix_equals_causal_attention_over_the_whole_sequence():
    full, q, k, v, cu_q, cu_k = prefix_batch()
    out = prefill_attention(q, k, v, cu_q, cu_k, 0.25)
    for (fq, fk, fv), s, e in zip(full, cu_q, cu_q[1:]):
        torch.testing.assert_close(out[s:e], causal_attention(fq, fk, fv, 0.25)[-(e - s) :])


def largest_allocation(fn) -> int:
    """The most bytes any op allocated while fn ran (torch's profiler with memory profiling: a memory hook)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events())


class SDPAMasks(TorchFunctionMode):
    """Records the attn_mask of every scaled_dot_product_attention call."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.masks.append((kwargs or {}).get("attn_mask"))
        return func(*args, **(kwargs or {}))


def test_prefill_over_a_prefix_never_holds_the_scores():
    """The GPU fault this guards: a boolean mask with shared KV heads sends CUDA's SDPA to its math kernel, which
    materialises heads x queries x keys scores. Every call gets no tensor mask (a causal bias or none), and no op
    of the prefill allocates half of one sequence's scores (a CPU's kernel reads a [queries, keys] mask: an 8-head
    part of them); the hook does see the scores where a kernel makes them."""
    _, q, k, v, cu_q, cu_k = prefix_batch(lens_k=(10, 1024, 33))
    scores = 8 * 40 * 1024 * 4  # heads x queries x keys float32 of the second sequence
    run = lambda: prefill_attention(q, k, v, cu_q, cu_k, 0.25)
    with SDPAMasks() as calls:
        run()
    assert len(calls.masks) == 3
    assert not [m for m in calls.masks if isinstance(m, torch.Tensor) and not isinstance(m, CausalBias)]
    assert largest_allocation(run) < scores / 2
    with sdpa_kernel(SDPBackend.MATH):
        assert largest_allocation(run) >= scores
