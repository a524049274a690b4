"""Model classes by the architecture name a checkpoint's config.json gives, and the one call that loads them."""

from pathlib import Path

import torch

from minillm.config import ARCHITECTURES, ModelConfig
from minillm.models.qwen3 import Qwen3ForCausalLM
from minillm.utils.loader import load_model, resolve_model_path

MODEL_REGISTRY = {arch: Qwen3ForCausalLM for arch in ARCHITECTURES}


def build_model(
    model: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", linear_method=None
) -> Qwen3ForCausalLM:
    """Read config.json, build the matching decoder and load its weights, ready for inference: the safetensors
    files, or what `linear_method` (the platform's, minillm.layers.linear_method) loads, such as a GGUF's blocks."""
    path = resolve_model_path(model)
    config = ModelConfig.from_pretrained(path)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in their final dtype, on their final device
    try:
        with torch.device(device):
            net = MODEL_REGISTRY[config.architecture](config)
    finally:
        torch.set_default_dtype(default_dtype)
    if linear_method is None:
        load_model(net, path)
    else:
        linear_method.load_weights(net, path)
    return net.eval()
