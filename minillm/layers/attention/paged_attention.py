"""Attention over a paged KV cache, in plain torch (the CPU path; chapter 09 adds Triton kernels).

The cache of one layer is [num_blocks, block_size, num_kv_heads, head_dim]. Token t of a sequence lives
in slot block_table[t // block_size] * block_size + t % block_size: a sequence's keys need not be
contiguous, only its block table is. With kv_cache_dtype="int8" (chapter 14) the cache holds int8 numbers and beside
it a float32 scale per token and KV head, [num_blocks, block_size, num_kv_heads] (quantize_kv).
"""

import torch
import torch.nn.functional as F
from torch.backends.cuda import SDPAParams, can_use_flash_attention
from torch.nn.attention.bias import causal_lower_right


def slot_mapping_for(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of a sequence's tokens start..end-1, given the blocks it owns.

    Position pos lives in the sequence's logical block pos // block_size, at offset pos % block_size inside
    it, and `block_table[i]` is the physical block that holds logical block i. Its slot, the row of the
    cache seen as [num_blocks * block_size, kv_heads, head_dim], is that physical block's number times
    block_size, plus the offset.

    block_table: list[int], the sequence's physical block ids in order (it covers position end - 1).
    start, end: positions, end exclusive; start may fall inside a block (a decode step asks for the one
    slot of its newest token: start = len - 1, end = len).
    block_size: tokens per block.
    Returns a list of end - start plain ints, the slot of each position start, ..., end - 1 in order.

    Example, block_size 4 and block_table [7, 2, 5]: positions 0..9 are in slots
    [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]; positions 6..8 alone give [10, 11, 20].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 05.1: slot mapping — the flat cache slot of each token position
    return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]
    # END EXERCISE


def store_kvcache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write each token's key and value [tokens, kv_heads, head_dim] into its slot; slot -1 means skip.

    k, v: [num_tokens, kv_heads, head_dim], the keys and values this step computed.
    k_cache, v_cache: one layer's cache, [num_blocks, block_size, kv_heads, head_dim], updated in place
    (nothing is returned): write into these tensors themselves, not into a copy.
    slot_mapping: integer tensor [num_tokens]; slot_mapping[t] is token t's slot, or -1.
    Slot s is row s of the cache seen as [num_blocks * block_size, kv_heads, head_dim]: block
    s // block_size, offset s % block_size. Slots come in any order. A token whose slot is -1 is skipped
    (its key is already cached, say in a shared prefix block, or the row is padding): nothing of the cache
    changes for it, and -1 must not be used as an index, since it would name the last slot. Every slot not
    listed keeps its old contents.

    Example, block_size 4, slot_mapping [0, 7, 3, -1, 12]: token 0 goes to block 0 offset 0, token 1 to
    block 1 offset 3, token 2 to block 0 offset 3, token 3 nowhere, token 4 to block 3 offset 0.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 04.2: append to the cache — copy each token's key and value into its slot, skipping slot -1
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
    # END EXERCISE


