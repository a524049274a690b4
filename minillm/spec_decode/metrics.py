"""What speculation gained: vLLM's SpecDecodingStats, counted over the steps that verified drafts."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minillm.engine.sequence import Sequence


@dataclass
class SpecDecodingStats:
    num_drafts: int = 0  # verify runs: a sequence's drafts checked in one step
    num_draft_tokens: int = 0  # drafts checked
    num_accepted_tokens: int = 0  # drafts kept

    def observe(self, seqs: list["Sequence"], sampled: list[list[int]]) -> None:
        """Count a step's verified drafts (each sequence's spec_token_ids, and the tokens the step gave it: the
        drafts kept and one of the target's own): the engine's totals, and each request's own."""
        for seq, tokens in zip(seqs, sampled):
            if seq.spec_token_ids and tokens:
                self.num_drafts += 1
                self.num_draft_tokens += len(seq.spec_token_ids)
                self.num_accepted_tokens += len(tokens) - 1
                seq.num_draft_tokens += len(seq.spec_token_ids)
                seq.num_accepted_tokens += len(tokens) - 1

    def counts(self) -> tuple[int, int, int]:
        return self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens

    @property
    def acceptance_rate(self) -> float | None:
        """The fraction of drafts kept."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a verify run yields on average: the drafts it kept and the target's own token after them."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


def chi_square_pvalue(counts, probs) -> float:
    """Pearson's test that `counts` (draws per token) came from the distribution `probs`: the chance of a
    statistic this large if they did (small: they did not). Tokens of probability 0 must have no draws (else 0.0)
    and count no degree of freedom."""
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = probs[support] / probs[support].sum() * counts.sum()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))
