"""Store a step's new keys and values into the paged KV cache: one Triton program per token.

The torch version (minillm.layers.paged_attention.store_kvcache) masks out slot -1 first, which on a GPU
means a data-dependent number of rows; here each program reads its own slot and simply returns when it is
-1, so nothing is synchronised and a CUDA graph can record the launch. vLLM's kernel is
`reshape_and_cache_flash`; nano-vllm's is this one, `store_kvcache_kernel`.
"""

import torch
import triton
import triton.language as tl

from minillm.kernels.common import check_device, jit, kernel_errors


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


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write key/value [num_tokens, kv_heads, head_dim] into their slots of k_cache/v_cache, in place; slot -1
    skipped. Same contract as minillm.layers.paged_attention.store_kvcache, as one kernel launch."""
    check_device(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, kv_heads, head_dim = key.shape
    D = kv_heads * head_dim
    key, value = (t if t.stride(-1) == 1 and t.stride(1) == head_dim else t.contiguous() for t in (key, value))
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kvcache writes into contiguous caches [num_blocks, block_size, kv_heads, head_dim]")
    if num_tokens == 0:
        return
    with kernel_errors():
        store_kvcache_kernel[(num_tokens,)](
            key,
            key.stride(0),
            value,
            value.stride(0),
            k_cache,
            v_cache,
            slot_mapping,
            D=D,
            BLOCK_D=triton.next_power_of_2(D),
        )
