"""Paged decode attention in Triton: one program per (sequence, KV head) walks the sequence's blocks.

The torch version (minillm.layers.attention.paged_attention.paged_decode_attention) first copies every sequence's keys
out of the cache into one padded tensor, then attends. This kernel reads each key once, straight from its
block, and never materialises the scores of the whole context: it keeps a running maximum, a running sum
of exponentials and a running weighted sum of values (the online softmax of FlashAttention), updated block
by block. The query heads that share a KV head (GQA) are handled together, so each key is loaded once for
all of them. This is vLLM's `paged_attention_v1` layout; flash-decoding goes further and splits one long
context over several programs, merging their partial results the same way the update below merges blocks.
"""

import torch
import triton
import triton.language as tl

from minillm.kernels.triton.common import check_device, jit, kernel_errors


@jit
def online_softmax_update(m_i, l_i, acc, scores, v):
    """Fold one block of keys into the running softmax of each query head; returns (m_i, l_i, acc) updated.

    m_i [GROUP]: each head's largest score so far (-inf before the first block). l_i [GROUP]: the sum of
    exp(score - m_i) over the keys so far. acc [GROUP, HEAD_DIM]: the sum of exp(score - m_i) * v over
    them. scores [GROUP, BLOCK_SIZE]: this block's scores (already scaled), -inf where a key is past the
    context (it must get weight exactly 0). v [BLOCK_SIZE, HEAD_DIM]: this block's values.

    The new maximum m_new is the larger of m_i and the block's row maximum (`tl.max` over axis 1, then
    `tl.maximum`). Everything summed so far was relative to the old maximum: rescale l_i and acc by
    alpha = exp(m_i - m_new) (0 on the first block, since m_i is -inf). Then p = exp(scores - m_new)
    per key, l_new = alpha * l_i + the row sums of p, and acc_new = alpha * acc + p @ v (a sum over the
    block's keys; write it as `tl.sum` of a broadcast product, since `tl.dot` needs 16 rows and a group
    may have 1). After the last block, acc / l_i is the attention output. The tests compare that with
    the torch paged_decode_attention, to 1e-5, for MHA and GQA and for contexts of 1, block_size,
    block_size + 1 and a partial last block.

    Example, one head, HEAD_DIM 1: m_i = 1, l_i = 1, acc = [2]; a block with scores [1, -inf], v [[4], [9]]
    gives m_new = 1, alpha = 1, p = [1, 0], l_new = 2, acc_new = [6] (the mean of the values 2 and 4).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 09.2: the online-softmax update — rescale the running sums to the new maximum, add this block's weights and values
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    l_new = alpha * l_i + tl.sum(p, axis=1)
    acc_new = alpha[:, None] * acc + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return m_new, l_new, acc_new
    # END EXERCISE


@jit
def paged_decode_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale,
    stride_q,
    stride_out,
    stride_block,
    stride_token,
    stride_kv_head,
    stride_table,
    k_scale_ptr,
    v_scale_ptr,
    stride_scale_block,
    stride_scale_token,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KV_INT8: tl.constexpr = False,
):
    """Program (seq, kv_head): the GROUP query heads kv_head * GROUP ... of sequence seq attend to its keys. With
    KV_INT8 (kv_cache_dtype="int8") the caches hold int8 numbers, dequantized as they are loaded by their scales
    (k_scale_ptr, v_scale_ptr: [num_blocks, block_size, kv_heads] float32); without it the scale arguments are unused
    and the compiled kernel is the float one."""
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    rows, dims = tl.arange(0, GROUP_PAD), tl.arange(0, HEAD_DIM_PAD)
    q_mask = (rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_q + heads[:, None] * HEAD_DIM + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)
    context_len = tl.load(context_lens_ptr + seq)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    tokens = tl.arange(0, BLOCK_SIZE)
    for i in range(0, tl.cdiv(context_len, BLOCK_SIZE)):  # only the blocks in use: -1 padding is never read
        block = tl.load(block_tables_ptr + seq * stride_table + i)
        valid = i * BLOCK_SIZE + tokens < context_len
        kv_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]
        offsets = block * stride_block + tokens[:, None] * stride_token + kv_head * stride_kv_head + dims[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        if KV_INT8:  # each token's scale in this KV head, one per key and one per value
            scale_offsets = block * stride_scale_block + tokens * stride_scale_token + kv_head
            k = k * tl.load(k_scale_ptr + scale_offsets, mask=valid, other=0.0)[:, None]
            v = v * tl.load(v_scale_ptr + scale_offsets, mask=valid, other=0.0)[:, None]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_i, l_i, acc = online_softmax_update(m_i, l_i, acc, scores, v)
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + seq * stride_out + heads[:, None] * HEAD_DIM + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float, k_scale=None, v_scale=None):
    """Same contract as minillm.layers.attention.paged_attention.paged_decode_attention, as one kernel launch:
    q [num_seqs, heads, head_dim] → [num_seqs, heads, head_dim], each query over its context in the cache. With
    k_scale and v_scale, the caches are int8 and those their float32 scales [num_blocks, block_size, kv_heads]
    (kv_cache_dtype="int8"), read as the torch backend reads them."""
    check_device(q, k_cache, v_cache, block_tables, context_lens)
    quantized = k_scale is not None
    if quantized and (k_scale.stride() != v_scale.stride() or k_scale.stride(-1) != 1):
        raise ValueError("paged_decode_attention needs k_scale and v_scale of one layout, kv_heads contiguous")
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    q = q if q.stride(-1) == 1 and q.stride(1) == head_dim else q.contiguous()
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("paged_decode_attention needs k_cache and v_cache of one layout, head_dim contiguous")
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    with kernel_errors():
        paged_decode_attention_kernel[(num_seqs, num_kv_heads)](
            out,
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            q.stride(0),
            out.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.stride(0),
            k_scale if quantized else k_cache,  # unused by the float kernel
            v_scale if quantized else v_cache,
            k_scale.stride(0) if quantized else 0,
            k_scale.stride(1) if quantized else 0,
            GROUP=group,
            GROUP_PAD=triton.next_power_of_2(group),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
            BLOCK_SIZE=block_size,
            KV_INT8=quantized,
        )
    return out
