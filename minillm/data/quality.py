"""Measure a story model: prompt it with openings of held-out stories and run its sentences through the checker.

The model is any Hugging Face causal LM (we use transformers' own `generate`, with its KV cache, as the
reference sampler). Two figures matter: the share of generated sentences the grammar accepts (does it speak
the language?) and the share of stories that keep their cast (does it remember who the story is about?).
"""

import torch

from minillm.data.checker import keeps_its_cast, sentence_validity
from minillm.data.stories import heldout_openings


@torch.no_grad()
def continue_stories(
    model,
    tokenizer,
    prompts: list[str],
    temperature: float = 0.8,
    seed: int = 0,
    max_new_tokens: int = 320,
    batch_size: int = 200,
    top_p: float = 1.0,
) -> list[str]:
    """The text each prompt is continued with (sampled at `temperature` and `top_p`, greedy when temperature is 0),
    in batches."""
    torch.manual_seed(seed)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # batched generation: prompts end in one column
    if temperature > 0:  # plain temperature sampling: switch off transformers' default top-k of 50
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=top_p)
    else:
        sampling = dict(do_sample=False)
    texts = []
    for i in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
        width = batch["input_ids"].shape[1]
        limit = min(width + max_new_tokens, model.config.max_position_embeddings)
        out = model.generate(
            **batch,
            max_length=limit,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
        texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    tokenizer.padding_side = side
    return texts


def evaluate_model(
    model,
    tokenizer,
    n_stories: int = 200,
    temperature: float = 0.8,
    seed: int = 0,
    n_greedy: int = 20,
    cast_top_p: float = 0.95,
) -> dict:
    """The quality figures, all from held-out openings: sentence validity of `n_stories` continuations sampled
    at `temperature` (no top-p) and of `n_greedy` greedy ones, and the share of `n_stories` continuations sampled
    at `temperature` and top-p `cast_top_p` (how stories are usually sampled) that keep their cast.

    A continuation that does not reach <eos> within the token budget ends in a cut-off sentence, which
    counts as invalid, so rambling is penalised too."""
    prompts = heldout_openings(n_stories)
    sampled = continue_stories(model, tokenizer, prompts, temperature, seed)
    valid, total = map(sum, zip(*(sentence_validity(t) for t in sampled)))
    greedy = continue_stories(model, tokenizer, prompts[:n_greedy], temperature=0)
    g_valid, g_total = map(sum, zip(*(sentence_validity(t) for t in greedy)))
    nucleus = continue_stories(model, tokenizer, prompts, temperature, seed, top_p=cast_top_p)
    kept = [keeps_its_cast(p + t) for p, t in zip(prompts, nucleus)]
    return {
        "valid": valid,
        "total": total,
        "validity": valid / total,
        "cast_kept": sum(kept) / len(kept),
        "cast_top_p": cast_top_p,
        "cast_kept_unfiltered": sum(keeps_its_cast(p + t) for p, t in zip(prompts, sampled)) / len(sampled),
        "greedy_valid": g_valid,
        "greedy_total": g_total,
        "greedy_validity": g_valid / g_total,
        "sampled": sampled,
        "greedy": greedy,
        "nucleus": nucleus,
        "kept": kept,
        "prompts": prompts,
    }
