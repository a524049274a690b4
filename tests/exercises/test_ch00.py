"""Chapter 00 warm-ups: chosen_scores (00.1), split_heads (00.2), causal_softmax (00.3), descending_ranks (00.4)
and pairwise_scores (00.5).

Each warm-up is checked against a plain formula written with Python loops or a slower torch route, on the
shapes the later chapters use (a row, a batch, heads), and on the edge cases its docstring names.

    python -m minillm.course grade 00
"""

import pytest
import torch

close = torch.testing.assert_close


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# 00.1 chosen_scores


@pytest.mark.exercise("00.1")
def test_chosen_scores_picks_the_docstring_example(impl):
    """The worked example: row 0 picks column 1, row 1 picks column 0."""
    scores = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
    assert torch.equal(impl.chosen_scores(scores, torch.tensor([1, 0])), torch.tensor([0.7, 0.5]))


SHAPES = {"one row": (), "a batch of rows": (5,), "batch and tokens": (2, 3)}


@pytest.mark.exercise("00.1")
@pytest.mark.parametrize("lead", SHAPES.values(), ids=SHAPES.keys())
def test_chosen_scores_matches_a_loop_for_any_leading_shape(impl, lead):
    """One entry per row, for no, one and two leading dimensions; the result has the ids' shape."""
    scores = randn(*lead, 7).bfloat16()
    ids = torch.randint(0, 7, lead, generator=torch.Generator().manual_seed(1))
    out = impl.chosen_scores(scores, ids)
    assert out.shape == lead and out.dtype == torch.bfloat16, "the ids' shape, the scores' dtype"
    flat_scores, flat_ids = scores.reshape(-1, 7), ids.reshape(-1)
    expected = torch.stack([flat_scores[r, flat_ids[r]] for r in range(len(flat_ids))]).reshape(lead)
    assert torch.equal(out, expected)


@pytest.mark.exercise("00.1")
def test_chosen_scores_repeats_ids_and_leaves_its_inputs_alone(impl):
    """The same id in several rows, and the edge columns 0 and V-1; scores and ids are not modified."""
    scores, ids = randn(4, 6), torch.tensor([5, 5, 0, 5])
    before = scores.clone(), ids.clone()
    out = impl.chosen_scores(scores, ids)
    assert torch.equal(out, torch.stack([scores[0, 5], scores[1, 5], scores[2, 0], scores[3, 5]]))
    assert torch.equal(scores, before[0]) and torch.equal(ids, before[1])


# 00.2 split_heads


@pytest.mark.exercise("00.2")
def test_split_heads_gives_the_docstring_example(impl):
    """[[0..3], [4..7]] in two heads: head 0 takes columns 0-1, head 1 columns 2-3."""
    out = impl.split_heads(torch.arange(8).view(2, 4), 2)
    assert torch.equal(out, torch.tensor([[[0, 1], [4, 5]], [[2, 3], [6, 7]]]))


HEADS = {"T=5 H=4 D=3": (5, 4, 3), "one token": (1, 2, 4), "one head": (3, 1, 6)}


@pytest.mark.exercise("00.2")
@pytest.mark.parametrize("t, h, d", HEADS.values(), ids=HEADS.keys())
def test_split_heads_puts_each_block_of_columns_in_its_head(impl, t, h, d):
    """result[h, t] == x[t, h*D:(h+1)*D] for every head and token; the shape is [H, T, D]."""
    x = randn(t, h * d)
    out = impl.split_heads(x, h)
    assert out.shape == (h, t, d)
    for head in range(h):
        assert torch.equal(out[head], x[:, head * d : (head + 1) * d]), f"head {head}"


@pytest.mark.exercise("00.2")
def test_split_heads_returns_a_view_that_shares_xs_memory(impl):
    """No copy: the result reads x's storage, so a write into x shows up in the result."""
    x = randn(3, 8)
    out = impl.split_heads(x, 4)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), "a view, not a copy"
    x[2, 5] = 100.0  # token 2, head 2 (columns 4-5), position 1
    assert out[2, 2, 1] == 100.0


# 00.3 causal_softmax


def causal_reference(scores: torch.Tensor) -> torch.Tensor:
    """Row by row: query i (at position Tk - Tq + i) softmaxes over keys 0..Tk-Tq+i; zeros after."""
    tq, tk = scores.shape[-2:]
    out = torch.zeros_like(scores, dtype=torch.float32)
    for i in range(tq):
        seen = tk - tq + i + 1
        out[..., i, :seen] = scores[..., i, :seen].float().softmax(-1)
    return out


@pytest.mark.exercise("00.3")
def test_causal_softmax_of_zeros_gives_the_docstring_example(impl):
    """Equal scores: row i spreads evenly over the i + 1 keys it may see (square, then 2 queries of 3 keys)."""
    third = 1 / 3
    close(impl.causal_softmax(torch.zeros(3, 3)), torch.tensor([[1, 0, 0], [0.5, 0.5, 0], [third] * 3]))
    close(impl.causal_softmax(torch.zeros(2, 3)), torch.tensor([[0.5, 0.5, 0], [third] * 3]))


