"""The torch attention backend: decode in chunks of rows equals one call over the whole batch; packed prefill
equals chapter 03's causal attention, sequence by sequence."""
import torch

from minillm.layers.attention import TorchAttentionBackend, causal_attention
from minillm.layers.paged_attention import paged_decode_attention, prefill_attention
from minillm.utils.context import Context


def test_decode_in_chunks_of_rows_equals_one_call():
    torch.manual_seed(0)
    block_size, heads, kv_heads, head_dim = 4, 8, 2, 16
    lens = torch.randint(1, 40, (37,))  # more than two chunks, the last one partial
    widths = (lens + block_size - 1) // block_size
    perm, tables, used = torch.randperm(400), [], 0
    for w in widths.tolist():
        tables.append(perm[used:used + w].tolist() + [-1] * (int(widths.max()) - w))
        used += w
    k_cache, v_cache = torch.randn(400, block_size, kv_heads, head_dim), torch.randn(400, block_size, kv_heads, head_dim)
    q = torch.randn(len(lens), heads, head_dim)
    ctx = Context(block_tables=torch.tensor(tables), context_lens=lens, context_lens_cpu=lens.tolist())
    backend = TorchAttentionBackend()
    assert backend.decode_rows < len(lens)
    chunked = backend.decode(q, k_cache, v_cache, ctx, 0.25)
    torch.testing.assert_close(chunked, paged_decode_attention(q, k_cache, v_cache, ctx.block_tables, lens, 0.25))


def test_packed_prefill_equals_causal_attention_per_sequence():
    torch.manual_seed(0)
    lens = [5, 1, 12]
    cu = [0, 5, 6, 18]
    q, k, v = torch.randn(18, 8, 16), torch.randn(18, 2, 16), torch.randn(18, 2, 16)
    out = prefill_attention(q, k, v, cu, cu, 0.25)
    for s, e in zip(cu, cu[1:]):
        torch.testing.assert_close(out[s:e], causal_attention(q[s:e], k[s:e], v[s:e], 0.25))
