"""The attention metadata of one forward step, set by whoever prepares the batch and read by every layer.

A model's forward takes only token ids and positions; how those tokens are grouped into sequences and
where their keys and values live in the KV cache travels here instead, as in vLLM and nano-vllm. The
host-side copies (`*_cpu`) let a layer loop over sequences without asking the device.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class Context:
    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None  # [num_seqs + 1] offsets of each sequence's new tokens
    cu_seqlens_k: torch.Tensor | None = None  # [num_seqs + 1] offsets of each sequence's whole context
    slot_mapping: torch.Tensor | None = None  # [num_tokens] cache slot that each new token's K/V goes to
    context_lens: torch.Tensor | None = None  # [num_seqs] tokens in the cache per sequence (decode)
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks] cache blocks per sequence, -1 padded
    logits_indices: torch.Tensor | None = None  # [num_sampled] prefill rows whose hidden state gives a next token
    cu_seqlens_q_cpu: list[int] = field(default_factory=list)  # cu_seqlens_q and _k as Python ints
    cu_seqlens_k_cpu: list[int] = field(default_factory=list)
    context_lens_cpu: list[int] = field(default_factory=list)


_CONTEXT: Context | None = None


def get_context() -> Context | None:
    return _CONTEXT


def set_context(context: Context | None) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    set_context(None)
