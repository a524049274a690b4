"""The layouts minillm's C++ matmuls (minillm.kernels.cpu) read their weights in, made once at load: a float32
weight in panels of output features (pack_weight), an int8 weight in groups of four rows (pack_int8). BLAS would
repack a weight on every call; here it is done once, and the plain copy freed."""

import functools
import itertools

import torch

from minillm.kernels.cpu import empty_pages
from minillm.quantization.formats import BLOCK


@functools.cache
def panel_width() -> int:
    """Output features per panel of a packed weight: the kernel's NR, two vectors of the instruction set it was
    built for (16 floats with AVX2, 32 with AVX-512). Call `cpu_kernels()` first."""
    return torch.ops.minillm_cpu.panel_width()


def pack_weight(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A linear layer's weight [out, in] as the matmul kernel reads it: [panels, in, P] with P = panel_width(),
    where panel p holds output features p·P .. p·P + P - 1 and, for each input feature, their P weights side by
    side (so a step over the inputs loads two whole vectors). Zero rows pad `out` to a multiple of P. Written
    into `out` when given (a view of pack_weights' mapping), else into memory of its own backed by 2 MiB pages
    where the OS allows: a decode step streams every weight, and 4 KiB pages would cost a TLB miss every 4 KiB."""
    rows, inputs = weight.shape
    panel = panel_width()
    out = empty_packed(rows, inputs) if out is None else out
    full = rows - rows % panel  # whole panels straight from the weight, then the last one padded with zeros
    out[: full // panel].copy_(weight[:full].detach().view(-1, panel, inputs).transpose(1, 2))
    if full < rows:
        out[-1].zero_()[:, : rows - full].copy_(weight[full:].detach().T)
    return out


def pack_weights(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """pack_weight of each weight, all in one mapping backed by 2 MiB pages: a mapping per weight would round
    each up to a whole 2 MiB page (120 MB lost on SmolLM2-135M's 211 matrices)."""
    panel = panel_width()
    shapes = [(-(-w.shape[0] // panel), w.shape[1], panel) for w in weights]
    arena = empty_pages([sum(a * b * c for a, b, c in shapes)])
    offsets = itertools.accumulate((a * b * c for a, b, c in shapes), initial=0)
    return [pack_weight(w, arena[o : o + a * b * c].view(a, b, c)) for w, o, (a, b, c) in zip(weights, offsets, shapes)]


def empty_packed(out: int, inputs: int) -> torch.Tensor:
    """An uninitialised packed weight for `out` output features of `inputs` inputs, [ceil(out / P), inputs, P]
    (P = panel_width()), in a mapping of its own that the OS is asked to back by 2 MiB pages."""
    panel = panel_width()
    return empty_pages([-(-out // panel), inputs, panel])


def embed_packed(input_ids: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """Embedding lookup (row t of the table for id t) read from the table's packed layout: with tied embeddings
    the LM head's packed weight is the only copy of the table. Row t is column t % P of panel t // P."""
    panel = packed.shape[2]
    return packed[input_ids // panel, :, input_ids % panel]


GROUP = 4  # int8 rows the kernel reads together (quant_linear_cpu.cpp's GROUP)


def packed_int8_shape(out: int, inputs: int) -> tuple[int, int, int, int]:
    """The shape pack_int8 gives an int8 weight [out, inputs]: [ceil(out / 4), inputs / 32, 4, 32]."""
    return -(-out // GROUP), inputs // BLOCK, GROUP, BLOCK


def pack_int8(q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """An int8 weight [out, in] as the kernel reads it: its rows in groups of four, block by block, so that element
    [g, b, j] is block b (32 values) of row 4·g + j. A group's bytes are one run, as a row's were, and a decode step
    loads each block of x once for four rows. Zero rows pad `out` to a multiple of 4. Written into `out` when given
    (a view of the method's weight mapping)."""
    rows, inputs = q.shape
    shape = packed_int8_shape(rows, inputs)
    padded = torch.zeros(shape[0] * GROUP, inputs, dtype=q.dtype) if rows % GROUP else q
    if padded is not q:
        padded[:rows] = q
    grouped = padded.view(shape[0], GROUP, shape[1], BLOCK).transpose(1, 2)
    return grouped.contiguous() if out is None else out.copy_(grouped)


def packed_int8_rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [n] of the int8 weight that pack_int8 packed, as [n, in]: a tied embedding looks its rows up here."""
    return packed[ids // GROUP, :, ids % GROUP].flatten(1)
