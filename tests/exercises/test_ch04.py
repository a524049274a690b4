"""Chapter 04 exercises: KV-cache size per token (04.1), writing keys and values into the cache (04.2).

04.1 is checked against the published shapes of real models; 04.2 against a plain loop, then plugged into
minillm's contiguous-cache generator, which must produce the same tokens as recomputing everything.

    python -m minillm.course grade 04
"""

import pytest
import torch

from minillm.config import ModelConfig
from minillm.course import use_impl
from minillm.models import build_model
from minillm.naive import generate_cached, generate_naive


def shapes(layers, kv_heads, head_dim):
    return ModelConfig(
        "Qwen3ForCausalLM",
        vocab_size=1,
        hidden_size=1,
        intermediate_size=1,
        num_hidden_layers=layers,
        num_attention_heads=kv_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=1,
    )


@pytest.mark.exercise("04.1")
@pytest.mark.parametrize(
    "config,dtype,expected",
    [
        pytest.param(shapes(28, 8, 128), torch.bfloat16, 114_688, id="Qwen3-0.6B in bf16"),
        pytest.param(shapes(32, 8, 128), torch.bfloat16, 131_072, id="Llama-3-8B in bf16"),
        pytest.param(shapes(2, 1, 16), torch.float32, 256, id="tiny model in fp32"),
    ],
)
def test_kv_cache_bytes_per_token(impl, config, dtype, expected):
    assert impl.kv_cache_bytes_per_token(config, dtype) == expected


def loop_store(k, v, k_cache, v_cache, slot_mapping):
    """The same write as a plain loop over tokens."""
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = k[t]
            v_cache[slot // block_size, slot % block_size] = v[t]


@pytest.mark.exercise("04.2")
def test_store_kvcache_writes_each_token_into_its_slot(impl):
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([0, 7, 3, -1, 12])  # out of order, one skipped
    caches = [torch.zeros(4, 4, 2, 8) for _ in range(4)]
    impl.store_kvcache(k, v, caches[0], caches[1], slots)
    loop_store(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.exercise("04.2")
def test_the_contiguous_cache_generates_like_recomputing(impl, tiny_checkpoint):
    model = build_model(tiny_checkpoint)
    prompt = [5, 80, 13, 200, 7, 7, 61]
    expected = list(generate_naive(model, prompt, 20))
    with use_impl(impl, "04.2"):
        assert list(generate_cached(model, prompt, 20)) == expected
