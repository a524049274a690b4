"""What quantization costs in quality, measured against the float model on the same text: held-out perplexity
and how often the two agree on the next token.

The text is fixed and ships with the course: for the default story model, held-out stories (another seed than
its training corpus); for any other model, the opening of Lewis Carroll's *Alice's Adventures in Wonderland*
(public domain, minillm/data/eval_text.txt). Every position is scored teacher-forced, the text cut in windows of
`window` tokens that each start fresh, so the same tokens are scored the same way by every engine.
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.config import default_model_path
from minillm.data import HELDOUT_SEED, generate_corpus

EVAL_TEXT = Path(__file__).parents[1] / "data" / "eval_text.txt"


def eval_tokens(tokenizer, model_path: Path, max_tokens: int = 1024) -> list[int]:
    """The fixed evaluation text for the model at model_path, as its tokenizer's ids (at most max_tokens)."""
    default = Path(model_path).resolve() == default_model_path().resolve()
    text = "\n\n".join(generate_corpus(40, HELDOUT_SEED)) if default else EVAL_TEXT.read_text()
    return tokenizer.encode(text)[:max_tokens]


@torch.inference_mode()
def window_logits(llm, ids: list[int], window: int = 256) -> torch.Tensor:
    """The model's next-token logits at every position, [len(ids), vocab] in float32, window by window (each a
    fresh forward pass over its tokens alone)."""
    model, device = llm.model_runner.model, llm.model_runner.device
    parts = []
    for start in range(0, len(ids), window):
        chunk = torch.tensor(ids[start : start + window], device=device)
        parts.append(model.compute_logits(model(chunk, torch.arange(len(chunk), device=device))).float().cpu())
    return torch.cat(parts)


def scored(ids: list[int], window: int) -> torch.Tensor:
    """Which positions' predictions are scored: all but the last of each window (its next token is the next
    window's first, which that window does not see)."""
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[window - 1 :: window] = False
    keep[-1] = False
    return keep


def quality(llm, reference=None, ids: list[int] | None = None, window: int = 256) -> dict:
    """llm's perplexity on the evaluation text; with a reference engine (the float model), its perplexity too,
    the relative change, the share of positions where both predict the same next token (greedy agreement), and
    the mean KL divergence of llm's next-token distribution from the reference's."""
    ids = eval_tokens(llm.tokenizer, llm.model_path) if ids is None else ids
    keep, targets = scored(ids, window), torch.tensor(ids[1:] + [0])
    logits = window_logits(llm, ids, window)
    result = dict(tokens=int(keep.sum()), perplexity=F.cross_entropy(logits[keep], targets[keep]).exp().item())
    if reference is not None:
        base = window_logits(reference, ids, window)
        ppl = F.cross_entropy(base[keep], targets[keep]).exp().item()
        kl = F.kl_div(logits[keep].log_softmax(-1), base[keep].log_softmax(-1), log_target=True, reduction="batchmean")
        result |= dict(
            reference_perplexity=ppl,
            perplexity_change=result["perplexity"] / ppl - 1,
            greedy_agreement=(logits[keep].argmax(-1) == base[keep].argmax(-1)).float().mean().item(),
            kl_divergence=kl.item(),
        )
    return result
