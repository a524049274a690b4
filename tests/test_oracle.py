"""minillm against transformers on the same random weights: logits within 1e-4, identical greedy tokens."""

import pytest
import torch
from checkpoints import CONFIGS, make_checkpoint

from minillm.models import build_model
from minillm.naive import generate_naive


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return make_checkpoint(request.param, path), build_model(path)


def test_logits_match_transformers(pair):
    hf, ours = pair
    torch.manual_seed(1)
    ids = torch.randint(0, hf.config.vocab_size, (97,))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
        got = ours.compute_logits(ours(ids, torch.arange(len(ids))))
    assert (got - expected).abs().max().item() < 1e-4


def test_greedy_tokens_match_transformers_generate(pair):
    hf, ours = pair
    prompt = [3, 17, 42, 99, 7]
    expected = hf.generate(
        torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert list(generate_naive(ours, prompt, max_new_tokens=32)) == expected
    assert len(set(expected)) > 1  # a model stuck on one token would make this test too easy


def test_default_model_matches_transformers():
    """The shipped story model, loaded by both, on a held-out story opening."""
    from transformers import AutoModelForCausalLM

    from minillm import default_model_path
    from minillm.data import heldout_openings
    from minillm.tokenizer import Tokenizer

    path = default_model_path()
    hf, ours = AutoModelForCausalLM.from_pretrained(path).eval(), build_model(path)
    prompt = Tokenizer(path).encode(heldout_openings(1)[0])
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
        got = ours.compute_logits(ours(torch.tensor(prompt), torch.arange(len(prompt))))
    assert (got - expected).abs().max().item() < 1e-4
    generated = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt) :].tolist()
    assert list(generate_naive(ours, prompt, 32, eos_token_ids=[hf.config.eos_token_id])) == generated
