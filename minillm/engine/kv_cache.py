"""Sizing and allocating the KV cache: one tensor for all layers, handed to each layer as a view."""
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


def free_kv_cache(model: torch.nn.Module) -> None:
    """Detach every layer from the cache so its memory can be released."""
    for m in model.modules():
        if isinstance(m, Attention):
            m.k_cache = m.v_cache = torch.tensor([])
