"""Configuration: what a checkpoint's config.json says about the model."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch


def default_model_path() -> Path:
    """The embedded default model: a small story-telling Qwen3 that ships inside the package."""
    return Path(__file__).parent.parent / "assets" / "default_model"


def draft_model_path() -> Path:
    """The default model's draft (chapter 13): a much smaller story model with the same tokenizer, shipped with it."""
    return Path(__file__).parent.parent / "assets" / "draft_model"


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
DTYPES = ("float32", "bfloat16", "float16")  # what the model may compute in
QUANTIZATION_METHODS = ("int8", "gguf")  # Config.quantization (minillm.quantization)
KV_CACHE_DTYPES = ("auto", "int8")  # Config.kv_cache_dtype
SPECULATIVE_METHODS = ("ngram", "draft_model")  # Config.speculative_config["method"] (minillm.spec_decode)


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str | None) -> str:
    """The dtype the engine computes in. "auto" is float32 on a CPU (minillm's CPU kernels are float32) and, on
    CUDA, the checkpoint's dtype when it is a 16-bit one, else bfloat16: a float32 checkpoint would halve the
    throughput of a weight-bound step, and vLLM computes it in 16 bits too. Any other value is kept."""
    if dtype != "auto":
        return dtype
    if torch.device(device).type != "cuda":
        return "float32"
    return checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "bfloat16"


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


