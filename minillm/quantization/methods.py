"""The quantized linear methods, vLLM's quantization configs (vllm/model_executor/layers/quantization/): each
decides how a layer's weight is stored and which kernel multiplies by it, and the platform picks one per engine.

- Int8LinearMethod (`quantization="int8"`): loads the float checkpoint, then quantizes every linear layer's weight
  and the LM head's to int8 with a scale per output row (formats.quantize_int8): a quarter of the bytes.
- GGUFLinearMethod (`quantization="gguf"`): reads the GGUF file itself and keeps its Q8_0, Q4_0 and Q4_1 tensors
  in their blocks, as llama.cpp runs them (a linear layer stored in another type is dequantized, with a warning).

Both multiply with `minillm.kernels.cpu.quant_linear` (C++, on a CPU where the kernels build),
`minillm.kernels.triton.quant_linear` (Triton, on CUDA) or their torch twin `quant_linear_torch`; a tied embedding table
looks its rows up in the LM head's quantized weight.
"""

import functools
import itertools
import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minillm.kernels.cpu import empty_pages, release_freed_memory
from minillm.kernels.packing import pack_int8, packed_int8_rows, packed_int8_shape
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.linear import LinearBase
from minillm.layers.linear_method import UnquantizedLinearMethod
from minillm.quantization import formats
from minillm.quantization.formats import BLOCK, BLOCK_BYTES, I8, NAMES, Q4_0, Q4_1, Q8_0


def quant_linear_torch(x, weight, scale=None, bias=None, *, qtype: int, out_features: int) -> torch.Tensor:
    """What the quantized kernels compute, in torch ops for any device: x quantized blockwise and back
    (formats.quantize_activations), times the weight dequantized on every call. Correct, not fast."""
    rows = x.reshape(-1, x.shape[-1])
    qx, dx = formats.quantize_activations(rows)
    xq = (qx.float().view(rows.shape[0], -1, BLOCK) * dx[..., None]).view(rows.shape).to(x.dtype)
    y = F.linear(xq, formats.dequantize(weight, qtype, scale).to(x.dtype), bias)
    return y.view(*x.shape[:-1], out_features)


def embed_quantized(input_ids, weight, *, scale=None, qtype: int, dtype: torch.dtype, lookup=None) -> torch.Tensor:
    """Rows of a quantized embedding table (tied: the LM head's weight), dequantized as they are looked up;
    lookup(weight, ids) reads them from a weight packed for a kernel (kernels.packed_int8_rows)."""
    ids = input_ids.flatten()
    stored = weight[ids] if lookup is None else lookup(weight, ids)
    rows = formats.dequantize(stored, qtype, None if scale is None else scale[ids])
    return rows.to(dtype).view(*input_ids.shape, -1)


