"""The sampler: greedy is argmax, truncation keeps only what it should, a seed reproduces a draw."""
import torch

from minillm.layers.sampler import sample

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])


def draws(n=400, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    return [sample(LOGITS, generator=g, **kw) for _ in range(n)]


def test_temperature_zero_is_argmax():
    assert sample(LOGITS, temperature=0) == 1


def test_top_k_keeps_only_the_k_most_likely():
    assert set(draws(temperature=1.0, top_k=2)) == {1, 4}
    assert set(draws(temperature=1.0, top_k=1)) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = LOGITS.softmax(-1)  # sorted: 1 (.38), 4 (.35), 2 (.14), ...
    assert set(draws(temperature=1.0, top_p=float(probs[1]) + 0.01)) == {1, 4}
    assert set(draws(temperature=1.0, top_p=0.01)) == {1}


def test_sampling_follows_the_tempered_distribution():
    counts = torch.bincount(torch.tensor(draws(n=4000, temperature=2.0)), minlength=5).float() / 4000
    assert (counts - (LOGITS / 2.0).softmax(-1)).abs().max() < 0.03


def test_same_seed_same_draws():
    assert draws(seed=7, temperature=1.0) == draws(seed=7, temperature=1.0)
    assert draws(seed=7, temperature=1.0) != draws(seed=8, temperature=1.0)