def store_decode_kvcache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """store_kvcache for a decode step, without the mask: every row's slot is its own, or PAD_SLOT_ID (-1) for
    a padded row, which indexes the last slot of the cache, a spare one the model runner never hands out. So
    the step's work does not depend on how many rows are real: a mask would pick a data-dependent number of
    rows, read back to the host, which a CUDA graph cannot record (chapter 07)."""
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys or values [..., head_dim] as int8 numbers and one float32 scale per vector [...] (kv_cache_dtype="int8").

    Each vector (one token's key in one KV head) gets its own scale = max|x| / 127, so its largest number maps to
    ±127 and the rest keep their relative sizes: q = round(x / scale), clamped to ±127, and x ≈ q · scale
    (dequantize_kv), off by at most scale / 2 in each number. An all-zero vector gets scale 1.0 (not 0: q = 0 either
    way, and no division by zero). Rounding is to nearest, ties to even, as torch.round and the kernels do.

    Example: x = [0.5, -1.27, 0.0] gives scale 0.01 and q = [50, -127, 0].
    """
    x = x.float()
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127, 1.0)
    return (x / scale[..., None]).round().clamp(-127, 127).to(torch.int8), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 keys or values [..., head_dim] and their scales [...] back to numbers of `dtype`: q · scale."""
    return (q.float() * scale[..., None]).to(dtype)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Each sequence's blocks in table order, as positions: [num_seqs, max_blocks * block_size, kv_heads, head_dim].

    `index_select(0, ids)` is `cache[ids]` along the first dimension, done as one copy of whole blocks (fancy
    indexing copies number by number). The -1 entries that pad short tables read block 0: a mask must hide
    those positions, as it hides the unwritten slots at the end of each sequence's last block.
    """
    num_seqs, width = block_tables.shape
    blocks = cache.flatten(1).index_select(0, block_tables.clamp(min=0).flatten())
    return blocks.view(num_seqs, width * cache.shape[1], *cache.shape[2:])


def gather_dequantized(
    cache: torch.Tensor, scales: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The blocks that block_tables [num_seqs, width] name, copied out of an int8 cache and dequantized: a float
    cache of num_seqs * width blocks of its own, where row s's i-th block is block s * width + i (-1 padding reads
    block 0, as in gather_kv). Only the blocks in use are converted, never the whole cache."""
    ids = block_tables.clamp(min=0).flatten()
    return dequantize_kv(cache.index_select(0, ids), scales.index_select(0, ids), dtype)


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_k: list[int]) -> torch.Tensor:
    """Every sequence's whole context from the cache, packed end to end like cu_seqlens_k describes."""
    return torch.cat(
        [
            gather_kv(cache, block_tables[i : i + 1])[0, : e - s]
            for i, (s, e) in enumerate(zip(cu_seqlens_k[:-1], cu_seqlens_k[1:]))
        ]
    )


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: list[int], cu_seqlens_k: list[int], scale: float
) -> torch.Tensor:
    """Causal attention for several sequences packed end to end (varlen).

    Sequence i has queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] and keys k[cu_seqlens_k[i]:...]. When it has
    more keys than queries (a cached prefix, or earlier chunks), its queries are the last positions, so
    query j may see keys up to j + (num_keys - num_queries): the causal mask is aligned bottom-right.
    """
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]
        out[qs:qe] = causal_sdpa(  # [1, heads, tokens, head_dim]: 4-D takes the fused kernels
            q[None, qs:qe].transpose(1, 2),
            k[None, ks:ke].transpose(1, 2),
            v[None, ks:ke].transpose(1, 2),
            scale,
        )[0].transpose(0, 1)
    return out


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Fused causal attention of q [1, heads, nq, head_dim] over k, v [1, kv_heads, nk, head_dim], nq <= nk, the
    queries being the last nq positions, without ever holding the heads x nq x nk scores.

    With no earlier keys it is SDPA's plain causal mask. With some, the mask is aligned bottom-right, given as
    torch's `causal_lower_right` bias rather than a boolean tensor: with a tensor mask and shared KV heads CUDA
    falls back to its math kernel, which materialises every score (a 4k chunk over 32k keys at 32 heads: 17 GB).
    CUDA's flash kernel takes the bias and shared KV heads; where it cannot run (float32) the memory-efficient
    one takes the bias, but shares no heads, so the KV heads are repeated first (nk x heads x head_dim: far less
    than the scores). A CPU's fused kernel takes either.
    """
    nq, nk = q.shape[2], k.shape[2]
    if nq == nk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    gqa = q.shape[1] != k.shape[1]
    if gqa and q.is_cuda and not can_use_flash_attention(SDPAParams(q, k, v, None, 0.0, False, True)):
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        gqa = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(nq, nk), scale=scale, enable_gqa=gqa)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new query per sequence, q [num_seqs, heads, head_dim], attending to its context in the paged cache.

    q: [num_seqs, heads, head_dim], the query of each sequence's newest token.
    k_cache, v_cache: one layer's cache, [num_blocks, block_size, kv_heads, head_dim]. heads is a multiple
    of kv_heads: query head h reads KV head h // (heads // kv_heads) (grouped-query attention; MHA when
    they are equal).
    block_tables: integer tensor [num_seqs, max_blocks]; row i lists sequence i's physical blocks in
    order, padded at the end with -1.
    context_lens: integer tensor [num_seqs], the number of keys of sequence i (the newest token's key is
    already stored). Its key j is in block block_tables[i, j // block_size] at offset j % block_size.
    scale: the factor on the scores (head_dim ** -0.5 in the model).
    Returns [num_seqs, heads, head_dim]: for each sequence and head, softmax(scale * q . k_j) weighted
    sum of v_j over j = 0 .. context_lens[i] - 1, exactly what attention over that sequence's keys copied
    out contiguously gives. No causal mask is needed (the query is the last position), but positions at
    or past context_lens[i] get no weight: the unwritten end of the last block, and the -1 padding (which
    `gather_kv` reads as block 0). The cache is only read.

    Example, block_size 4, block_tables [[5, 1, 8]], context_lens [9]: the keys are block 5's four, block
    1's four and the first of block 8; the other three slots of block 8 are masked. The tests compare with
    ordinary attention for MHA (4 heads, 4 KV heads) and GQA (8 heads, 2 KV heads), lengths 1, 6 and 9.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 05.2: paged decode attention — gather each sequence's keys/values by its block table, mask past its length
    k, v = gather_kv(k_cache, block_tables), gather_kv(v_cache, block_tables)  # [seqs, max_len, kv_heads, head_dim]
    num_seqs, max_len, kv_heads, head_dim = k.shape
    valid = torch.arange(max_len, device=q.device) < context_lens[:, None]  # [seqs, max_len]
    # GQA: the query heads sharing a KV head become that head's few "query positions", so K/V are never repeated
    q = q.view(num_seqs, kv_heads, -1, head_dim)
    out = F.scaled_dot_product_attention(
        q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :], scale=scale
    )
    return out.reshape(num_seqs, -1, head_dim)
    # END EXERCISE
