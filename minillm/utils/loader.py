"""Load a Hugging Face checkpoint directory into a minillm model, tensor by tensor, through weight_loaders."""

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from minillm.layers.linear import copy_checked
from minillm.utils.pipeline import PPMissingLayer


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
    """Parameters with no layout of their own (norm weights) take the checkpoint tensor as it is."""
    copy_checked(param.data, loaded_weight, "weight")


def resolve_model_path(model: str | Path) -> Path:
    """A local checkpoint directory as is; a .gguf file, or a hub id minillm knows (minillm.models.hub) from its
    installed package, as a checkpoint directory converted once into the cache; any other hub id from Hugging
    Face's local cache, or downloaded (a network)."""
    from minillm.models.hub import KNOWN_MODELS, get_model, gguf_checkpoint

    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":  # its config and tokenizer converted once; its blocks read as is
        return gguf_checkpoint(path)
    if str(model) in KNOWN_MODELS:
        return get_model(str(model))
    known = ", ".join(KNOWN_MODELS)
    if path.is_absolute() or str(model).startswith((".", "~")) or str(model).count("/") != 1:  # not "org/name"
        raise FileNotFoundError(
            f"no checkpoint directory at {str(model)!r}: pass the path of a directory holding "
            "config.json, *.safetensors and tokenizer.json, a hub id minillm obtains offline "
            f"({known}), or LLM() for the default model"
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.jinja"]))
    except Exception as e:
        raise FileNotFoundError(
            f"{model!r} is not a local checkpoint directory, not a hub id minillm obtains offline ({known}; "
            f"`python -m minillm.models list`), and could not be fetched from the hub ({type(e).__name__}). "
            "Pass the path of a directory holding config.json, *.safetensors and tokenizer.json."
        ) from e


def checkpoint_names(param_name: str, packed: dict) -> list[str]:
    """The checkpoint tensors that fill one model parameter: several for a packed qkv_proj or gate_up_proj."""
    for target in {t for t, _ in packed.values()}:
        if f".{target}." in param_name:
            return [param_name.replace(target, src) for src, (t, _) in packed.items() if t == target]
    return [param_name]


def open_safetensors(file: Path):
    """safe_open, with an error that names the file when it is truncated or corrupt."""
    try:
        return safe_open(file, "pt", "cpu")
    except Exception as e:
        raise ValueError(
            f"{file} is not a readable safetensors file ({e}): it may be truncated or corrupt; "
            "copy or download it again"
        ) from e


def safetensors_tensors(path: str | Path, skip: tuple[str, ...] = ()):
    """(name, tensor) for every tensor of the *.safetensors files in `path`, file by file, but those whose name
    starts with one of `skip` (left unread)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    for file in files:
        with open_safetensors(file) as f:
            for name in f.keys():
                if not name.startswith(skip):
                    yield name, f.get_tensor(name)


def load_model(model: nn.Module, path: str | Path, tensors=None) -> None:
    """Copy every tensor of the *.safetensors files in `path` (or of `tensors`, (name, tensor) pairs read from
    `path`) into `model`.

    A checkpoint name like `layers.0.self_attn.k_proj.weight` is first mapped through the model's
    packed_modules_mapping (to `qkv_proj` with shard "k"); the parameter's weight_loader does the copy.
    Raises if a tensor has no parameter, a parameter got no tensor, or a shape differs. A pipeline stage's model
    (chapter 15) leaves the tensors of the layers other stages hold (its PPMissingLayers) unread. (Quantized
    `tensors` come from one rank's whole model: quantization runs on one rank.)
    """
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters())
    elsewhere = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, PPMissingLayer))
    seen, unexpected = set(), []
    for name, tensor in safetensors_tensors(path, elsewhere) if tensors is None else tensors:
        param_name, shard_id = name, None
        for src, (target, shard) in packed.items():
            if f".{src}." in name:
                param_name, shard_id = name.replace(src, target), shard
                break
        param = params.get(param_name)
        if param is None:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue  # tied: the embedding table already is the LM head
            unexpected.append(name)
            continue
        try:
            with torch.no_grad():
                loader = getattr(param, "weight_loader", default_weight_loader)
                # a float tensor takes the parameter's dtype; a quantized one (int8, GGUF's bytes) is copied as it is
                loader(param, tensor.to(param.dtype) if tensor.is_floating_point() else tensor, shard_id)
        except ValueError as e:
            raise ValueError(f"{name} ({path}): {e}") from None
        seen.add(name)
    missing = [n for p in params for n in checkpoint_names(p, packed) if n not in seen]
    if unexpected or missing:
        raise ValueError(
            f"checkpoint {path} does not match the model "
            f"({type(model).__name__}, architecture {model.config.architecture}): "
            + (f"missing tensors {missing}; " if missing else "")
            + (f"unexpected tensors {unexpected}" if unexpected else "")
        )