@dataclass
class SpeculativeConfig:
    """vLLM's speculative_config: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n,
    "prompt_lookup_min": m} or {"method": "draft_model", "model": ID|DIR, "num_speculative_tokens": k}."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None

    @classmethod
    def from_dict(cls, config: dict) -> "SpeculativeConfig":
        known = set(cls.__dataclass_fields__)
        if not isinstance(config, dict) or set(config) - known:
            raise ValueError(
                f"speculative_config must be a dict with keys among {sorted(known)}, got {config!r}: e.g. "
                '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
            )
        spec = cls(**{"method": None, "num_speculative_tokens": None, **config})
        if spec.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config method must be one of {', '.join(SPECULATIVE_METHODS)}, got {spec.method!r}"
            )
        k = spec.num_speculative_tokens
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"speculative_config num_speculative_tokens must be an integer >= 1, got {k!r}")
        if spec.method == "ngram":  # as vLLM: one bound given stands for both; neither, 5
            spec.prompt_lookup_max = spec.prompt_lookup_max or spec.prompt_lookup_min or 5
            spec.prompt_lookup_min = spec.prompt_lookup_min or spec.prompt_lookup_max
            n_min, n_max = spec.prompt_lookup_min, spec.prompt_lookup_max
            if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
                raise ValueError(
                    f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {n_min!r} and {n_max!r}"
                )
        elif spec.model is None:
            raise ValueError('speculative_config method "draft_model" needs "model": a checkpoint directory or hub id')
        return spec


@dataclass
class Config:
    """Engine settings (vLLM's names). The KV cache gets num_kvcache_blocks blocks, or as many as fit in
    kvcache_memory_bytes."""

    model: str | Path | None = None  # checkpoint directory or hub id; None = the embedded default model
    max_num_seqs: int = 256  # sequences in one batch (vLLM's default)
    max_num_batched_tokens: int = 4096  # tokens in one step; a longer prompt is prefilled in chunks
    # A step runs every running request's next token and, in what is left of max_num_batched_tokens, prompt chunks
    # (vLLM V1's scheduler; SGLang's --enable-mixed-chunk), so an arriving prompt slows the running requests' step
    # instead of stalling them for its whole prefill. False: a step is all prefill (prompts first) or all decode.
    mixed_steps: bool = True
    long_prefill_token_threshold: int = 0  # vLLM's name: at most this many tokens of one prompt a step (0: no cap)
    max_model_len: int | None = None  # prompt + generated tokens; default: the model's max_position_embeddings
    kvcache_block_size: int = 16
    num_kvcache_blocks: int | None = None
    kvcache_memory_bytes: int = 512 * 2**20  # CPU; per tensor-parallel rank, as gpu_memory_utilization is per device
    gpu_memory_utilization: float = 0.9  # CUDA: fraction of the device's memory minillm may use in all
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # or "priority": higher priority first, FCFS among equals
    # A new request is admitted only if the cache keeps room for this fraction of every running request's remaining
    # max_tokens (SGLang's new_token_ratio): admitting whatever fits now (0, as vLLM does) overfills the cache as
    # the running requests grow, and each preemption recomputes a request from scratch (SmolLM2-135M, mixed
    # workload, 512 MB of cache: 27% of the tokens computed were recomputed ones; with 0.5, none).
    new_token_ratio: float = 0.5
    # "float32", "bfloat16", "float16", or "auto" (vLLM's default): float32 on a CPU, whose kernels here are float32;
    # on CUDA the checkpoint's 16-bit dtype, bfloat16 for a float32 checkpoint (resolve_dtype)
    dtype: str = "auto"
    device: str = "cpu"
    attention_backend: str = "auto"  # "torch" (the reference), "cpu" (a C++ decode kernel) or "triton" (chapter 09);
    # auto: triton on CUDA, cpu on a CPU (torch with native_kernels off)
    # the platform's own kernels for the other layers (minillm.platforms): on a CPU minillm's C++ ones (float32
    # matmuls on packed weights, RMSNorm, SiLU-and-mul, rotary), on CUDA the Triton RMSNorm; False: torch ops only
    native_kernels: bool = True
    skip_tokenizer_init: bool = False  # run on token ids alone: no tokenizer.json needed, outputs have no text
    # vLLM's name. True: every step runs op by op. False: decode steps are replayed per batch-size bucket
    # (minillm.engine.graphs): CUDA graphs on a GPU, steps compiled by torch.compile on a CPU. None: the device's
    # default: CUDA graphs on a GPU; eager on a CPU, since compiling a bucket takes seconds (about 15 for the
    # default model) and gains about 1.2x.
    enforce_eager: bool | None = None
    # torch.compile the layers' hot functions (RMSNorm, add+RMSNorm, rotary, SiLU-and-mul, top-k/top-p; chapter
    # 08), each compiled once on first use. None: on for CUDA, where the fused kernels are recorded in the CUDA
    # graphs; off on a CPU, where each compiled call's fixed host cost (~60-100 µs) exceeds what fusing saves
    # at decode sizes (measured in notebook 08) and the first steps would wait for the compiler.
    compile_layers: bool | None = None
    # chapter 10: split every layer across this many processes (ranks), one per device (or CPU core); rank 0 is
    # the engine's own process, the others minillm.engine.worker processes (or torchrun's)
    tensor_parallel_size: int = 1
    # chapter 13, vLLM's name: SpeculativeConfig's fields in a dict: {"method": "ngram", "num_speculative_tokens": 4}
    speculative_config: dict | None = None
    # chapter 14, vLLM's name: "int8" (each weight matrix quantized at load, int8 with a scale per output row) or
    # "gguf" (a GGUF file's Q8_0, Q4_0 and Q4_1 tensors kept in their blocks); None: the checkpoint's floats.
    # A model given as a .gguf file, or a known hub id with quantization="gguf", loads from its GGUF file.
    quantization: str | None = None
    # chapter 14, vLLM's name: "auto" keeps keys and values in the model's dtype; "int8" stores them as int8 with a
    # float32 scale per token and KV head (a little over a quarter of float32's bytes: about 3.5x the tokens fit)
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "kvcache_block_size",
            "kvcache_memory_bytes",
            "tensor_parallel_size",
        ):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.kvcache_block_size & (self.kvcache_block_size - 1):
            raise ValueError(f"kvcache_block_size must be a power of two (16 is usual), got {self.kvcache_block_size}")
        if self.num_kvcache_blocks is not None and not self.num_kvcache_blocks >= 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1, got {self.num_kvcache_blocks!r}")
        if not (isinstance(self.long_prefill_token_threshold, int) and self.long_prefill_token_threshold >= 0):
            raise ValueError(
                f"long_prefill_token_threshold must be an integer >= 0 (0: no cap), got {self.long_prefill_token_threshold!r}"
            )
        if not (isinstance(self.new_token_ratio, (int, float)) and 0 <= self.new_token_ratio <= 1):
            raise ValueError(f"new_token_ratio must be a number in [0, 1], got {self.new_token_ratio!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be 'auto' or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)  # raises, naming the bad field
        if self.quantization not in (None, *QUANTIZATION_METHODS):
            raise ValueError(
                f"quantization must be None or one of {', '.join(QUANTIZATION_METHODS)}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.quantization and self.tensor_parallel_size > 1:
            raise ValueError(
                f"quantization={self.quantization!r} runs on one rank only: set tensor_parallel_size=1, or drop "
                "quantization to split the float weights across ranks"
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
