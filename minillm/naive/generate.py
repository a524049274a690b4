"""The simplest generator: run the whole sequence through the model again for every new token."""
from collections.abc import Iterator

import torch

from minillm.layers.sampler import sample


@torch.inference_mode()
def generate_naive(model, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                   top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                   eos_token_ids: list[int] = ()) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids, stopping after an EOS token.

    Each step recomputes every position from scratch, so step n costs O(n) matmuls and O(n²) attention:
    chapter 04's KV cache removes exactly this waste.
    """
    device = model.lm_head.weight.device
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    for _ in range(max_new_tokens):
        hidden = model(ids, torch.arange(len(ids), device=device))
        token = sample(model.compute_logits(hidden[-1]), temperature, top_k, top_p, generator)
        yield token
        if token in eos_token_ids:
            return
        ids = torch.cat([ids, ids.new_tensor([token])])
