"""Turning next-token logits into tokens, one row per sequence, each row with its own sampling parameters."""
import torch


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf every token outside the top_k most likely (0 = keep all) and outside the smallest set
    whose probability reaches top_p (1 = keep all). logits [B, V]; top_k, top_p [B]."""
    # BEGIN EXERCISE 06.1: top-k / top-p — sort each row, drop ranks past k and tokens past cumulative probability p
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    k = torch.where(top_k > 0, top_k, logits.shape[-1])
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above this one
    drop = (rank >= k[:, None]) | (before >= top_p[:, None])
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    # END EXERCISE


def sample(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """Pick one token per row of logits [B, V]: argmax where temperature is 0, otherwise a draw from the
    tempered, truncated distribution. The draw is argmax(p / E) with E ~ Exponential(1) noise, which picks
    token i with probability p_i; each row takes its noise from its own generator (seeded requests) or the
    global one, so a seeded request draws the same tokens whatever else is in the batch."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    t = torch.where(temperatures > 0, temperatures, 1.0)[:, None]
    probs = apply_top_k_top_p(logits / t, top_k, top_p).softmax(dim=-1)
    noise = torch.stack([torch.empty_like(row).exponential_(generator=g) for row, g in zip(probs, generators)])
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(temperatures > 0, drawn, greedy)
