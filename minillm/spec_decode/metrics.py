"""What speculation gained: vLLM's SpecDecodingStats, counted over the steps that verified drafts."""

from dataclasses import dataclass

import torch

from minillm.engine.sequence import Sequence


@dataclass
class SpecDecodingStats:
    num_drafts: int = 0  # verify runs: a sequence's drafts checked in one step
    num_draft_tokens: int = 0  # drafts checked
    num_accepted_tokens: int = 0  # drafts kept

    def observe(self, seqs: list[Sequence]) -> None:
        """Count a step's verified drafts, after the sampler kept a prefix of them in each spec_token_ids: the
        engine's totals, and each request's own (num_draft_tokens, num_accepted_tokens)."""
        for seq in seqs:
            drafted = seq.num_computed_tokens + seq.num_scheduled_tokens - len(seq)
            if drafted > 0 and seq.samples_this_step:
                self.num_drafts += 1
                self.num_draft_tokens += drafted
                self.num_accepted_tokens += len(seq.spec_token_ids)
                seq.num_draft_tokens += drafted
                seq.num_accepted_tokens += len(seq.spec_token_ids)

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
