"""The statistics a chapter's checks use, beside the course helpers (not in the engine): chapter 13 shows with them
that sampling with speculation draws from the target's own distribution, and the tests hold it to that."""

import torch

MIN_EXPECTED = 5  # Pearson's statistic follows the chi-square law only where every bin expects this many draws


def pooled(observed: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bins with fewer than MIN_EXPECTED expected draws merged into one (and, if that one still expects fewer,
    the smallest other bin merged into it too): a token of probability 0.0002 drawn once in 100 draws would
    otherwise count as a deviation of 49 standard units, and fail a sampler that is right."""
    low = expected < MIN_EXPECTED
    if not low.any():
        return observed, expected
    o, e = observed[~low], expected[~low]
    pool_o, pool_e = observed[low].sum(), expected[low].sum()
    if pool_e < MIN_EXPECTED and len(e):
        i = int(e.argmin())
        pool_o, pool_e = pool_o + o[i], pool_e + e[i]
        o, e = torch.cat([o[:i], o[i + 1 :]]), torch.cat([e[:i], e[i + 1 :]])
    return torch.cat([o, pool_o[None]]), torch.cat([e, pool_e[None]])


def chi_square_pvalue(counts, probs) -> float:
    """Pearson's test that `counts` (draws per token) came from the distribution `probs`: the chance of a
    statistic this large if they did (small: they did not). Tokens of probability 0 must have no draws (else 0.0)
    and count no degree of freedom; bins expecting fewer than MIN_EXPECTED draws are pooled first (`pooled`)."""
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    observed, expected = pooled(counts[support], probs[support] / probs[support].sum() * counts.sum())
    if len(expected) < 2:  # one bin: nothing to test
        return 1.0
    statistic = ((observed - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(expected) - 1) / 2, dtype=torch.float64), statistic / 2))
