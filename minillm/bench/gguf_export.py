"""Write a Qwen3 checkpoint as a GGUF file, the format llama.cpp runs, with the `gguf` package: fp32, or its
matrices in llama.cpp's Q8_0, Q4_0 or Q4_1 blocks (chapter 14).

So that llama.cpp is compared with minillm on the very same weights: no conversion of precision (every tensor
F32), no permutation (Qwen3's rotary embedding is the NEOX kind, rotating the two halves of each head, which
is how llama.cpp's qwen3 graph applies it, so q_proj and k_proj go in as they are, unlike LLaMA's in
llama.cpp's converter). The layout follows llama.cpp's convert_hf_to_gguf.py (Qwen3Model) and gguf-py's
tensor names; a GGUF stores each matrix with its dimensions reversed, which is what writing the row-major
(out_features, in_features) array gives.

The benchmark feeds token ids, so the file has no real tokenizer: tokenizer.ggml.model = "none" with
qwen3.vocab_size set, which llama.cpp loads as that many dummy tokens (no BOS, EOS or merges to supply).

    python -m minillm.bench.gguf_export CHECKPOINT_DIR OUT_DIR [f32|q8_0|q4_0|q4_1]
"""

import hashlib
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from minillm.config import ModelConfig
from minillm.models.gguf import LAYER_TENSORS, MODEL_TENSORS


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name for a checkpoint tensor, e.g. model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight."""
    stem, _, kind = hf_name.rpartition(".")  # kind: weight or bias
    if stem.startswith("model.layers."):
        block, _, inner = stem.removeprefix("model.layers.").partition(".")
        if inner in LAYER_TENSORS:
            return f"blk.{block}.{LAYER_TENSORS[inner]}.{kind}"
    elif stem in MODEL_TENSORS:
        return f"{MODEL_TENSORS[stem]}.{kind}"
    raise ValueError(f"no llama.cpp name for tensor {hf_name!r}: only Qwen3 checkpoints are exported")


def checkpoint_digest(path: Path) -> str:
    """A short hash of config.json and the safetensors files: the cache key of the checkpoint's GGUF."""
    digest = hashlib.sha256()
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:16]


FILE_TYPES = {"f32": "ALL_F32", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1"}


def write_gguf(path: Path, out: Path, outtype: str = "f32") -> Path:
    """Write checkpoint `path` (a Qwen3: config.json and *.safetensors) to the GGUF file `out`: every tensor F32,
    or with outtype "q8_0", "q4_0" or "q4_1" every matrix in those blocks (quantized by the gguf package, as
    llama.cpp's converter does; the norms stay F32). A tied LM head is stored once (token_embd), which llama.cpp
    reuses as its output matrix."""
    import gguf

    cfg = ModelConfig.from_pretrained(path)
    if cfg.architecture != "Qwen3ForCausalLM":
        raise ValueError(f"only Qwen3ForCausalLM checkpoints are exported to GGUF, not {cfg.architecture}")
    if cfg.rope_scaling is not None:
        raise ValueError(f"rope scaling {cfg.rope_scaling} is not exported: only the default rotary embedding")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(tmp, "qwen3")
    writer.add_name(path.name)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[outtype]))
    qtype = None if outtype == "f32" else getattr(gguf.GGMLQuantizationType, outtype.upper())
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("none")  # token ids only: llama.cpp makes vocab_size dummy tokens
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                tensor = f.get_tensor(name).to(torch.float32).numpy()
                if qtype is None or tensor.ndim != 2:
                    writer.add_tensor(gguf_name(name), tensor)
                else:
                    blocks = gguf.quants.quantize(tensor, qtype)
                    writer.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def export(path: Path, cache_dir: Path, outtype: str = "f32") -> Path:
    """The checkpoint's GGUF (write_gguf's outtype) in cache_dir, written on first use (named by a hash of the
    checkpoint, so a random model made again with the same seed finds its file)."""
    out = Path(cache_dir) / f"qwen3-{outtype}-{checkpoint_digest(Path(path))}.gguf"
    return out if out.is_file() else write_gguf(Path(path), out, outtype)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[3:] and sys.argv[3] not in FILE_TYPES:
        raise SystemExit(__doc__)
    print(export(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]))
