"""How the linear layers multiply: the linear method, chosen once per engine by the platform (vLLM's
LinearMethodBase; the quantized ones are in minillm.quantization.methods). After loading, a method puts the weights in the layout its
kernel reads (one copy of each: the plain one is freed) and sets each layer's `kernel`."""

import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn

from minillm.config import PACKED_PREFETCH
from minillm.kernels.cpu import build_name, empty_pages, linear_packed, release_freed_memory
from minillm.kernels.packing import embed_packed, pack_weight, pack_weights
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.linear import LinearBase
from minillm.utils.autotune import KernelChoices, cpu_model, from_memory


class UnquantizedLinearMethod:
    """F.linear on the weights as loaded (lm_logits for the LM head): every device, every dtype."""

    name = "torch"

    def load_weights(self, model: nn.Module, path) -> None:
        """Fill the model's parameters from the checkpoint directory's safetensors files."""
        from minillm.utils.loader import load_model

        load_model(model, path)

    def process_weights_after_loading(self, model: nn.Module) -> None:
        pass


class PackedLinearMethod(UnquantizedLinearMethod):
    """minillm's C++ matmuls (minillm.kernels.cpu) on float32 CPU weights packed once at load, which BLAS
    would repack on every call: a matrix-vector product for one or two rows that streams them at the memory's
    speed, a register-tiled product for more. Row-parallel shards included: under tensor parallelism each rank
    packs its own shard and its partial product runs the same kernel (row_parallel_linear's `linear`).

    Whether the packed kernel beats F.linear, and with which prefetch, depends on the CPU, so with linear_kernel
    "auto" each weight shape is timed every way at load (minillm.utils.autotune, at the batch sizes of ROWS) and
    only the shapes where a packed variant wins are packed; a forced variant ("packed", ...) packs every one."""

    name = "packed"
    ROWS = [1, 2, 8, 32]  # batch 1 (chat), and decode batches of a busy server

    def __init__(self, linear_kernel: str = "auto"):
        self.linear_kernel = linear_kernel
        self.choices: KernelChoices | None = None  # with "auto", once loaded: what was chosen, and the times

    def process_weights_after_loading(self, model: nn.Module) -> None:
        """Every float32 weight a linear layer or the LM head multiplies by, of a shape where the packed kernel is
        chosen, is replaced by its packed layout, the tied embedding table included, which then looks rows up in
        it (unless the table is split across ranks)."""
        tables = {id(m.weight): m for m in model.modules() if type(m) is VocabParallelEmbedding}
        layers = [
            m
            for m in model.modules()
            if isinstance(m, (LinearBase, ParallelLMHead))
            and m.weight.is_cpu
            and m.weight.dtype == torch.float32
            and (id(m.weight) not in tables or tables[id(m.weight)].tp_size == 1)
        ]
        shapes = {tuple(m.weight.shape): m.weight for m in layers}
        kernels = self.choose(shapes) if self.linear_kernel == "auto" else dict.fromkeys(shapes, self.linear_kernel)
        layers = [m for m in layers if kernels[tuple(m.weight.shape)] != "torch"]
        for layer, packed in zip(layers, pack_weights([m.weight for m in layers])):
            weight, layer.weight = layer.weight, nn.Parameter(packed, requires_grad=False)
            prefetch = PACKED_PREFETCH[kernels[tuple(weight.shape)]]
            layer.kernel = functools.partial(linear_packed, out_features=weight.shape[0], prefetch=prefetch)
            if id(weight) in tables:  # tied: the embedding reads its rows out of the packed table
                tables[id(weight)].weight, tables[id(weight)].kernel = layer.weight, embed_packed
            del weight
        release_freed_memory()

    def choose(self, weights: dict[tuple, torch.Tensor]) -> dict[tuple, str]:
        """The kernel of each shape (out, in): the fastest of F.linear and the packed kernel with each prefetch of
        PACKED_PREFETCH, timed on copies of one weight of that shape read from memory (autotune.from_memory, freed
        after); says what it chose when it had to time anything."""
        self.choices = choices = KernelChoices(build_name())
        kernels = {}
        for shape, weight in weights.items():

            def candidates(weight=weight, out=shape[0]):
                x = torch.randn(max(self.ROWS), weight.shape[1])
                packed = from_memory(pack_weight(weight), empty_pages)
                plain = from_memory(weight.detach())
                return {
                    name: lambda n, prefetch=prefetch: linear_packed(
                        x[:n], packed(), out_features=out, prefetch=prefetch
                    )
                    for name, prefetch in PACKED_PREFETCH.items()
                } | {"torch": lambda n: F.linear(x[:n], plain())}

            kernels[shape] = choices.choose("linear", shape, self.ROWS, candidates, weight.nbytes)
        if choices.timed:
            print(f"minillm: linear kernels timed on {cpu_model()}, cached in {choices.path}:", file=sys.stderr)
            print(choices.summary(), file=sys.stderr)
        return kernels
