"""The naive generator: seeded sampling is reproducible, and generation stops at EOS."""

import pytest
from checkpoints import make_checkpoint

from minillm.models import build_model
from minillm.naive import generate_naive


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    make_checkpoint("qwen3-gqa-tied", path)
    return build_model(path)


def test_seeded_sampling_is_reproducible(model):
    run = lambda seed: list(generate_naive(model, [1, 2, 3], 20, temperature=1.0, top_p=0.9, seed=seed))
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_stops_after_eos(model):
    greedy = list(generate_naive(model, [1, 2, 3], 10))
    eos = greedy[4]
    assert list(generate_naive(model, [1, 2, 3], 10, eos_token_ids=[eos])) == greedy[: greedy.index(eos) + 1]
