"""A step's batch in its two forms: `StepInputs`, the plain host-side lists the model runner prepares (and rank 0
sends to the other tensor-parallel ranks), and the step `Context` the layers read, whose tensors are views of
`InputBuffers`: input tensors allocated once at their largest, so that a replayed decode step (chapter 07) finds
each step's tokens, positions, slots and block tables at the addresses it was recorded with."""

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from minillm.config import Config
from minillm.layers.attention.paged_attention import slot_mapping_for
from minillm.utils.context import Context


@dataclass
class StepInputs:
    """One step's batch as plain host-side lists: small, and the same for any device."""

    is_prefill: bool
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]] | None = None  # per sequence; None for a prefill with nothing cached
    cu_seqlens_q: list[int] | None = None  # prefill
    cu_seqlens_k: list[int] | None = None
    logits_indices: list[int] | None = None
    context_lens: list[int] | None = None  # decode, and the decode rows of a mixed step
    num_decodes: int = 0  # a prefill whose first rows are this many sequences of one new token (a mixed step)
    blocks_to_copy: list[tuple[int, int]] | None = None  # copy-on-write (chapter 16): before the step writes


def decode_rows(config: Config) -> int:
    """The most rows a decode step has: one per sequence; with speculative decoding (chapter 13) one per draft it
    verifies too, rounded up to a whole bucket (1, 2, 4, 8, then multiples of 16), so that every verify step has
    a bucket to replay in (at batch 1 and k = 4, five rows: the bucket of 8)."""
    seqs, spec = config.max_num_seqs, config.speculative_config
    if not spec:
        return seqs
    rows = seqs * (1 + spec["num_speculative_tokens"])
    rows = next((b for b in (1, 2, 4, 8) if b >= rows), -(-rows // 16) * 16)
    return min(max(config.max_num_batched_tokens, seqs), rows)


def rows_step_inputs(rows: list[tuple[list[int], int, list[int], bool]], block_size: int) -> StepInputs:
    """A step of rows (token_ids, start, block_table, samples), as a draft model runs them (chapter 13): each runs its
    tokens at positions start.. over the keys and values before them in its blocks, and a row that samples gives
    the logits of its last token. Rows of one token that all sample are a decode step (replayed per bucket)."""
    tables = [table for _, _, table, _ in rows]
    if all(len(ids) == 1 and samples for ids, _, _, samples in rows):
        starts = [start for _, start, _, _ in rows]
        slots = [slot_mapping_for(table, start, start + 1, block_size)[0] for _, start, table, _ in rows]
        first = [ids[0] for ids, _, _, _ in rows]
        return StepInputs(False, first, starts, slots, tables, context_lens=[start + 1 for start in starts])
    input_ids, positions, slot_mapping, cu_q, cu_k, logits_indices = [], [], [], [0], [0], []
    for ids, start, table, samples in rows:
        end = start + len(ids)
        input_ids += ids
        positions += range(start, end)
        slot_mapping += slot_mapping_for(table, start, end, block_size)
        cu_q.append(cu_q[-1] + len(ids))
        cu_k.append(cu_k[-1] + end)
        logits_indices += [cu_q[-1] - 1] if samples else []
    tables = tables if cu_k[-1] > cu_q[-1] else None  # None: no keys come from the cache
    return StepInputs(True, input_ids, positions, slot_mapping, tables, cu_q, cu_k, logits_indices)


class InputBuffers:
    """The step's input tensors at their largest (a step's tokens, its sequences, a sequence's blocks)."""

    def __init__(self, config: Config, block_size: int, device: torch.device):
        tokens = max(config.max_num_batched_tokens, config.max_num_seqs)  # a decode step has one token per sequence
        rows = self.decode_rows = decode_rows(config)
        buf = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping = buf(tokens), buf(tokens), buf(tokens)
        self.context_lens, self.logits_indices = buf(rows), buf(rows)
        self.block_tables = buf(rows, -(-config.max_model_len // block_size))

    def load(self, s: StepInputs, attn_layers: list, bucket: int | None = None) -> Context:
        """Write a step into the buffers' first rows and return its Context: the one place a step's Context is
        built. With a `bucket` (a decode step replayed in a prepared step of that many rows) its tensors are the
        bucket's first rows, the block tables every column (the width a replay was recorded at); the graph runner
        pads the rows past the batch."""
        fill = lambda buffer, values: fill_rows(buffer, values, bucket)
        ctx = Context(
            is_prefill=s.is_prefill,
            input_ids=fill(self.input_ids, s.input_ids),
            positions=fill(self.positions, s.positions),
            slot_mapping=fill(self.slot_mapping, s.slot_mapping),
            attn_layers=attn_layers,
        )
        if s.block_tables is not None:
            ctx.block_tables = self.load_block_tables(s.block_tables, bucket)
        if s.context_lens is not None:
            ctx.context_lens, ctx.context_lens_cpu = fill(self.context_lens, s.context_lens), s.context_lens
        if s.is_prefill:
            ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu = s.cu_seqlens_q, s.cu_seqlens_k
            ctx.logits_indices = fill(self.logits_indices, s.logits_indices)
        if s.num_decodes:
            ctx.num_decodes = s.num_decodes
            ctx.decode_rows, ctx.prefill_rows = split_mixed(ctx)
        return ctx

    def load_block_tables(self, tables: list[list[int]], bucket: int | None) -> torch.Tensor:
        """[num_seqs, max_blocks] block ids, padded with -1 (read into numpy in one pass: at batch 64 this took
        0.4 ms a step through torch.tensor on the nested lists, and 0.1 ms so); every column for a bucket."""
        width = max(map(len, tables), default=1)
        rows = itertools.chain.from_iterable(table + [-1] * (width - len(table)) for table in tables)
        self.block_tables[: len(tables), :width].copy_(
            torch.from_numpy(np.fromiter(rows, np.int64, len(tables) * width)).view(len(tables), width)
        )
        return self.block_tables[:bucket] if bucket is not None else self.block_tables[: len(tables), :width]


def split_mixed(ctx: Context) -> tuple[Context, Context]:
    """A mixed step's two parts over the same buffers: its first num_decodes rows (one new token each, whose keys
    and values before it are in the cache) as a decode step, and the prompt chunks after them as a prefill."""
    n, cu_q, cu_k = ctx.num_decodes, ctx.cu_seqlens_q_cpu, ctx.cu_seqlens_k_cpu
    decode = Context(
        slot_mapping=ctx.slot_mapping[:n],
        block_tables=ctx.block_tables[:n],
        context_lens=ctx.context_lens,
        context_lens_cpu=ctx.context_lens_cpu,
        attn_layers=ctx.attn_layers,
    )
    cu_q, cu_k = [c - cu_q[n] for c in cu_q[n:]], [c - cu_k[n] for c in cu_k[n:]]
    prefill = Context(
        is_prefill=True,
        slot_mapping=ctx.slot_mapping[n:],
        block_tables=ctx.block_tables[n:] if cu_k[-1] > cu_q[-1] else None,  # as prepare_prefill decides
        cu_seqlens_q_cpu=cu_q,
        cu_seqlens_k_cpu=cu_k,
        attn_layers=ctx.attn_layers,
    )
    return decode, prefill


def fill_rows(buffer: torch.Tensor, values: list[int], rows: int | None = None) -> torch.Tensor:
    """Copy host values into the first rows of an input buffer; returns its first `rows` rows (len(values) by
    default). The values go through numpy, which turns a list of Python ints into an array several times faster
    than torch.tensor."""
    buffer[: len(values)].copy_(torch.from_numpy(np.array(values, dtype=np.int64)), non_blocking=True)
    return buffer[: len(values) if rows is None else rows]
