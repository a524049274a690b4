"""How the linear layers multiply: the linear method, chosen once per engine by the platform (vLLM's
LinearMethodBase; the quantized ones are in minillm.quantization.methods). After loading, a method puts the weights in the layout its
kernel reads (one copy of each: the plain one is freed) and sets each layer's `kernel`."""

import functools

import torch
from torch import nn

from minillm.layers.cpu_kernels import embed_packed, linear_packed, pack_weights, release_freed_memory
from minillm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minillm.layers.linear import LinearBase


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
    """minillm's C++ matmuls (minillm.layers.cpu_kernels) on float32 CPU weights packed once at load, which BLAS
    would repack on every call: a matrix-vector product for one or two rows that streams them at the memory's
    speed, a register-tiled product for more. Row-parallel shards included: under tensor parallelism each rank
    packs its own shard and its partial product runs the same kernel (row_parallel_linear's `linear`)."""

    name = "packed"

    def process_weights_after_loading(self, model: nn.Module) -> None:
        """Every float32 weight a linear layer or the LM head multiplies by is replaced by its packed layout, the
        tied embedding table included, which then looks rows up in it (unless the table is split across ranks)."""
        tables = {id(m.weight): m for m in model.modules() if type(m) is VocabParallelEmbedding}
        layers = [
            m
            for m in model.modules()
            if isinstance(m, (LinearBase, ParallelLMHead))
            and m.weight.is_cpu
            and m.weight.dtype == torch.float32
            and (id(m.weight) not in tables or tables[id(m.weight)].tp_size == 1)
        ]
        for layer, packed in zip(layers, pack_weights([m.weight for m in layers])):
            weight, layer.weight = layer.weight, nn.Parameter(packed, requires_grad=False)
            layer.kernel = functools.partial(linear_packed, out_features=weight.shape[0])
            if id(weight) in tables:  # tied: the embedding reads its rows out of the packed table
                tables[id(weight)].weight, tables[id(weight)].kernel = layer.weight, embed_packed
        del weight
        release_freed_memory()
