"""Chapter 10 exercises: cutting a checkpoint tensor into shards (10.1), where q, k and v sit in a rank's packed
weight (10.2), the row-parallel forward with its all-reduce (10.3) and the vocab-parallel embedding (10.4).

Two or three ranks are played in one process: each rank's layer is built inside tensor_parallel(group) with a
test double for the group, whose all-reduce records the call and leaves the tensor as it is; the test adds the
ranks' partial results up itself. (`LLM(tensor_parallel_size=2)` runs the real thing: tests/test_parallel.py.)

    python -m minillm.course grade 10
"""

import pytest
import torch
import torch.nn.functional as F

from minillm.course import use_impl
from minillm.layers.embed_head import VocabParallelEmbedding
from minillm.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minillm.utils.parallel import tensor_parallel


class RecordingGroup:
    """Rank `rank` of `size`, without other processes: all_reduce counts its calls and returns x unchanged."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size, self.reduced = rank, size, []

    def all_reduce(self, x):
        self.reduced.append(x.clone())
        return x


def build(layer_cls, rank, size, *args, **kwargs):
    group = RecordingGroup(rank, size)
    with tensor_parallel(group):
        return layer_cls(*args, **kwargs), group


@pytest.mark.exercise("10.1")
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("tp_size", [1, 2, 3])
def test_shards_are_views_that_put_back_together_give_the_tensor(impl, dim, tp_size):
    weight = torch.arange(36.0).reshape(6, 6)
    parts = [impl.shard(weight, dim, rank, tp_size) for rank in range(tp_size)]
    assert all(p.shape[dim] == 6 // tp_size and p.shape[1 - dim] == 6 for p in parts)
    assert torch.equal(torch.cat(parts, dim), weight)
    parts[-1].fill_(-1)
    assert (weight.narrow(dim, 6 - 6 // tp_size, 6 // tp_size) == -1).all(), "a shard must be a view, not a copy"


@pytest.mark.exercise("10.1")
def test_shard_of_a_non_square_tensor(impl):
    w = torch.arange(8.0).reshape(4, 2)
    assert impl.shard(w, 0, 1, 2).tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert impl.shard(w, 1, 1, 2).tolist() == [[1.0], [3.0], [5.0], [7.0]]


@pytest.mark.exercise("10.1")
def test_column_and_row_parallel_layers_load_their_shards_through_yours(impl):
    torch.manual_seed(0)
    w, x = torch.randn(6, 4), torch.randn(3, 4)
    with use_impl(impl, "10.1"):
        cols = [build(ColumnParallelLinear, r, 2, 4, 6)[0] for r in range(2)]
        rows = [build(RowParallelLinear, r, 2, 6, 4)[0] for r in range(2)]
        for layer in cols:
            layer.weight.weight_loader(layer.weight, w)
        for layer in rows:
            layer.weight.weight_loader(layer.weight, w.T.contiguous())
    torch.testing.assert_close(torch.cat([layer(x) for layer in cols], -1), x @ w.T)
    assert torch.equal(torch.cat([layer.weight for layer in rows], 1), w.T)


@pytest.mark.exercise("10.2")
@pytest.mark.parametrize("heads, kv_heads, tp_size", [(8, 8, 2), (8, 2, 2), (8, 4, 4), (4, 1, 1), (16, 4, 4)])
def test_qkv_shard_range(impl, heads, kv_heads, tp_size):
    q, kv = heads // tp_size * 4, kv_heads // tp_size * 4
    got = [impl.qkv_shard_range(s, heads, kv_heads, 4, tp_size) for s in "qkv"]
    assert got == [(0, q), (q, kv), (q + kv, kv)]
    assert all(isinstance(n, int) for pair in got for n in pair)


@pytest.mark.exercise("10.2")
def test_qkv_parallel_linear_loads_each_rank_s_heads_through_yours(impl):
    torch.manual_seed(0)
    heads, kv_heads, d, hidden = 4, 2, 3, 5
    wq, wk, wv = torch.randn(heads * d, hidden), torch.randn(kv_heads * d, hidden), torch.randn(kv_heads * d, hidden)
    with use_impl(impl, "10.2"):
        for rank in range(2):
            layer, _ = build(QKVParallelLinear, rank, 2, hidden, d, heads, kv_heads)
            for shard_id, w in zip("qkv", (wq, wk, wv)):
                layer.weight.weight_loader(layer.weight, w, shard_id)
            q, k, v = layer.weight.split([heads // 2 * d, kv_heads // 2 * d, kv_heads // 2 * d])
            assert torch.equal(q, wq.chunk(2)[rank]) and torch.equal(k, wk.chunk(2)[rank])
            assert torch.equal(v, wv.chunk(2)[rank])


@pytest.mark.exercise("10.3")
@pytest.mark.parametrize("tp_size", [1, 2, 3])
def test_row_parallel_partials_sum_to_the_whole_with_the_bias_once(impl, tp_size):
    torch.manual_seed(0)
    w, b, x = torch.randn(4, 6), torch.randn(4), torch.randn(3, 6)
    partials, groups = [], []
    for rank in range(tp_size):
        group = RecordingGroup(rank, tp_size)
        n = 6 // tp_size
        partials.append(
            impl.row_parallel_linear(x[:, rank * n : (rank + 1) * n], w[:, rank * n : (rank + 1) * n], b, rank, group)
        )
        groups.append(group)
    assert all(len(g.reduced) == 1 for g in groups), "each rank must all-reduce exactly once"
    torch.testing.assert_close(sum(g.reduced[0] for g in groups), F.linear(x, w, b))
    torch.testing.assert_close(sum(partials), F.linear(x, w, b))


@pytest.mark.exercise("10.3")
def test_row_parallel_without_a_group_is_the_plain_layer(impl):
    x, w = torch.randn(2, 3), torch.randn(5, 3)
    torch.testing.assert_close(impl.row_parallel_linear(x, w, None, 0, None), x @ w.T)


@pytest.mark.exercise("10.3")
def test_row_parallel_multiplies_by_the_layers_own_linear(impl):
    """A kernel whose weight has another layout (here transposed, as the CPU's packed one differs): the partial
    must come from `linear`, with the bias on rank 0 only."""
    torch.manual_seed(0)
    w, b, x = torch.randn(4, 6), torch.randn(4), torch.randn(3, 6)
    calls = []

    def transposed_linear(x, weight_t, bias):
        calls.append(bias is not None)
        return F.linear(x, weight_t.T, bias)

    total = sum(
        impl.row_parallel_linear(
            x[:, r * 3 : (r + 1) * 3], w[:, r * 3 : (r + 1) * 3].T, b, r, RecordingGroup(r, 2), transposed_linear
        )
        for r in range(2)
    )
    assert calls == [True, False], "call linear once per rank, with the bias on rank 0 only"
    torch.testing.assert_close(total, F.linear(x, w, b))


@pytest.mark.exercise("10.3")
def test_row_parallel_linear_layer_runs_yours(impl):
    torch.manual_seed(0)
    w, b, x = torch.randn(4, 6), torch.randn(4), torch.randn(3, 6)
    outs = []
    with use_impl(impl, "10.3"):
        for rank in range(2):
            layer, group = build(RowParallelLinear, rank, 2, 6, 4, bias=True)
            layer.weight.weight_loader(layer.weight, w)
            layer.bias.weight_loader(layer.bias, b)
            outs.append(layer(x[:, rank * 3 : (rank + 1) * 3]))
            assert len(group.reduced) == 1
    torch.testing.assert_close(sum(outs), F.linear(x, w, b))


@pytest.mark.exercise("10.4")
@pytest.mark.parametrize("tp_size", [2, 3])
@pytest.mark.parametrize("shape", [(7,), (2, 5)])
def test_vocab_parallel_embedding_answers_add_up_to_the_lookup(impl, tp_size, shape):
    torch.manual_seed(0)
    table = torch.randn(12, 4)
    ids = torch.randint(0, 12, shape)
    n = 12 // tp_size
    answers = []
    for rank in range(tp_size):
        group = RecordingGroup(rank, tp_size)
        out = impl.vocab_parallel_embed(ids, table[rank * n : (rank + 1) * n], rank * n, group)
        assert out.shape == (*shape, 4) and len(group.reduced) == 1
        mine = (ids >= rank * n) & (ids < (rank + 1) * n)
        assert (out[~mine] == 0).all(), "ids of other ranks must give zero rows"
        torch.testing.assert_close(out[mine], table[ids[mine]])
        answers.append(out)
    torch.testing.assert_close(sum(answers), table[ids])


@pytest.mark.exercise("10.4")
def test_vocab_parallel_embedding_layer_runs_yours(impl):
    table, ids = torch.randn(8, 3), torch.tensor([[0, 7, 3], [4, 4, 1]])
    outs = []
    with use_impl(impl, "10.4"):
        for rank in range(2):
            layer, _ = build(VocabParallelEmbedding, rank, 2, 8, 3)
            layer.weight.weight_loader(layer.weight, table)
            outs.append(layer(ids))
    torch.testing.assert_close(sum(outs), table[ids])
