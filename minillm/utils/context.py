"""One forward step's batch as the layers read it: set by the model runner around a forward pass.

A model's forward takes only token ids and positions; how those tokens are grouped into sequences and
where their keys and values live in the KV cache travels here instead, as in vLLM and nano-vllm. The
tensors are views of the model runner's input buffers (minillm.engine.input_batch builds every Context the
engine runs); the host-side lists (`*_cpu`) let a layer loop over sequences without asking the device.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class Context:
    is_prefill: bool = False
    input_ids: torch.Tensor | None = None  # [num_tokens] the step's new tokens
    positions: torch.Tensor | None = None  # [num_tokens] their positions in their sequences
    slot_mapping: torch.Tensor | None = None  # [num_tokens] cache slot that each new token's K/V goes to
    context_lens: torch.Tensor | None = None  # [num_seqs] tokens in the cache per sequence (decode)
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks] cache blocks per sequence, -1 padded
    logits_indices: torch.Tensor | None = None  # [num_sampled] prefill rows whose hidden state gives a next token
    cu_seqlens_q_cpu: list[int] = field(default_factory=list)  # [num_seqs + 1] offsets of each sequence's new
    cu_seqlens_k_cpu: list[int] = field(default_factory=list)  # tokens, and of its whole context (prefill)
    context_lens_cpu: list[int] = field(default_factory=list)
    attn_layers: list = field(default_factory=list)  # the model's Attention layers, by layer_id (see attention_op)
    num_decodes: int = 0  # a mixed step: its first rows are this many sequences of one new token each
    decode_rows: "Context | None" = None  # a mixed step's first num_decodes rows, as a decode step
    prefill_rows: "Context | None" = None  # and the rest, as a prefill step


_CONTEXT: Context | None = None


def get_context() -> Context | None:
    return _CONTEXT


def set_context(context: Context | None) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    set_context(None)
