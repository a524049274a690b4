"""Random-weight Hugging Face checkpoints of several shapes, written with transformers for the oracle tests."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    max_position_embeddings=256,
    initializer_range=0.1,
)
# name -> (transformers class, config): GQA and MHA, tied and untied, head_dim != hidden/heads, rope scaling.
CONFIGS = {
    "qwen3-gqa-tied": (
        Qwen3ForCausalLM,
        Qwen3Config(**_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    ),
    "qwen3-gqa-untied": (
        Qwen3ForCausalLM,
        Qwen3Config(**_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
    ),
    "qwen3-mha-untied": (
        Qwen3ForCausalLM,
        Qwen3Config(**_COMMON, num_attention_heads=4, num_key_value_heads=4, head_dim=16, tie_word_embeddings=False),
    ),
    "qwen2-gqa-bias": (
        Qwen2ForCausalLM,
        Qwen2Config(**_COMMON, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True),
    ),
    "llama-mha-llama3-rope": (
        LlamaForCausalLM,
        LlamaConfig(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "llama-gqa-linear-rope": (
        LlamaForCausalLM,
        LlamaConfig(
            **_COMMON,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            attention_bias=True,
            rope_scaling=dict(rope_type="linear", factor=2.0),
        ),
    ),
}


def make_checkpoint(name: str, path, seed: int = 0, num_hidden_layers: int | None = None):
    """Write checkpoint `name` (with num_hidden_layers layers instead of its own, if given) into `path` and return
    the transformers model that wrote it."""
    cls, config = CONFIGS[name]
    if num_hidden_layers is not None:  # the per-layer lists (layer_types) are rebuilt for the new depth
        settings = {k: v for k, v in config.to_dict().items() if k != "layer_types"}
        config = type(config).from_dict(settings | {"num_hidden_layers": num_hidden_layers})
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():  # biases start at zero; give them values so a dropped bias is caught
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    write_byte_tokenizer(path)
    return model


def write_byte_tokenizer(path):
    """A tokenizer.json with exactly the 256 byte tokens (no merges), so any id < 256 decodes to text."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
