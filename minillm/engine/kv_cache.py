"""Sizing and allocating the KV cache: one tensor for all layers, handed to each layer as a view."""

from contextlib import contextmanager

import torch

from minillm.config import ModelConfig
from minillm.layers.attention import Attention
from minillm.layers.rms_norm import RMSNorm


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of KV cache one token takes in the whole model: each layer keeps a key and a value per KV head.

    config is a ModelConfig: read config.num_hidden_layers, config.num_key_value_heads and config.head_dim.
    dtype is the cache's torch dtype, which sets the bytes per number (4 for torch.float32, 2 for
    torch.bfloat16 and torch.float16). Returns a Python int:

        2 (a key and a value) × num_hidden_layers × num_key_value_heads × head_dim × bytes per number

    Count the KV heads, not num_attention_heads: under grouped-query attention only the KV heads are cached.
    The tests check Qwen3-0.6B (28 layers, 8 KV heads, head_dim 128) in bf16, 114,688 bytes; Llama-3-8B
    (32, 8, 128) in bf16, 131,072; a tiny model (2, 1, 16) in fp32, 256.

    Example: the course's default model (4 layers, 2 KV heads, head_dim 32) in fp32: 2·4·2·32·4 = 2,048 bytes.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 04.1: KV-cache bytes per token — keys and values, every layer, every KV head
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize
    # END EXERCISE


def kv_cache_int8_bytes_per_token(config: ModelConfig) -> int:
    """kv_cache_bytes_per_token of an int8 cache (kv_cache_dtype="int8"): each key and value of a KV head is
    head_dim int8 numbers and one float32 scale, head_dim + 4 bytes where float32 takes 4 · head_dim (head_dim 32:
    36 against 128 bytes, 3.6x the tokens in the same memory; head_dim 64: 68 against 256, 3.8x)."""
    scales = 2 * config.num_hidden_layers * config.num_key_value_heads * 4
    return kv_cache_bytes_per_token(config, torch.int8) + scales


def norm_weight(model: torch.nn.Module) -> torch.Tensor:
    """A float weight in the model's dtype on its device (a quantized linear weight is int8): its first RMSNorm's,
    which every pipeline stage has."""
    return next(m.weight for m in model.modules() if isinstance(m, RMSNorm))


def allocate_kv_cache(model: torch.nn.Module, num_blocks: int, block_size: int) -> torch.Tensor:
    """Allocate [2, layers, num_blocks, block_size, kv_heads, head_dim] and point each Attention layer at its slice."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    a, w = layers[0], norm_weight(model)
    cache = torch.zeros(
        2, len(layers), num_blocks, block_size, a.num_kv_heads, a.head_dim, dtype=w.dtype, device=w.device
    )
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]
        layer.k_scale = layer.v_scale = None  # a float cache (a model's earlier int8 one had scales)
    return cache


def allocate_int8_kv_cache(
    model: torch.nn.Module, num_blocks: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_cache_dtype="int8": the cache as int8 [2, layers, num_blocks, block_size, kv_heads, head_dim] and its float32
    scales [2, layers, num_blocks, block_size, kv_heads], one per token and KV head; each Attention layer gets its
    slice of both (k_cache, v_cache, k_scale, v_scale). Returns (cache, scales)."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    a, device = layers[0], norm_weight(model).device
    shape = (2, len(layers), num_blocks, block_size, a.num_kv_heads)
    cache = torch.zeros(*shape, a.head_dim, dtype=torch.int8, device=device)
    scales = torch.zeros(shape, dtype=torch.float32, device=device)
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]
        layer.k_scale, layer.v_scale = scales[0, i], scales[1, i]
    return cache, scales


def copy_blocks(caches: list[torch.Tensor | None], pairs: list[tuple[int, int]]) -> None:
    """Copy-on-write (chapter 16): each (source, destination) block's keys and values (and int8 scales), every
    layer, in one indexed copy per tensor; caches are [2, layers, blocks, ...] tensors (None: no such tensor)."""
    src, dst = (list(x) for x in zip(*pairs))
    for cache in filter(lambda c: c is not None, caches):
        cache[:, :, dst] = cache[:, :, src]


@contextmanager
def temporary_kv_cache(model: torch.nn.Module, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto"):
    """A fresh cache on model's layers inside a `with` (an int8 one, scales and all, with kv_cache_dtype "int8");
    on leaving, the layers get back the cache they had (an engine's, or none), so borrowing an engine's model for
    a side computation disturbs nothing."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    saved = [(layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale) for layer in layers]
    allocate = allocate_int8_kv_cache if kv_cache_dtype == "int8" else allocate_kv_cache
    try:
        yield allocate(model, num_blocks, block_size)
    finally:
        for layer, (k_cache, v_cache, k_scale, v_scale) in zip(layers, saved):
            layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale = k_cache, v_cache, k_scale, v_scale
