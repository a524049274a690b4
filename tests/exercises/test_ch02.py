"""Chapter 02 exercises: embedding lookup (02.1) and the tied LM head (02.2).

Each function is checked against an independent formula: the lookup against a one-hot row times the table
(and torch's F.embedding), the head against F.linear, for a single id or hidden vector, a sequence, and a
2-D batch. Then it is plugged into the real default model: with your function in place of minillm's, the
story model must give the same logits and write the same greedy continuation.

    python -m minillm.course grade 02
"""

import pytest
import torch
import torch.nn.functional as F

from minillm import default_model_path
from minillm.course import use_impl
from minillm.models import build_model
from minillm.naive import generate_naive
from minillm.tokenizer import Tokenizer

close = torch.testing.assert_close


def table(vocab: int = 50, hidden: int = 8) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(vocab * hidden))


# 02.1 embedding lookup

IDS = {
    "one id": torch.tensor(7),
    "a sequence": torch.tensor([3, 0, 49, 3, 12]),
    "a 2-D batch": torch.tensor([[1, 2, 3], [49, 48, 0]]),
}


@pytest.mark.exercise("02.1")
@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
def test_embed_equals_one_hot_times_the_table(impl, ids):
    weight = table()
    out = impl.embed(ids, weight)
    assert out.shape == (*ids.shape, 8), "one row of 8 numbers per id, in the ids' own shape"
    close(out, F.one_hot(ids, 50).float() @ weight)
    close(out, F.embedding(ids, weight))


@pytest.mark.exercise("02.1")
def test_embed_keeps_the_table_dtype_and_repeats_rows_for_repeated_ids(impl):
    weight = table().bfloat16()
    out = impl.embed(torch.tensor([5, 5, 9]), weight)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[0], weight[5]) and torch.equal(out[1], weight[5]) and torch.equal(out[2], weight[9])


# 02.2 LM head

HIDDEN = {"one vector": (8,), "a sequence": (5, 8), "a 2-D batch": (2, 3, 8)}


@pytest.mark.exercise("02.2")
@pytest.mark.parametrize("shape", HIDDEN.values(), ids=HIDDEN.keys())
def test_lm_logits_equals_f_linear(impl, shape):
    weight, hidden = table(), torch.randn(shape)
    out = impl.lm_logits(hidden, weight)
    assert out.shape == (*shape[:-1], 50), "one logit per vocabulary entry"
    close(out, F.linear(hidden, weight))


@pytest.mark.exercise("02.2")
def test_lm_logits_with_an_orthonormal_table_scores_each_embedded_token_first(impl):
    weight = torch.linalg.qr(torch.randn(16, 16))[0][:10]  # 10 orthonormal rows of 16 numbers
    ids = torch.tensor([4, 0, 9, 4])
    logits = impl.lm_logits(weight[ids], weight)
    close(logits, F.one_hot(ids, 10).float(), atol=1e-5, rtol=0)  # row t scores 1 against itself, 0 elsewhere


# Your functions inside the real model


@pytest.fixture(scope="module")
def story_model():
    path = default_model_path()
    return build_model(path), Tokenizer(path)


@pytest.mark.parametrize("exercise", [pytest.param(e, marks=pytest.mark.exercise(e)) for e in ("02.1", "02.2")])
def test_the_story_model_writes_the_same_with_your_function(impl, story_model, exercise):
    model, tok = story_model
    prompt = tok.encode("Once upon a time, there was a little fox named Max.")
    positions = torch.arange(len(prompt))
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(prompt), positions))
    tokens = list(generate_naive(model, prompt, 8))
    with use_impl(impl, exercise), torch.inference_mode():
        close(model.compute_logits(model(torch.tensor(prompt), positions)), logits)
        assert list(generate_naive(model, prompt, 8)) == tokens
