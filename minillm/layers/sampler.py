"""Turning next-token logits into a token: greedy argmax, or a draw from the tempered, truncated distribution."""
import torch


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> int:
    """Pick the next token from logits [vocab_size].

    temperature 0 is greedy. Otherwise the logits are divided by the temperature, cut to the top_k most likely
    tokens (0 = all) and to the smallest set whose probability reaches top_p, renormalised, and sampled.
    """
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        probs, order = logits.softmax(-1).sort(descending=True)
        # drop a token when the tokens more likely than it already reach top_p
        drop = probs.cumsum(-1) - probs >= top_p
        logits[order[drop]] = float("-inf")
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
