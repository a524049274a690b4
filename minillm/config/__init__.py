"""Configuration: the engine's settings (Config), and what a checkpoint's config.json says about the model
(minillm.config.model) and speculative decoding's settings (minillm.config.speculative), as in vLLM's vllm/config/."""

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.config.model import (
    ARCHITECTURES,
    DEQUANTIZED_METHODS,
    MODEL_TYPES,
    ROPE_TYPES,
    ModelConfig,
    architecture_of,
    check_supported,
)
from minillm.config.speculative import SPECULATIVE_METHODS, SpeculativeConfig

ASSETS = Path(__file__).parent.parent / "assets"  # minillm/assets: the models that ship in the package


def default_model_path() -> Path:
    """The embedded default model: a small story-telling Qwen3 that ships inside the package."""
    return ASSETS / "default_model"


def draft_model_path() -> Path:
    """The default model's draft (chapter 13): a much smaller story model with the same tokenizer, shipped with it."""
    return ASSETS / "draft_model"


DTYPES = ("float32", "bfloat16", "float16")  # what the model may compute in
# The packed matmul's variants: how its matrix-vector product prefetches the weight, as (hint, bytes ahead) with
# linear_cpu.cpp's hints 0 none, 1 t0 (into every cache level), 2 nta (data read once). "packed" is the default.
PACKED_PREFETCH = {"packed": (2, 2048), "packed-nta-8k": (2, 8192), "packed-t0": (1, 2048), "packed-none": (0, 0)}
LINEAR_KERNELS = ("auto", *PACKED_PREFETCH, "torch")  # Config.linear_kernel
QUANTIZATION_METHODS = ("int8", "gguf")  # Config.quantization (minillm.quantization)
KV_CACHE_DTYPES = ("auto", "int8")  # Config.kv_cache_dtype


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str | None) -> str:
    """The dtype the engine computes in. "auto" is float32 on a CPU (minillm's CPU kernels are float32) and, on
    CUDA, the checkpoint's dtype when it is a 16-bit one, else bfloat16: a float32 checkpoint would halve the
    throughput of a weight-bound step, and vLLM computes it in 16 bits too. Any other value is kept."""
    if dtype != "auto":
        return dtype
    if torch.device(device).type != "cuda":
        return "float32"
    return checkpoint_dtype if checkpoint_dtype in ("bfloat16", "float16") else "bfloat16"


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
    # on a CPU, the float32 matmuls: "auto" times minillm's packed kernel (each prefetch of PACKED_PREFETCH) against
    # F.linear on each weight shape at load and keeps the fastest (minillm.utils.autotune; cached per CPU); a name of
    # LINEAR_KERNELS ("packed", "torch", ...) forces one; default: $MINILLM_LINEAR_KERNEL, else "auto"
    linear_kernel: str | None = None
    skip_tokenizer_init: bool = False  # run on token ids alone: no tokenizer.json needed, outputs have no text
    # vLLM's name. True: every step runs op by op. False: decode steps are replayed per batch-size bucket
    # (minillm.engine.graphs): CUDA graphs on a GPU, steps compiled by torch.compile on a CPU. None: the device's
    # default: CUDA graphs on a GPU; eager on a CPU, since compiling a bucket takes seconds (about 15 for the
    # default model) and gains about 1.2x.
    enforce_eager: bool | None = None
    # vLLM's name (its compilation_config's): the decode batch sizes that get a replayed step, each built when the
    # engine starts (a batch between two runs in the larger one; past the largest, op by op). None: 1, 2, 4, 8, then
    # every multiple of 16 up to max_num_seqs (graphs.decode_buckets), built at start on a GPU and on first use on a
    # CPU. The chat and the server compile [1] on a CPU: one sequence decodes fast, and no larger batch ever waits
    # for the compiler mid-service.
    cudagraph_capture_sizes: list[int] | None = None
    # torch.compile the layers' hot functions (RMSNorm, add+RMSNorm, rotary, SiLU-and-mul, top-k/top-p; chapter
    # 08), each compiled once on first use. None: on for CUDA, where the fused kernels are recorded in the CUDA
    # graphs; off on a CPU, where each compiled call's fixed host cost (~60-100 µs) exceeds what fusing saves
    # at decode sizes (measured in notebook 08) and the first steps would wait for the compiler.
    compile_layers: bool | None = None
    # chapter 10: split every layer across this many processes (ranks), one per device (or CPU core); rank 0 is
    # the engine's own process, the others minillm.engine.worker processes (or torchrun's)
    tensor_parallel_size: int = 1
    # chapter 15, vLLM's name: split the layers into this many stages, one after the other, each on its own ranks
    # (tensor_parallel_size of them); up to this many batches are in flight at once, one per stage
    pipeline_parallel_size: int = 1
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
            "pipeline_parallel_size",
        ):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.kvcache_block_size & (self.kvcache_block_size - 1):
            raise ValueError(f"kvcache_block_size must be a power of two (16 is usual), got {self.kvcache_block_size}")
        sizes = self.cudagraph_capture_sizes
        if sizes is not None and not (
            sizes and all(isinstance(n, int) and 1 <= n <= min(self.max_num_seqs, 512) for n in sizes)
        ):
            raise ValueError(
                f"cudagraph_capture_sizes must be a non-empty list of batch sizes from 1 to max_num_seqs "
                f"({self.max_num_seqs}, at most 512), got {sizes!r}"
            )
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
        settings = {"": (self.quantization, self.kv_cache_dtype)}
        if self.speculative_config is not None:  # raises, naming the bad field; the draft's own settings checked too
            spec = SpeculativeConfig.from_dict(self.speculative_config)
            settings["speculative_config "] = spec.quantization, spec.kv_cache_dtype
        for where, (quantization, kv_cache_dtype) in settings.items():
            if quantization not in (None, *QUANTIZATION_METHODS):
                options = ", ".join(QUANTIZATION_METHODS)
                raise ValueError(f"{where}quantization must be None or one of {options}, got {quantization!r}")
            if kv_cache_dtype not in KV_CACHE_DTYPES:
                options = ", ".join(KV_CACHE_DTYPES)
                raise ValueError(f"{where}kv_cache_dtype must be one of {options}, got {kv_cache_dtype!r}")
        if self.quantization and self.tensor_parallel_size > 1:
            raise ValueError(
                f"quantization={self.quantization!r} runs on one rank only: set tensor_parallel_size=1, or drop "
                "quantization to split the float weights across ranks"
            )
        if self.quantization and self.pipeline_parallel_size > 1:
            raise ValueError(
                f"quantization={self.quantization!r} runs on one rank only: set pipeline_parallel_size=1, or drop "
                "quantization to split the float model into stages"
            )
        if self.speculative_config is not None and self.pipeline_parallel_size > 1:
            raise ValueError(
                "speculative decoding is not supported with pipeline_parallel_size > 1 (the engine's batch queue "
                "does not carry drafts): drop speculative_config, or use pipeline_parallel_size=1"
            )
        if self.linear_kernel is None:
            self.linear_kernel = os.environ.get("MINILLM_LINEAR_KERNEL") or "auto"
        if self.linear_kernel not in LINEAR_KERNELS:
            raise ValueError(
                f"linear_kernel (or $MINILLM_LINEAR_KERNEL) must be one of {', '.join(LINEAR_KERNELS)}, got "
                f"{self.linear_kernel!r}"
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")


__all__ = [
    "ARCHITECTURES",
    "DEQUANTIZED_METHODS",
    "DTYPES",
    "KV_CACHE_DTYPES",
    "LINEAR_KERNELS",
    "MODEL_TYPES",
    "PACKED_PREFETCH",
    "QUANTIZATION_METHODS",
    "ROPE_TYPES",
    "SPECULATIVE_METHODS",
    "Config",
    "ModelConfig",
    "SpeculativeConfig",
    "architecture_of",
    "check_supported",
    "default_model_path",
    "draft_model_path",
    "resolve_dtype",
]