CAUSAL = {"square": (6, 6), "batch and heads": (2, 3, 4, 4), "2 queries of 5 keys": (2, 5), "one new token": (1, 7)}


@pytest.mark.exercise("00.3")
@pytest.mark.parametrize("shape", CAUSAL.values(), ids=CAUSAL.keys())
def test_causal_softmax_matches_a_row_by_row_softmax(impl, shape):
    """Rows sum to 1, future keys get exactly 0, and the rest is the softmax of the visible scores."""
    scores = randn(*shape) * 3
    out = impl.causal_softmax(scores)
    assert out.shape == scores.shape and out.dtype == scores.dtype
    expected = causal_reference(scores)
    close(out, expected)
    assert torch.equal(out == 0, expected == 0), "masked entries are exactly 0 (and only those)"
    close(out.sum(-1), torch.ones(shape[:-1]))


@pytest.mark.exercise("00.3")
def test_causal_softmax_keeps_the_dtype_and_does_not_touch_the_scores(impl):
    """bf16 in, bf16 out; the input still holds its scores afterwards (no in-place masked_fill_)."""
    scores = randn(4, 4).bfloat16()
    before = scores.clone()
    out = impl.causal_softmax(scores)
    assert out.dtype == torch.bfloat16 and torch.equal(scores, before)
    assert torch.equal(out[0], torch.tensor([1.0, 0, 0, 0], dtype=torch.bfloat16)), "row 0 sees only key 0"


# 00.4 descending_ranks


def ranks_reference(row: list[float]) -> list[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    return [order.index(i) for i in range(len(row))]


@pytest.mark.exercise("00.4")
def test_descending_ranks_gives_the_docstring_example(impl):
    """[0.1, 0.9, 0.5]: 0.9 is the largest (rank 0), then 0.5 (rank 1), then 0.1 (rank 2)."""
    assert impl.descending_ranks(torch.tensor([[0.1, 0.9, 0.5]])).tolist() == [[2, 0, 1]]


RANKS = {"one row of one": (1,), "a row": (10,), "a batch": (4, 9), "batch and heads": (2, 3, 5)}


@pytest.mark.exercise("00.4")
@pytest.mark.parametrize("shape", RANKS.values(), ids=RANKS.keys())
def test_descending_ranks_match_sorting_each_row(impl, shape):
    """Distinct values: each rank is the entry's position in its row sorted largest first; long, same shape."""
    x = randn(*shape)
    before = x.clone()
    out = impl.descending_ranks(x)
    assert out.shape == x.shape and out.dtype == torch.long
    expected = [ranks_reference(row) for row in x.reshape(-1, shape[-1]).tolist()]
    assert out.reshape(-1, shape[-1]).tolist() == expected
    assert torch.equal(x, before), "x is not modified"


@pytest.mark.exercise("00.4")
def test_descending_ranks_with_ties_are_still_a_permutation(impl):
    """Tied values get different ranks (in either order), each row uses 0..N-1 once, larger never ranks lower."""
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    out = impl.descending_ranks(x)
    for row, ranks in zip(x.tolist(), out.tolist()):
        assert sorted(ranks) == list(range(5)), "a permutation of 0..N-1"
        assert all(ranks[i] < ranks[j] for i in range(5) for j in range(5) if row[i] > row[j])


# 00.5 pairwise_scores


@pytest.mark.exercise("00.5")
def test_pairwise_scores_gives_the_docstring_example(impl):
    """Two queries, three keys: out[i, j] = q[i] · k[j]."""
    q, k = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    assert torch.equal(impl.pairwise_scores(q, k), torch.tensor([[3.0, 5.0, 7.0], [8.0, 12.0, 16.0]]))


BROADCAST = {
    "one sequence": ((4, 8), (6, 8), (4, 6)),
    "a batch": ((3, 4, 8), (3, 6, 8), (3, 4, 6)),
    "keys shared by the batch": ((3, 4, 8), (6, 8), (3, 4, 6)),
    "batch and heads broadcast": ((2, 1, 4, 8), (1, 5, 6, 8), (2, 5, 4, 6)),
}


@pytest.mark.exercise("00.5")
@pytest.mark.parametrize("q_shape, k_shape, out_shape", BROADCAST.values(), ids=BROADCAST.keys())
def test_pairwise_scores_match_dot_products_with_broadcasting(impl, q_shape, k_shape, out_shape):
    """Every (query, key) dot product; leading dimensions broadcast like torch arithmetic does."""
    q, k = randn(*q_shape, seed=1), randn(*k_shape, seed=2)
    out = impl.pairwise_scores(q, k)
    assert out.shape == out_shape
    close(out, (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1))  # [..., Tq, 1, D] * [..., 1, Tk, D], summed over D


@pytest.mark.exercise("00.5")
def test_pairwise_scores_keeps_the_dtype_and_the_inputs(impl):
    """bf16 inputs give bf16 scores; q and k are unchanged."""
    q, k = randn(2, 3, 4).bfloat16(), randn(2, 5, 4).bfloat16()
    before = q.clone(), k.clone()
    out = impl.pairwise_scores(q, k)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 5)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
