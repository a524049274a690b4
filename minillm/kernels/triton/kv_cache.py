"""Store a step's new keys and values into the paged KV cache: one Triton program per token.

The torch version (minillm.layers.attention.paged_attention.store_kvcache) masks out slot -1 first, which on a GPU
means a data-dependent number of rows; here each program reads its own slot and simply returns when it is
-1, so nothing is synchronised and a CUDA graph can record the launch. vLLM's kernel is
`reshape_and_cache_flash`; nano-vllm's is this one, `store_kvcache_kernel`.
"""

import triton
import triton.language as tl

from minillm.kernels.triton.common import check_device, jit, kernel_errors


@jit
def store_kvcache_kernel(
    key_ptr,
    key_stride,
    value_ptr,
    value_stride,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Copy token t's key and value into cache slot slot_mapping[t]; program t does token t (grid: num_tokens).

    key_ptr, value_ptr: the step's keys and values [num_tokens, kv_heads, head_dim]; one token's
    kv_heads * head_dim = D numbers lie side by side, and token t's start at t * key_stride (t *
    value_stride), its row stride, which need not be D (k may be a view into a larger qkv tensor).
    k_cache_ptr, v_cache_ptr: one layer's cache [num_blocks, block_size, kv_heads, head_dim], contiguous,
    so slot s (block s // block_size, offset s % block_size) is the D numbers starting at s * D.
    slot_mapping_ptr: int64 [num_tokens], each token's slot, or -1 (PAD_SLOT_ID, or a key already cached in
    a shared prefix block): then the program returns at once and writes nothing.
    D: the numbers per token; BLOCK_D: D rounded up to a power of two (tl.arange needs one), so lanes
    D .. BLOCK_D - 1 must be masked off on every load and store.

    Program id 0 (`tl.program_id(0)`) is the token. Load its slot, leave when it is negative, then load the
    D numbers of the key and of the value and store each at its slot's offset in its cache. Every slot not
    named keeps its old contents: the tests compare the whole cache with the torch store_kvcache, for slots
    in any order, slot -1 rows, kv_heads * head_dim not a power of two, and keys strided inside qkv.

    Example, D = 4, slot_mapping [5, -1]: token 0's key goes to k_cache numbers 20..23, token 1 nowhere.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 09.1: the store kernel — one program copies its token's key and value into its slot, unless the slot is -1
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    offsets = tl.arange(0, BLOCK_D)
    inside = offsets < D
    key = tl.load(key_ptr + token * key_stride + offsets, mask=inside)
    value = tl.load(value_ptr + token * value_stride + offsets, mask=inside)
    tl.store(k_cache_ptr + slot * D + offsets, key, mask=inside)
    tl.store(v_cache_ptr + slot * D + offsets, value, mask=inside)
    # END EXERCISE


@jit
def store_kvcache_int8_kernel(
    key_ptr,
    key_stride,
    value_ptr,
    value_stride,
    k_cache_ptr,
    k_scale_ptr,
    v_cache_ptr,
    v_scale_ptr,
    slot_mapping_ptr,
    KV_HEADS: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """store_kvcache_kernel for an int8 cache (kv_cache_dtype="int8"): program t quantizes token t's key and value,
    each KV head's vector with its own scale (minillm.layers.attention.paged_attention.quantize_kv), and stores the int8
    numbers at slot * KV_HEADS * HEAD_DIM of the caches, the KV_HEADS scales at slot * KV_HEADS of the scales."""
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    heads, dims = tl.arange(0, KV_HEADS_PAD), tl.arange(0, HEAD_DIM_PAD)
    inside = (heads < KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    offsets = heads[:, None] * HEAD_DIM + dims[None, :]
    row, scales = slot * KV_HEADS * HEAD_DIM, slot * KV_HEADS
    live = heads < KV_HEADS
    quantize_and_store(
        key_ptr + token * key_stride, k_cache_ptr + row, k_scale_ptr + scales, offsets, inside, heads, live
    )
    quantize_and_store(
        value_ptr + token * value_stride, v_cache_ptr + row, v_scale_ptr + scales, offsets, inside, heads, live
    )


@jit
def quantize_and_store(x_ptr, cache_ptr, scale_ptr, offsets, inside, heads, live):
    """One token's keys (or values) [KV_HEADS, HEAD_DIM] (`offsets` from x_ptr and cache_ptr; `inside` the lanes in
    use, `live` the heads) as int8 with a scale per head, written at cache_ptr and scale_ptr: scale = max|x| / 127
    (1.0 for an all-zero head), q = round(x / scale), ties to even as torch.round: adding and subtracting 1.5 · 2^23
    rounds a float32 of magnitude below 2^22 to an integer in the default rounding mode (nearest, ties to even)."""
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / 127, 1.0)
    q = (x / scale[:, None] + 12582912.0) - 12582912.0
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    tl.store(cache_ptr + offsets, q.to(tl.int8), mask=inside)
    tl.store(scale_ptr + heads, scale, mask=live)


def store_kvcache(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """Write key/value [num_tokens, kv_heads, head_dim] into their slots of k_cache/v_cache, in place; slot -1
    skipped: minillm.layers.attention.paged_attention.store_kvcache's contract, as one kernel launch. Given the
    scales of an int8 cache (kv_cache_dtype="int8": float32 [num_blocks, block_size, kv_heads]), each KV head's
    vector is quantized as paged_attention.quantize_kv does it, its numbers and its scale stored in the same slot."""
    scales = () if k_scale is None else (k_scale, v_scale)
    check_device(key, value, k_cache, v_cache, *scales, slot_mapping)
    num_tokens, kv_heads, head_dim = key.shape
    key, value = (t if t.stride(-1) == 1 and t.stride(1) == head_dim else t.contiguous() for t in (key, value))
    if not all(t.is_contiguous() for t in (k_cache, v_cache, *scales)):
        raise ValueError("store_kvcache writes into contiguous caches [num_blocks, block_size, kv_heads, head_dim]")
    if num_tokens == 0:
        return
    rows = key, key.stride(0), value, value.stride(0)
    pad = triton.next_power_of_2
    with kernel_errors():
        if not scales:
            D = kv_heads * head_dim
            store_kvcache_kernel[(num_tokens,)](*rows, k_cache, v_cache, slot_mapping, D=D, BLOCK_D=pad(D))
        else:
            store_kvcache_int8_kernel[(num_tokens,)](
                *rows,
                k_cache,
                k_scale,
                v_cache,
                v_scale,
                slot_mapping,
                KV_HEADS=kv_heads,
                KV_HEADS_PAD=pad(kv_heads),
                HEAD_DIM=head_dim,
                HEAD_DIM_PAD=pad(head_dim),
            )