class QuantizedLinearMethod(UnquantizedLinearMethod):
    """What both methods share: once a layer holds a quantized weight (layer.qtype, and layer.weight_scale for
    int8), its kernel, and the tied embedding's lookup."""

    def empty(self, shapes: list[tuple[int, ...]], dtype: torch.dtype, device) -> list[torch.Tensor]:
        """Uninitialised weights of these shapes for the kernel. On the CPU kernels' path, all in one mapping backed
        by 2 MiB pages, as the packed float32 weights are: a decode step streams every weight, and 4 KiB pages would
        cost a TLB miss each (one mapping for all, as a mapping each would round each weight up to 2 MiB)."""
        if self.kernel != "cpu":
            return [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
        nbytes = [math.prod(shape) * dtype.itemsize for shape in shapes]
        sizes = [-(-n // 64) * 64 for n in nbytes]  # each on a cache line
        arena = empty_pages([sum(sizes) // 4]).view(torch.uint8)
        starts = itertools.accumulate(sizes, initial=0)
        return [arena[o : o + n].view(dtype).view(shape) for o, n, shape in zip(starts, nbytes, shapes)]

    def __init__(self, kernel: str):
        if kernel == "cpu":
            from minillm.kernels.cpu import quant_linear
        elif kernel == "triton":  # only where Triton compiles: it reads TRITON_INTERPRET
            from minillm.kernels.triton.quant_linear import quant_linear
        self.kernel, self.linear = kernel, quant_linear_torch if kernel == "torch" else quant_linear

    packed = False  # whether the weights are packed for the CPU kernel (int8's are: kernels.pack_int8)

    def set_kernels(self, model: nn.Module, dtype: torch.dtype) -> None:
        tables = {id(m.weight): m for m in model.modules() if type(m) is VocabParallelEmbedding}
        lookup = packed_int8_rows if self.packed else None
        for layer in model.modules():
            qtype, scale = getattr(layer, "qtype", None), getattr(layer, "weight_scale", None)
            if qtype is None:
                continue
            if isinstance(layer, (LinearBase, ParallelLMHead)):
                out = layer.weight.shape[0] if scale is None else len(scale)  # a packed weight's rows are grouped
                layer.kernel = functools.partial(self.multiply, scale=scale, qtype=qtype, out=out)
            table = layer if type(layer) is VocabParallelEmbedding else tables.get(id(layer.weight))
            if table is not None:
                table.kernel = functools.partial(embed_quantized, scale=scale, qtype=qtype, dtype=dtype, lookup=lookup)

    def multiply(self, x, weight, bias=None, *, scale, qtype: int, out: int) -> torch.Tensor:
        """kernel(x, weight, bias), as a linear layer calls it, for a weight of type qtype."""
        return self.linear(x, weight, scale, bias, qtype=qtype, out_features=out)


class Int8LinearMethod(QuantizedLinearMethod):
    """int8 weights with a float32 scale per output row, quantized at load from the float checkpoint: every
    linear layer and the LM head (with tied embeddings, the table too), where the input size divides by 32. For
    the CPU kernel they are stored packed (packing.pack_int8: rows in groups of four, block by block)."""

    name = "int8"

    def __init__(self, kernel: str):
        super().__init__(kernel)
        self.packed = kernel == "cpu"

    def process_weights_after_loading(self, model: nn.Module) -> None:
        dtype = next(model.parameters()).dtype
        weights = {}  # id -> weight: a tied table once
        for layer in model.modules():
            if isinstance(layer, (LinearBase, ParallelLMHead)) and layer.weight.shape[1] % BLOCK == 0:
                weights[id(layer.weight)] = layer.weight
        quantized = [formats.quantize_int8(w.data) for w in weights.values()]  # by name: use_impl may swap it
        shapes = [packed_int8_shape(*q.shape) if self.packed else q.shape for q, _ in quantized]
        params = self.empty(shapes, torch.int8, next(iter(weights.values())).device)
        for weight, (q, scale), param in zip(weights.values(), quantized, params):
            param = nn.Parameter(pack_int8(q, param) if self.packed else param.copy_(q), requires_grad=False)
            for m in [m for m in model.modules() if getattr(m, "weight", None) is weight]:
                m.weight, m.qtype, m.weight_scale = param, I8, scale
        del weights, quantized
        self.set_kernels(model, dtype)
        release_freed_memory()


class GGUFLinearMethod(QuantizedLinearMethod):
    """A GGUF file's block-quantized tensors as they are: each linear layer (and the embedding table) whose
    checkpoint tensors are all of one kept type gets a uint8 weight [out, blocks · block bytes] before loading,
    and the loader copies the file's bytes into it; other tensors are dequantized to float as they load."""

    name = "gguf"
    KEPT = (Q8_0, Q4_0, Q4_1)

    def load_weights(self, model: nn.Module, path: Path) -> None:
        from gguf import GGUFReader

        from minillm.models.gguf import gguf_config, gguf_tensors, hf_name
        from minillm.models.hub import gguf_source
        from minillm.utils.loader import checkpoint_names, load_model

        file = gguf_source(path)
        if file is None:
            raise ValueError(
                f"quantization='gguf' reads a GGUF file, and the checkpoint at {path} was not converted from one "
                "(or its file is gone): pass the .gguf file itself (LLM('model.gguf')), or a hub id minillm "
                "obtains as a GGUF file (python -m minillm.models list)"
            )
        reader = GGUFReader(file)
        types = {hf_name(t.name): int(t.tensor_type) for t in reader.tensors}
        packed, kept, floats, blocks = getattr(model, "packed_modules_mapping", {}), set(), [], {}
        for name, layer in model.named_modules():
            if not isinstance(layer, (LinearBase, VocabParallelEmbedding)) or id(layer.weight) in blocks:
                continue  # not a matmul, or a tied LM head whose table is already in
            sources = [s for s in checkpoint_names(f"{name}.weight", packed) if s in types]
            qtypes = {types[s] for s in sources}
            if len(qtypes) != 1 or not qtypes <= set(self.KEPT):
                floats += [f"{s} ({reader_type_name(types[s])})" for s in sources if types[s] not in (0, 1)]
                continue
            blocks[id(layer.weight)] = layer.weight, qtypes.pop()
            kept.update(sources)
        shapes = [(w.shape[0], w.shape[1] // BLOCK * BLOCK_BYTES[qtype]) for w, qtype in blocks.values()]
        device = next(model.parameters()).device
        for (weight, qtype), raw in zip(blocks.values(), self.empty(shapes, torch.uint8, device)):
            raw = nn.Parameter(raw, requires_grad=False)
            raw.weight_loader = weight.weight_loader
            for m in [m for m in model.modules() if getattr(m, "weight", None) is weight]:  # a tied LM head too
                m.weight, m.qtype = raw, qtype
        if floats:
            warnings.warn(
                f"minillm: {len(floats)} linear tensors of {file.name} are in types its kernels do not read "
                f"(they read {', '.join(NAMES[t] for t in self.KEPT)}), so they are dequantized to float: "
                + ", ".join(floats[:4])
                + (" ..." if len(floats) > 4 else ""),
                RuntimeWarning,
                stacklevel=2,
            )
        load_model(model, file, gguf_tensors(reader, gguf_config(reader), lambda name, t: name in kept))

    def process_weights_after_loading(self, model: nn.Module) -> None:
        self.set_kernels(model, next(p for p in model.parameters() if p.is_floating_point()).dtype)


def reader_type_name(tensor_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(tensor_type).name


METHODS = {"int8": Int8LinearMethod, "gguf": GGUFLinearMethod}


def get_linear_method(quantization: str, kernel: str) -> QuantizedLinearMethod:
    """The linear method of Config.quantization, multiplying with `kernel`: "cpu" (the C++ kernels, built),
    "triton" (CUDA, or Triton's interpreter) or "torch" (quant_linear_torch, anywhere)."""
    return METHODS[quantization](kernel)
