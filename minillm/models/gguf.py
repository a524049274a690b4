"""Read a GGUF file (llama.cpp's format) as a Hugging Face checkpoint: config, fp32 tensors, tokenizer.

A GGUF holds the model's hyper-parameters as key-value metadata (`llama.block_count`, ...), the tokenizer
(vocabulary, merges, chat template) and every tensor, many of them quantized in blocks (Q4_1: 32 weights share
a scale and a minimum, 4 bits each). The `gguf` package's `dequantize` turns a block-quantized tensor back into
floats. Two layout details: a GGUF lists a matrix's dimensions in reverse (numpy's row-major [out, in] is
what reading it gives), and llama.cpp's converter permutes LLaMA's q_proj and k_proj rows so that its rotary
kernel can rotate adjacent pairs; `unpermute` undoes that for Hugging Face's rotate-the-halves convention.
"""

from pathlib import Path

import numpy as np
import torch

# our (Hugging Face) name inside model.layers.N. -> llama.cpp's inside blk.N.
LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
MODEL_TENSORS = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# general.architecture -> config.json's architecture; LLaMA's q/k rows are permuted by llama.cpp's converter
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_name(gguf_name: str) -> str:
    """The checkpoint name of a llama.cpp tensor, e.g. blk.3.ffn_up.weight -> model.layers.3.mlp.up_proj.weight."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        block, _, inner = stem.removeprefix("blk.").partition(".")
        for ours, theirs in LAYER_TENSORS.items():
            if inner == theirs:
                return f"model.layers.{block}.{ours}.{kind}"
    for ours, theirs in MODEL_TENSORS.items():
        if stem == theirs:
            return f"{ours}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in minillm's decoder")


def unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: within each head, its converter interleaved the two rotary halves
    (rows 0, d/2, 1, d/2+1, ...); Hugging Face's LLaMA keeps them as halves."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def field(reader, key: str, default=None):
    """One metadata value (a number, a string or a list), or `default` when the file has no such key."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> dict:
    """A config.json (as a dict) from the file's metadata, for the architectures minillm's decoder covers."""
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}: minillm reads {', '.join(GGUF_ARCHITECTURES)}")
    get = lambda key, default=None: field(reader, f"{arch}.{key}", default)
    names = {t.name for t in reader.tensors}
    heads, hidden = get("attention.head_count"), get("embedding_length")
    return {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "vocab_size": get("vocab_size") or len(field(reader, "tokenizer.ggml.tokens")),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "max_position_embeddings": get("context_length"),
        "rms_norm_eps": float(f"{get('attention.layer_norm_rms_epsilon'):.7g}"),  # a float32 in the file: 1e-05
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "attention_bias": "blk.0.attn_q.bias" in names,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def gguf_tensors(reader, config: dict, keep=lambda name, tensor_type: False):
    """(checkpoint name, tensor) for every tensor of the file, q/k rows in HF order: float32, dequantized, or the
    file's bytes as they are (uint8 [rows, bytes per row], its blocks) where keep(name, tensor_type) says so."""
    from gguf.quants import dequantize

    llama = config["model_type"] == "llama"
    for t in reader.tensors:
        name = hf_name(t.name)
        if keep(name, int(t.tensor_type)):
            weight = np.array(t.data, dtype=np.uint8)  # a copy: the data is a read-only map of the file
        else:
            weight = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if llama and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            weight = unpermute(weight, config["num_attention_heads"])
        elif llama and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            weight = unpermute(weight, config["num_key_value_heads"])
        yield name, torch.from_numpy(weight)


def convert_gguf(file: Path, out: Path) -> None:
    """Write `file` as a Hugging Face checkpoint directory `out`: config.json, generation_config.json,
    model.safetensors (fp32) and the tokenizer with its chat template (transformers reads a GGUF's tokenizer),
    unless the file has none."""
    import json

    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    reader = GGUFReader(file)
    config = gguf_config(reader)
    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(gguf_tensors(reader, config)), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # A GGUF records no sampling settings. do_sample false (greedy) is transformers' default, written out so that
    # readers with vLLM's defaults (minillm's LLM.chat) do not sample at temperature 1, where a 4-bit 135M model
    # mostly answers off the point (SmolLM2: "Paris" in about 1 of 3 answers; greedy: "The capital ... is Paris.")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if field(reader, "tokenizer.ggml.model") != "none":  # "none": a file of token ids only (bench.gguf_export)
        AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name).save_pretrained(out)
