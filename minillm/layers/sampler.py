"""Turning next-token logits into tokens, one row per sequence, each row with its own sampling parameters."""

from dataclasses import dataclass, field

import torch
from torch import nn

from minillm.layers.logits_processors import LogitsProcessors
from minillm.sampling_params import SamplingParams
from minillm.utils.compile import hot


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf every token of a row outside its top-k, then outside the top-p nucleus of what is left.

    logits [B, V] (float); top_k [B] (long, 0 = keep all V); top_p [B] (float in (0, 1], 1 = keep all).
    Returns a new [B, V] tensor: kept tokens keep their logit exactly, dropped ones are -inf; `logits` is
    not modified. Top-k first: keep the k largest logits of the row. Top-p then works on the distribution
    renormalised over those k (softmax of the survivors, as vLLM and transformers do): going down the
    ranks, keep a token while the probability of the tokens ranked above it is below p. So the most likely
    token always survives, and the kept set is the smallest whose probability reaches p. A row with
    top_p = 1 keeps all its top-k survivors, even where the float32 running sum reaches 1.0 before the
    last of them (it does on a peaked row of a large vocabulary). Ties may be broken in any order.

    Example: one row with probabilities [0.30, 0.25, 0.20, 0.15, 0.10], top_k=3, top_p=0.6. Top-k keeps
    ranks 0-2; renormalised they are [0.40, 0.33, 0.27]; the probability above each is [0, 0.40, 0.73], so
    top-p keeps ranks 0 and 1 → [l0, l1, -inf, -inf, -inf]. (On the full distribution, [0, 0.30, 0.55]
    would have kept three: the order matters.)
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 06.1: top-k / top-p — sort each row, drop ranks past k, then tokens past cumulative probability p
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    k = torch.where(top_k > 0, top_k, logits.shape[-1])
    sorted_logits = sorted_logits.masked_fill(rank >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)  # renormalised over the top-k survivors
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above this one
    # top_p = 1 keeps all: in float32 the running sum can reach 1.0 before the tail of a long row
    sorted_logits = sorted_logits.masked_fill((before >= top_p[:, None]) & (top_p[:, None] < 1), float("-inf"))
    return logits.scatter(-1, order, sorted_logits)
    # END EXERCISE


@dataclass
class SamplingMetadata:
    """One step's sampling settings, a row per sequence, made on the host once so that the sampler can skip
    what no row asks for without asking the device: an all-greedy batch is one argmax."""

    temperatures: torch.Tensor  # [B]; 0 = greedy
    all_greedy: bool
    truncated_rows: torch.Tensor | None = None  # rows with top_k > 0 or top_p < 1; None if there are none
    top_k: torch.Tensor | None = None  # [len(truncated_rows)]
    top_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> a seeded request's generator
    min_p: torch.Tensor | None = None  # [B]; None if no row asks for it (chapter 16)
    processors: LogitsProcessors | None = None  # penalties, logit bias, bans (chapter 16); None if no row has any

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        device: torch.device | str = "cpu",
        processors: LogitsProcessors | None = None,
    ) -> "SamplingMetadata":
        rows = [i for i, p in enumerate(params) if p.temperature > 0 and (p.top_k > 0 or p.top_p < 1)]
        tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)
        return cls(
            temperatures=tensor([p.temperature for p in params], torch.float),
            all_greedy=all(p.temperature == 0 for p in params),
            truncated_rows=tensor(rows, torch.long) if rows else None,
            top_k=tensor([params[i].top_k for i in rows], torch.long) if rows else None,
            top_p=tensor([params[i].top_p for i in rows], torch.float) if rows else None,
            generators={i: g for i, g in enumerate(generators) if g is not None and params[i].temperature > 0},
            min_p=tensor([p.min_p for p in params], torch.float) if any(p.min_p for p in params) else None,
            processors=processors,
        )


def sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Pick one token per row of logits [B, V]: argmax where temperature is 0, otherwise a draw from the
    tempered, truncated distribution (`draw`). Rows with logits processors (penalties, bias, bans) are processed
    first, greedy ones too."""
    if md.processors is not None:
        logits = md.processors.apply(logits)
    greedy = logits.argmax(dim=-1)
    if md.all_greedy:
        return greedy
    return draw(probabilities(logits, md), md, greedy)


def draw(probs: torch.Tensor, md: SamplingMetadata, greedy: torch.Tensor) -> torch.Tensor:
    """A token per row of probs [B, V] where the row's temperature is above 0, else the row's greedy token. The
    draw is argmax(p / E) with E ~ Exponential(1) noise, which picks token i with probability p_i. Unseeded rows
    share one batched draw; a seeded row redraws its noise from its own generator, so it gets the same tokens
    whatever else is in the batch."""
    noise = torch.empty_like(probs).exponential_()
    for row, generator in md.generators.items():
        noise[row].exponential_(generator=generator)
    drawn = (probs / noise.clamp_min_(1e-10)).argmax(dim=-1)  # a zero draw would divide to inf or NaN
    return torch.where(md.temperatures > 0, drawn, greedy)


def probabilities(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Each row's distribution to draw from: softmax of the logits over the row's temperature (1 for greedy rows),
    after min-p (drop tokens less likely than min_p times the likeliest) and top-k/top-p truncation; float32 [B, V]."""
    logits = logits.float() / torch.where(md.temperatures > 0, md.temperatures, 1.0)[:, None]
    if md.min_p is not None:  # p < min_p * p_max  <=>  logit < max_logit + log(min_p); min_p = 0 drops nothing
        floor = logits.max(dim=-1, keepdim=True).values + md.min_p.log()[:, None]
        logits = logits.masked_fill(logits < floor, float("-inf"))
    if md.truncated_rows is not None:
        logits[md.truncated_rows] = hot(apply_top_k_top_p)(logits[md.truncated_rows], md.top_k, md.top_p)
    return logits.softmax(dim=-1)


class Sampler(nn.Module):
    """The sampling step of the model runner (a module, so a compiler can take it whole in chapter 08)."""

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        return sample(logits, md)
