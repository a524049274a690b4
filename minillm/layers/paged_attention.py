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


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Each sequence's blocks in table order, as positions: [num_seqs, max_blocks * block_size, kv_heads, head_dim].

    `index_select(0, ids)` is `cache[ids]` along the first dimension, done as one copy of whole blocks (several
    times faster than fancy indexing on a CPU when blocks are small). The -1 entries that pad short tables read block 0: a mask must hide those
    positions, as it hides the unwritten slots at the end of each sequence's last block.
    """
    num_seqs, width = block_tables.shape
    blocks = cache.flatten(1).index_select(0, block_tables.clamp(min=0).flatten())
    return blocks.view(num_seqs, width * cache.shape[1], *cache.shape[2:])


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_k: list[int]) -> torch.Tensor:
    """Every sequence's whole context from the cache, packed end to end like cu_seqlens_k describes."""
    return torch.cat([gather_kv(cache, block_tables[i:i + 1])[0, :e - s]
                      for i, (s, e) in enumerate(zip(cu_seqlens_k[:-1], cu_seqlens_k[1:]))])


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
        nq, nk = qe - qs, ke - ks  # with no earlier keys, the plain causal mask (is_causal) needs no tensor
        mask = None if nq == nk else torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        out[qs:qe] = F.scaled_dot_product_attention(  # [1, heads, tokens, head_dim]: 4-D takes the fused kernel
            q[None, qs:qe].transpose(1, 2), k[None, ks:ke].transpose(1, 2), v[None, ks:ke].transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True,
        )[0].transpose(0, 1)
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One new query per sequence, q [num_seqs, heads, head_dim], attending to its context in the paged cache."""
    # BEGIN EXERCISE 05.2: paged decode attention — gather each sequence's keys/values by its block table, mask past its length
    k, v = gather_kv(k_cache, block_tables), gather_kv(v_cache, block_tables)  # [seqs, max_len, kv_heads, head_dim]
    num_seqs, max_len, kv_heads, head_dim = k.shape
    valid = torch.arange(max_len, device=q.device) < context_lens[:, None]  # [seqs, max_len]
    # GQA: the query heads sharing a KV head become that head's few "query positions", so K/V are never repeated
    q = q.view(num_seqs, kv_heads, -1, head_dim)
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :],
                                         scale=scale)
    return out.reshape(num_seqs, -1, head_dim)
    # END EXERCISE
