"""The chi-square test chapter 13 and the speculative-decoding tests rely on (minillm.course.stats): it passes draws
from the distribution they are tested against, fails draws from another, and pools the bins that expect too few
draws instead of failing a right sampler on one rare token."""

import torch

from minillm.course.stats import chi_square_pvalue, pooled


def test_draws_from_the_distribution_pass_and_from_another_fail():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    right = torch.bincount(torch.multinomial(p, 4000, replacement=True, generator=g), minlength=4)
    wrong = torch.bincount(torch.multinomial(p.flip(0), 4000, replacement=True, generator=g), minlength=4)
    assert chi_square_pvalue(right, p) > 0.01 and chi_square_pvalue(wrong, p) < 1e-6


def test_a_draw_of_a_token_of_probability_zero_fails_outright():
    assert chi_square_pvalue([50, 49, 1], [0.5, 0.5, 0.0]) == 0.0


def test_a_rare_token_drawn_once_is_pooled_not_counted_as_49_standard_units():
    """100 draws, a token of probability 0.0002 drawn once: unpooled, its bin alone gives a statistic near 49
    (p below 1e-10); pooled with the others it is one draw among fifty."""
    counts, probs = [50, 49, 1], [0.4999, 0.4999, 0.0002]
    assert chi_square_pvalue(counts, probs) > 0.5
    observed, expected = pooled(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs) * 100)
    assert (expected >= 5).all() and observed.sum() == 100 and torch.isclose(expected.sum(), torch.tensor(100.0))


def test_bins_that_already_expect_enough_are_left_alone():
    observed, expected = torch.tensor([10.0, 20.0, 30.0]), torch.tensor([12.0, 18.0, 30.0])
    assert pooled(observed, expected) == (observed, expected)
