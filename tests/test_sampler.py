"""The sampler: greedy is argmax, truncation keeps only what it should, a seed reproduces a draw."""
import torch

from minillm.layers.sampler import sample

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])


def draws(n=400, seed=0, temperature=1.0, top_k=0, top_p=1.0):
    """n draws from LOGITS, all in one batch of n rows sharing one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    rows = lambda x, dtype=torch.float: torch.full((n,), x, dtype=dtype)
    return sample(LOGITS.expand(n, -1), rows(temperature), rows(top_k, torch.long), rows(top_p), [g] * n).tolist()


def test_temperature_zero_is_argmax():
    assert set(draws(temperature=0.0)) == {1}


def test_top_k_keeps_only_the_k_most_likely():
    assert set(draws(top_k=2)) == {1, 4}
    assert set(draws(top_k=1)) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = LOGITS.softmax(-1)  # sorted: 1 (.38), 4 (.35), 2 (.14), ...
    assert set(draws(top_p=float(probs[1]) + 0.01)) == {1, 4}
    assert set(draws(top_p=0.01)) == {1}


def test_sampling_follows_the_tempered_distribution():
    counts = torch.bincount(torch.tensor(draws(n=4000, temperature=2.0)), minlength=5).float() / 4000
    assert (counts - (LOGITS / 2.0).softmax(-1)).abs().max() < 0.03


def test_each_row_uses_its_own_parameters():
    params = [(0.0, 0, 1.0), (1.0, 1, 1.0), (5.0, 2, 1.0), (1.0, 0, 0.01)]
    t, k, p = (torch.tensor(c) for c in zip(*params))
    out = sample(LOGITS.expand(4, -1), t, k, p, [None] * 4)
    assert out[0] == 1 and out[1] == 1 and out[2] in (1, 4) and out[3] == 1


def test_same_seed_same_draws_whatever_the_batch():
    one = lambda seed: sample(LOGITS[None], torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1),
                              [torch.Generator().manual_seed(seed)])
    many = sample(LOGITS.expand(3, -1), torch.ones(3), torch.zeros(3, dtype=torch.long), torch.ones(3),
                  [torch.Generator().manual_seed(s) for s in (7, 8, 9)])
    assert many.tolist() == [one(7).item(), one(8).item(), one(9).item()]
    assert draws(seed=7) == draws(seed=7) and draws(seed=7) != draws(seed=8)
