"""A checkpoint's model: what its config.json says, and what of it minillm's one decoder (models/qwen3.py) supports."""

import json
from dataclasses import dataclass, field
from pathlib import Path

# Architecture name in config.json -> the switches that make the one decoder in models/qwen3.py that model.
ARCHITECTURES = {
    "Qwen3ForCausalLM": dict(qk_norm=True, qkv_bias=None, o_bias=None),
    "Qwen2ForCausalLM": dict(qk_norm=False, qkv_bias=True, o_bias=False),
    "LlamaForCausalLM": dict(qk_norm=False, qkv_bias=None, o_bias=None),
}
# config.json's model_type -> its architecture, for the files (often converted ones) that list no architectures
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# quantization methods whose *.safetensors hold plain floats: transformers records {"quant_method": "gguf"} on a
# model it dequantized from a GGUF file (GGUF blocks live in the .gguf file, never in a safetensors file)
DEQUANTIZED_METHODS = ("gguf",)
ROPE_TYPES = ("default", "linear", "llama3")  # what minillm.layers.rotary implements


def architecture_of(cfg: dict) -> str:
    """The checkpoint's architecture: its `architectures` list, else its `model_type`."""
    if cfg.get("architectures"):
        arch = cfg["architectures"][0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r}: minillm supports {', '.join(ARCHITECTURES)}.")
        return arch
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} (config.json lists no architectures): minillm "
            f"supports model_type {', '.join(MODEL_TYPES)} (architectures {', '.join(ARCHITECTURES)})."
        )
    return MODEL_TYPES[model_type]


def check_supported(cfg: dict) -> None:
    """Refuse, naming the field and the way out, what minillm's decoder would compute differently."""
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        if method not in DEQUANTIZED_METHODS:
            raise ValueError(
                f"this checkpoint's weights are stored quantized (quantization_config: quant_method {method!r}); "
                "minillm loads plain float weights (float32, bfloat16, float16): use the unquantized checkpoint, "
                "or dequantize this one (in transformers: from_pretrained, model.dequantize(), save_pretrained) "
                "and drop quantization_config from config.json."
            )
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}: minillm's MLP is SwiGLU (silu).")
    layer_types = set(cfg.get("layer_types") or ()) - {"full_attention"}
    windowed = (
        cfg.get("use_sliding_window")
        and cfg.get("sliding_window")
        and cfg.get("max_window_layers", 0) < cfg["num_hidden_layers"]
    )
    if layer_types or windowed:
        raise ValueError(
            f"sliding-window attention is not supported (layer_types {sorted(layer_types)}, use_sliding_window "
            f"{cfg.get('use_sliding_window')}, sliding_window {cfg.get('sliding_window')}): minillm attends to the "
            "whole context. The two agree while no context is longer than the window: then set use_sliding_window "
            "to false (and layer_types to full_attention) in config.json."
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling {kind!r}: minillm implements {', '.join(ROPE_TYPES)}.")
    if rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("unsupported partial_rotary_factor: minillm rotates every channel of a head (factor 1.0).")


@dataclass
class ModelConfig:
    """The fields of a Hugging Face config.json that minillm's decoder uses."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    dtype: str | None = None  # what the weights are stored in (config.json's torch_dtype, or dtype in transformers 5)

    @classmethod
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        arch = architecture_of(cfg)
        check_supported(cfg)
        # transformers 5 writes rope_parameters = {rope_type, rope_theta, ...}; older files write
        # rope_theta and rope_scaling at the top level.
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        switches = ARCHITECTURES[arch]
        bias = cfg.get("attention_bias", False)
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            rope_scaling=rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qk_norm=switches["qk_norm"],
            qkv_bias=bias if switches["qkv_bias"] is None else switches["qkv_bias"],
            o_bias=bias if switches["o_bias"] is None else switches["o_bias"],
            mlp_bias=cfg.get("mlp_bias", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=[] if eos is None else [eos] if isinstance(eos, int) else list(eos),
            dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        file = Path(path) / "config.json"
        if not file.is_file():
            raise FileNotFoundError(
                f"{path} has no config.json: a checkpoint directory holds config.json, "
                "*.safetensors and tokenizer.json (as Hugging Face writes them)"
            )
        return cls.from_dict(json.loads(file.read_text()))
