"""Attention over a paged KV cache, in plain torch (the CPU path; chapter 09 adds Triton kernels).

The cache of one layer is [num_blocks, block_size, num_kv_heads, head_dim]. Token t of a sequence lives
in slot block_table[t // block_size] * block_size + t % block_size: a sequence's keys need not be
contiguous, only its block table is.
"""
import torch
import torch.nn.functional as F


def slot_mapping_for(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of a sequence's tokens start..end-1, given the blocks it owns."""
    # BEGIN EXERCISE 05.1: slot mapping — the flat cache slot of each token position
    return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]
    # END EXERCISE


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write each token's key and value [tokens, kv_heads, head_dim] into its slot; slot -1 means skip.

    Slot s is row s of the cache seen as [num_blocks * block_size, kv_heads, head_dim].
    """
    # BEGIN EXERCISE 04.2: append to the cache — copy each token's key and value into its slot, skipping slot -1
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
    # END EXERCISE


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of each sequence: [num_seqs, length, kv_heads, head_dim]."""
    blocks = cache[block_tables.clamp(min=0)]  # [num_seqs, max_blocks, block_size, kv_heads, head_dim]
    return blocks.flatten(1, 2)[:, :length]


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_k: list[int]) -> torch.Tensor:
    """Every sequence's whole context from the cache, packed end to end like cu_seqlens_k describes."""
    lens = [e - s for s, e in zip(cu_seqlens_k[:-1], cu_seqlens_k[1:])]
    return torch.cat([gather_kv(cache, block_tables[i:i + 1], n)[0] for i, n in enumerate(lens)])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: list[int],
                      cu_seqlens_k: list[int], scale: float) -> torch.Tensor:
    """Causal attention for several sequences packed end to end (varlen).

    Sequence i has queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] and keys k[cu_seqlens_k[i]:...]. When it has
    more keys than queries (a cached prefix, or earlier chunks), its queries are the last positions, so
    query j may see keys up to j + (num_keys - num_queries): the causal mask is aligned bottom-right.
    """
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]
        mask = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=q.device).tril(ke - ks - (qe - qs))
        out[qs:qe] = F.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1),
            attn_mask=mask, scale=scale, enable_gqa=True,
        ).transpose(0, 1)
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One new query per sequence, q [num_seqs, heads, head_dim], attending to its context in the paged cache."""
    # BEGIN EXERCISE 05.2: paged decode attention — gather each sequence's keys/values by its block table, mask past its length
    max_len = int(context_lens.max())
    k = gather_kv(k_cache, block_tables, max_len).transpose(1, 2)  # [seqs, kv_heads, max_len, head_dim]
    v = gather_kv(v_cache, block_tables, max_len).transpose(1, 2)
    valid = torch.arange(max_len, device=q.device) < context_lens[:, None]  # [seqs, max_len]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=valid[:, None, None, :], scale=scale,
                                         enable_gqa=True)
    return out.squeeze(2)
    # END EXERCISE
