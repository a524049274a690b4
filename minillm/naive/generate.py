"""The baseline generators: recompute everything per token (chapter 03), or keep a contiguous KV cache (04)."""

from collections.abc import Callable, Iterator

import torch

from minillm.engine.kv_cache import temporary_kv_cache
from minillm.layers.sampler import SamplingMetadata, sample
from minillm.sampling_params import SamplingParams
from minillm.utils.context import Context, reset_context, set_context


def sample_loop(
    next_logits: Callable[[list[int]], torch.Tensor],
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_ids: list[int] = (),
) -> Iterator[int]:
    """Yield up to max_new_tokens tokens, each sampled from next_logits(all ids so far); stop after an EOS."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    md = SamplingMetadata.build([SamplingParams(temperature, top_k, top_p)], [generator])
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        token = int(sample(next_logits(ids).cpu()[None], md)[0])
        yield token
        if token in eos_token_ids:
            return
        ids.append(token)


@torch.inference_mode()
def generate_naive(model, prompt_ids: list[int], max_new_tokens: int, **sampling) -> Iterator[int]:
    """Every step runs the whole sequence through the model again: step n costs O(n) matmuls and O(n²)
    attention. Chapter 04's KV cache removes exactly this waste."""
    device = model.lm_head.weight.device

    def next_logits(ids):
        x = torch.tensor(ids, device=device)
        return model.compute_logits(model(x, torch.arange(len(ids), device=device))[-1])

    yield from sample_loop(next_logits, prompt_ids, max_new_tokens, **sampling)


@torch.inference_mode()
def generate_cached(model, prompt_ids: list[int], max_new_tokens: int, **sampling) -> Iterator[int]:
    """Prefill the prompt once, then feed one token per step, reading earlier keys/values from a cache.

    The cache is contiguous: max_len = prompt + max_new_tokens slots reserved up front, and token t's K/V
    goes to slot t. (It is a paged cache with a single block of max_len slots.) The model may be an engine's:
    its own cache is put back afterwards.
    """
    device = model.lm_head.weight.device
    max_len = len(prompt_ids) + max_new_tokens
    block_tables = torch.zeros(1, 1, dtype=torch.long, device=device)

    def next_logits(ids):
        n = len(ids)
        if n == len(prompt_ids):  # prefill: every prompt token, slots 0..n-1
            set_context(
                Context(
                    is_prefill=True,
                    cu_seqlens_q_cpu=[0, n],
                    cu_seqlens_k_cpu=[0, n],
                    slot_mapping=torch.arange(n, device=device),
                )
            )
            x, pos = torch.tensor(ids, device=device), torch.arange(n, device=device)
        else:  # decode: only the newest token, at position and slot n-1
            set_context(
                Context(
                    slot_mapping=torch.tensor([n - 1], device=device),
                    block_tables=block_tables,
                    context_lens=torch.tensor([n], device=device),
                    context_lens_cpu=[n],
                )
            )
            x, pos = torch.tensor(ids[-1:], device=device), torch.tensor([n - 1], device=device)
        return model.compute_logits(model(x, pos)[-1])

    with temporary_kv_cache(model, num_blocks=1, block_size=max_len):
        try:
            yield from sample_loop(next_logits, prompt_ids, max_new_tokens, **sampling)
        finally:
            reset_context()
