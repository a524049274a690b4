"""Sizing and allocating the KV cache: one tensor for all layers, handed to each layer as a view."""
from contextlib import contextmanager

import torch

from minillm.config import ModelConfig
from minillm.layers.attention import Attention


def kv_cache_bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Every layer keeps a key and a value vector per KV head for each token: 2·layers·kv_heads·head_dim·bytes."""
    # BEGIN EXERCISE 04.1: KV-cache bytes per token — keys and values, every layer, every KV head
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize
    # END EXERCISE


def allocate_kv_cache(model: torch.nn.Module, num_blocks: int, block_size: int) -> torch.Tensor:
    """Allocate [2, layers, num_blocks, block_size, kv_heads, head_dim] and point each Attention layer at its slice."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    a, w = layers[0], model.lm_head.weight
    cache = torch.zeros(2, len(layers), num_blocks, block_size, a.num_kv_heads, a.head_dim, dtype=w.dtype,
                        device=w.device)
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]
    return cache


@contextmanager
def temporary_kv_cache(model: torch.nn.Module, num_blocks: int, block_size: int):
    """A fresh cache on model's layers inside a `with`; on leaving, the layers get back the cache they had (an
    engine's, or none), so borrowing an engine's model for a side computation disturbs nothing."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    saved = [(layer.k_cache, layer.v_cache) for layer in layers]
    try:
        yield allocate_kv_cache(model, num_blocks, block_size)
    finally:
        for layer, (k_cache, v_cache) in zip(layers, saved):
            layer.k_cache, layer.v_cache = k_cache, v_cache
