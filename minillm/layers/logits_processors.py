"""Logits processors (chapter 16; vLLM V1's vllm/v1/sample/ops/penalties.py and logits_processor/): what a request
asks to change in its logits before a token is picked. Repetition, frequency and presence penalties; a bias per
token; no end before min_tokens; bad words. Batched as vLLM does: a step builds, for the rows that ask for any, a
[rows, V] table of how often each token was generated and which the prompt holds, and every rule is one tensor
operation over those rows, never a Python loop over the vocabulary."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from minillm.engine.sequence import Sequence


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Penalise the tokens a row has seen, as vLLM (and OpenAI, for presence and frequency) define it.

    logits [R, V] float; prompt_mask [R, V] bool (the token is in the row's prompt); output_counts [R, V] (how many
    times the row generated it); presence, frequency, repetition [R] float (0, 0 and 1 change nothing). Returns a
    new [R, V] tensor; `logits` is not modified. In this order:
    1. repetition (Keskar et al. 2019, CTRL): every token seen, in the prompt or the output, has its logit divided
       by r where it is positive and multiplied by r where it is not (r > 1 makes it less likely either way);
    2. frequency: minus frequency x count (each repetition costs more);
    3. presence: minus presence where count > 0 (once generated, a flat cost).

    Example: logits [[2.0, -1.0, 0.5]], prompt_mask [[True, False, False]], output_counts [[0, 2, 1]], presence
    [0.5], frequency [0.25], repetition [2.0]: repetition gives [1.0, -2.0, 0.25] (all three were seen); frequency
    [1.0, -2.5, 0.0]; presence [1.0, -3.0, -0.5].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 16.2: penalties — repetition on every token seen, then frequency x count, then presence
    seen = prompt_mask | (output_counts > 0)
    r = repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - frequency[:, None] * output_counts
    return logits - presence[:, None] * (output_counts > 0)
    # END EXERCISE


@dataclass
class LogitsProcessors:
    """One step's logits processors, for the rows of the batch that ask for any (most steps have none: None)."""

    rows: torch.Tensor  # [R] the batch rows they apply to
    prompt_mask: torch.Tensor  # [R, V] bool
    output_counts: torch.Tensor  # [R, V] float
    presence: torch.Tensor  # [R]
    frequency: torch.Tensor
    repetition: torch.Tensor
    bias: torch.Tensor | None  # [R, V] added to the logits (logit_bias), or None
    banned: torch.Tensor | None  # [R, V] bool: -inf (an end before min_tokens, the last token of a bad word)

    @classmethod
    def build(
        cls, seqs: "list[Sequence]", vocab_size: int, eos_token_ids, device: torch.device | str = "cpu"
    ) -> "LogitsProcessors | None":
        """From the sequences that sample this step, one row each (their sampling params and tokens so far)."""
        rows = [i for i, seq in enumerate(seqs) if seq.sampling_params.needs_penalties]
        if not rows:
            return None
        picked = [seqs[i] for i in rows]
        params = [seq.sampling_params for seq in picked]
        tensor = lambda values: torch.tensor(values, dtype=torch.float, device=device)
        bias = banned = None
        if any(p.logit_bias for p in params):
            bias = torch.zeros(len(rows), vocab_size, device=device)
            for r, p in enumerate(params):
                for token, value in (p.logit_bias or {}).items():
                    bias[r, token] = value
        bans = [(r, t) for r, seq in enumerate(picked) for t in banned_tokens(seq, eos_token_ids)]
        if bans:
            banned = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
            banned[tuple(torch.tensor(bans, device=device).T)] = True
        return cls(
            rows=torch.tensor(rows, device=device),
            prompt_mask=token_table([seq.token_ids[: seq.num_prompt_tokens] for seq in picked], vocab_size, device) > 0,
            output_counts=token_table([seq.completion_token_ids for seq in picked], vocab_size, device),
            presence=tensor([p.presence_penalty for p in params]),
            frequency=tensor([p.frequency_penalty for p in params]),
            repetition=tensor([p.repetition_penalty for p in params]),
            bias=bias,
            banned=banned,
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The batch's logits [B, V] with each processed row's rules applied (a new tensor for those rows)."""
        rows = logits[self.rows].float()
        rows = apply_penalties(
            rows, self.prompt_mask, self.output_counts, self.presence, self.frequency, self.repetition
        )
        if self.bias is not None:
            rows = rows + self.bias
        if self.banned is not None:
            rows = rows.masked_fill(self.banned, float("-inf"))
        logits = logits.float().clone()
        logits[self.rows] = rows
        return logits


def token_table(token_lists: list[list[int]], vocab_size: int, device) -> torch.Tensor:
    """[len(token_lists), V] float: how many times each row's list holds each token (one scatter_add, the lists
    padded with an extra column V that is dropped)."""
    width = max(map(len, token_lists), default=0)
    ids = np.full((len(token_lists), width), vocab_size, dtype=np.int64)
    for r, tokens in enumerate(token_lists):
        ids[r, : len(tokens)] = tokens
    counts = torch.zeros(len(token_lists), vocab_size + 1, device=device)
    counts.scatter_add_(1, torch.from_numpy(ids).to(device), torch.ones(ids.shape, device=device))
    return counts[:, :vocab_size]


def banned_tokens(seq: "Sequence", eos_token_ids) -> list[int]:
    """The tokens seq may not pick next: its EOS and stop tokens while it has fewer than min_tokens new tokens, and
    the last token of each bad word whose other tokens it has just generated (vLLM's rule)."""
    sp, output = seq.sampling_params, seq.completion_token_ids
    banned = [*eos_token_ids, *sp.stop_token_ids] if len(output) < sp.min_tokens else []
    for word in sp.bad_words_token_ids:
        if len(word) == 1 or (
            len(output) >= len(word) - 1 and output[len(output) - len(word) + 1 :] == list(word[:-1])
        ):
            banned.append(word[-1])
    return banned
