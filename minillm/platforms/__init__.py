"""What the device offers, chosen once per engine: the linear method, the attention backend, the layers' native
kernels, the threads a step runs on, and the defaults for compiling layers and replaying decode steps. vLLM asks
`current_platform`; here each ModelRunner selects its Platform from its config and hands it to the model's layers
(`prepare_model`), so nothing in the layers asks what device they are on."""

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from minillm.config import Config
from minillm.kernels.cpu import cpu_kernels, norm_cpu, rotary_cpu, silu_and_mul_cpu
from minillm.layers.activation import SiluAndMul
from minillm.layers.attention import Attention
from minillm.layers.attention.backends import TorchAttentionBackend, select_attention_backend, triton_compiles
from minillm.layers.linear_method import PackedLinearMethod, UnquantizedLinearMethod
from minillm.layers.rms_norm import RMSNorm
from minillm.layers.rotary import RotaryEmbedding
from minillm.quantization.methods import get_linear_method


@dataclass
class Platform:
    device: torch.device
    attention_backend: TorchAttentionBackend
    linear_method: UnquantizedLinearMethod
    layer_kernels: dict[type, object] = field(default_factory=dict)  # layer class -> its native kernel
    threads: int | None = None  # torch's intra-op threads while a step runs (None: torch's own)
    compile_layers: bool = False  # Config.compile_layers's default
    replays_decode: bool = False  # whether decode steps are replayed per bucket by default (Config.enforce_eager)

    def prepare_model(self, model: nn.Module) -> list[Attention]:
        """After loading: the linear method's weight layout and kernels, the native kernels of the elementwise
        layers, and the attention backend of every Attention layer, numbered. Returns those layers in order."""
        self.linear_method.process_weights_after_loading(model)
        attn_layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer_id, layer in enumerate(attn_layers):
            layer.backend, layer.layer_id = self.attention_backend, layer_id
        for layer in model.modules():
            if type(layer) in self.layer_kernels:
                layer.kernel = self.layer_kernels[type(layer)]
        return attn_layers


def cpu_threads_per_rank(ranks: int) -> int:
    """Ranks of one model sharing a CPU split its cores (one thread each when they outnumber them)."""
    return max(1, (os.cpu_count() or 1) // ranks)


def select_platform(config: Config, dtype: torch.dtype, ranks: int = 1, local_rank: int = 0) -> Platform:
    """The platform of an engine's rank: on CUDA one device per rank, the Triton kernels when they compile,
    compiled layers and CUDA graphs; on a CPU the C++ kernels when they build (packed float32 matmuls, decode
    attention in place, the elementwise layers), eager steps, and the cores split among the ranks (tensor-parallel
    ranks times pipeline stages)."""
    device = torch.device(config.device)
    native = config.native_kernels
    backend = select_attention_backend(config.attention_backend, device, native)
    if device.type == "cuda":
        if ranks > 1:
            device = torch.device("cuda", local_rank)
        kernels = {}
        if native and triton_compiles():
            # only where Triton compiles: it reads TRITON_INTERPRET
            from minillm.kernels import triton as triton_kernels

            kernels = {RMSNorm: triton_kernels.norm}
        method = UnquantizedLinearMethod()
        if config.quantization:
            method = get_linear_method(config.quantization, "triton" if native and triton_compiles() else "torch")
        return Platform(device, backend, method, kernels, compile_layers=True, replays_decode=True)
    native = native and device.type == "cpu" and cpu_kernels()
    fp32 = native and dtype == torch.float32
    if config.quantization:
        # any dtype: the quantized kernels widen a 16-bit x to float32 (never a dequantized weight per call)
        linear_method = get_linear_method(config.quantization, "cpu" if native else "torch")
    else:
        packs = native and dtype == torch.float32 and config.linear_kernel != "torch"
        linear_method = PackedLinearMethod(config.linear_kernel) if packs else UnquantizedLinearMethod()
    return Platform(
        device,
        backend,
        linear_method,
        # the elementwise kernels are float32's; a 16-bit model keeps torch's
        {RMSNorm: norm_cpu, SiluAndMul: silu_and_mul_cpu, RotaryEmbedding: rotary_cpu} if fp32 else {},
        threads=cpu_threads_per_rank(ranks) if ranks > 1 else None,
    )
