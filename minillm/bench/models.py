"""The checkpoint every backend runs: the default model, a checkpoint directory, or a random-weight Qwen3.

Random weights make cost-versus-size runs possible without downloading anything: the speed of a forward
pass does not depend on what the weights say, only on their shapes.
"""

import json
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from minillm.config import default_model_path
from minillm.utils.loader import resolve_model_path

# Qwen3 shapes (fp32, tied embeddings, 2048 positions): 100.7M, 26.1M and 0.9M parameters; the smaller ones
# shrink width, depth and vocabulary alike.
RANDOM_SIZES = {
    "tiny": dict(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    "25m": dict(
        vocab_size=16384,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "100m": dict(
        vocab_size=32768,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
    ),
}


def save_random_qwen3(size: str, path: Path, seed: int = 0, max_position_embeddings: int = 2048) -> None:
    """Write a random-weight Qwen3 of one of RANDOM_SIZES to path with transformers' save_pretrained. It has
    no tokenizer: the bench runs on token ids."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        **RANDOM_SIZES[size], max_position_embeddings=max_position_embeddings, tie_word_embeddings=True, dtype="float32"
    )
    Qwen3ForCausalLM(config).save_pretrained(path)


@contextmanager
def checkpoint(model: str | None, random_size: str | None, seed: int = 0) -> Iterator[tuple[Path, str]]:
    """Yield (checkpoint directory, short name for file names). model is a directory or a hub id, resolved as
    LLM(model) resolves it (minillm.utils.loader.resolve_model_path: a hub id minillm knows is converted once into
    its cache, offline), so that every backend, the transformers peers included, reads the same directory. A random
    model lives in a temporary directory, deleted on exit."""
    if random_size is None:
        path = resolve_model_path(model) if model else default_model_path()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is not a checkpoint directory (no config.json): pass --model DIR "
                "with config.json and *.safetensors, a hub id minillm knows, or --random-size"
            )
        yield path, "default" if model is None else model_name(model, path)
        return
    with tempfile.TemporaryDirectory(prefix=f"minillm-bench-{random_size}-") as tmp:
        save_random_qwen3(random_size, Path(tmp), seed)
        yield Path(tmp), f"random-{random_size}"


def model_name(model: str, path: Path) -> str:
    """A checkpoint's short name for file names: a directory's name, or a hub id's name part (its directory is a
    cache entry such as HuggingFaceTB--SmolLM2-135M-Instruct)."""
    if Path(model).expanduser().is_dir():
        return path.name
    return str(model).rstrip("/").split("/")[-1]


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def special_token_ids(path: Path) -> set[int]:
    """BOS, EOS and padding ids from config.json and generation_config.json, and the special tokens of
    tokenizer.json: the ids a random prompt leaves out."""
    ids = set()
    for name in ("config.json", "generation_config.json"):
        if (path / name).is_file():
            cfg = json.loads((path / name).read_text())
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                value = cfg.get(key)
                ids.update([value] if isinstance(value, int) else value or [])
    if (path / "tokenizer.json").is_file():
        tokenizer = json.loads((path / "tokenizer.json").read_text())
        ids.update(t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special"))
    return ids


def weight_bytes(model) -> int:
    """The bytes a forward pass reads for the weights of a loaded model as it holds them: every parameter once
    (a tied table counted once), in its stored dtype, and the scales of quantized weights."""
    scales = {id(s): s for m in model.modules() if isinstance(s := getattr(m, "weight_scale", None), torch.Tensor)}
    return sum(p.nbytes for p in model.parameters()) + sum(s.nbytes for s in scales.values())


def num_parameters(path: Path) -> int:
    """Parameters stored in the checkpoint's safetensors files (a tied LM head is stored once)."""
    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total
