"""The statistics a chapter's checks use, beside the course helpers (not in the engine): chapter 13 shows with them
that sampling with speculation draws from the target's own distribution, and the tests hold it to that."""

import torch


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
