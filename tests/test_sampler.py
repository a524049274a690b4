"""The sampler: greedy is argmax, truncation keeps only what it should, a seed reproduces a draw, and a batch
does no work that none of its rows asks for."""

import torch

from minillm import SamplingParams
from minillm.layers import sampler as sampler_module
from minillm.layers.sampler import SamplingMetadata, sample

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])


def metadata(params, generators=None):
    return SamplingMetadata.build(params, generators or [None] * len(params))


def draws(n=400, seed=0, **params):
    """n draws from LOGITS, all in one batch of n rows sharing one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return sample(LOGITS.expand(n, -1), metadata([SamplingParams(**params)] * n, [g] * n)).tolist()


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
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1),
        SamplingParams(temperature=5.0, top_k=2),
        SamplingParams(top_p=0.01),
    ]
    out = sample(LOGITS.expand(4, -1), metadata(params))
    assert out[0] == 1 and out[1] == 1 and out[2] in (1, 4) and out[3] == 1


def test_same_seed_same_draws_whatever_the_batch():
    one = lambda seed: sample(LOGITS[None], metadata([SamplingParams()], [torch.Generator().manual_seed(seed)]))
    many = sample(
        LOGITS.expand(3, -1), metadata([SamplingParams()] * 3, [torch.Generator().manual_seed(s) for s in (7, 8, 9)])
    )
    assert many.tolist() == [one(7).item(), one(8).item(), one(9).item()]
    assert draws(seed=7) == draws(seed=7) and draws(seed=7) != draws(seed=8)


def test_an_all_greedy_batch_neither_sorts_nor_draws(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a greedy batch must not truncate or draw noise")

    monkeypatch.setattr(sampler_module, "apply_top_k_top_p", forbidden)
    monkeypatch.setattr(torch.Tensor, "exponential_", forbidden)
    logits = torch.randn(64, 1000)
    assert torch.equal(sample(logits, metadata([SamplingParams(temperature=0)] * 64)), logits.argmax(-1))


def test_only_the_rows_that_ask_for_it_are_truncated(monkeypatch):
    seen = []
    real = sampler_module.apply_top_k_top_p
    monkeypatch.setattr(sampler_module, "apply_top_k_top_p", lambda x, k, p: seen.append(len(x)) or real(x, k, p))
    params = [SamplingParams(), SamplingParams(top_k=2), SamplingParams(temperature=0, top_p=0.5), SamplingParams()]
    sample(torch.randn(4, 50), metadata(params))
    assert seen == [1], "one truncated row: the greedy row's top_p does not count"
    seen.clear()
    sample(torch.randn(4, 50), metadata([SamplingParams()] * 4))
    assert seen == [], "no row truncates: no sort at all"


def test_a_zero_noise_draw_cannot_pick_a_masked_token(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, *a, **k: self.zero_())
    out = sample(LOGITS.expand(8, -1), metadata([SamplingParams(top_k=2)] * 8))
    assert set(out.tolist()) <= {1, 4}
