"""Chapter 05 exercises: slot mapping (05.1), paged decode attention (05.2), the chained block hash (05.3),
allocation with prefix reuse (05.4) and freeing with reference counts (05.5).

Each piece is checked on small cases you can work out by hand (a method runs inside minillm's BlockManager,
with the reference for everything else), then the engine runs with your code plugged in: its greedy output
must equal the naive generator's, and no block may leak.

    python -m minillm.course grade 05
"""

import pytest
import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from minillm.course import use_impl
from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence
from minillm.models import build_model
from minillm.naive import generate_naive


@pytest.mark.exercise("05.1")
def test_slot_mapping(impl):
    assert impl.slot_mapping_for([7, 2, 5], 0, 10, 4) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]
    assert impl.slot_mapping_for([7, 2, 5], 6, 9, 4) == [10, 11, 20]
    assert impl.slot_mapping_for([3], 2, 3, 16) == [50]


@pytest.mark.exercise("05.2")
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)], ids=["MHA", "GQA"])
def test_paged_decode_attention_equals_attention_over_contiguous_keys(impl, heads, kv_heads):
    torch.manual_seed(0)
    block_size, lens = 4, [1, 6, 9]
    k_cache, v_cache = torch.randn(12, block_size, kv_heads, 16), torch.randn(12, block_size, kv_heads, 16)
    tables = [[3], [0, 11], [5, 1, 8]]  # scattered blocks; -1 pads the short rows
    block_tables = torch.tensor([t + [-1] * (3 - len(t)) for t in tables])
    q = torch.randn(3, heads, 16)
    out = impl.paged_decode_attention(q, k_cache, v_cache, block_tables, torch.tensor(lens), 0.25)
    for i, (table, n) in enumerate(zip(tables, lens)):
        k = k_cache[table].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        v = v_cache[table].flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        expected = F.scaled_dot_product_attention(q[i][:, None], k, v, scale=0.25)[:, 0]
        torch.testing.assert_close(out[i], expected)


@pytest.mark.exercise("05.3")
def test_block_hash_is_a_deterministic_64_bit_chain(impl):
    h = impl.compute_block_hash([1, 2, 3, 4], -1)
    assert isinstance(h, int) and -(2**63) <= h < 2**63, "a signed 64-bit int: it goes back in as the next prefix_hash"
    assert isinstance(impl.compute_block_hash([5, 6, 7, 8], h), int), "a hash must chain into the next block"
    assert impl.compute_block_hash([1, 2, 3, 4], -1) == h, "same tokens and prefix must give the same hash"
    assert impl.compute_block_hash([1, 2, 4, 3], -1) != h, "token order matters"
    assert impl.compute_block_hash([5, 6, 7, 8], h) != impl.compute_block_hash([5, 6, 7, 8], -1), (
        "the same block after a different prefix must hash differently"
    )


def computed(bm, tokens):
    """A sequence whose keys and values were all computed (its full blocks are cached)."""
    seq = Sequence(tokens)
    bm.allocate(seq)
    bm.cache_blocks(seq, len(seq))
    seq.num_computed_tokens = len(seq)
    return seq


@pytest.mark.exercise("05.4")
def test_allocate_covers_every_token_and_reuses_full_cached_blocks(impl):
    with use_impl(impl, "05.4"):
        bm = BlockManager(10, 4)
        a = computed(bm, list(range(9)))
        b = Sequence(list(range(8)) + [99, 98])
        bm.allocate(b)
    assert len(a.block_table) == 3 and a.num_cached_tokens == 0
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    assert b.block_table[2] not in a.block_table, "a partial block is never shared"
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]


@pytest.mark.exercise("05.4")
def test_allocate_checks_tokens_on_a_hash_collision(impl):
    with use_impl(impl, "05.4"):
        bm = BlockManager(10, 4, hash_fn=lambda token_ids, prefix: 7)
        a = computed(bm, [1, 2, 3, 4])
        b = Sequence([4, 3, 2, 1])
        bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table != a.block_table


@pytest.mark.exercise("05.5")
def test_deallocate_frees_a_shared_block_only_when_unused(impl):
    with use_impl(impl, "05.5"):
        bm = BlockManager(6, 4)
        a = computed(bm, list(range(8)))
        b = computed(bm, list(range(8)) + [1])
        bm.deallocate(a)
        assert not a.block_table and bm.num_free_blocks == 3  # both of a's blocks are still b's
        bm.deallocate(b)
    assert bm.num_free_blocks == 6 and not bm.used_block_ids


@pytest.mark.exercise("05.5")
def test_a_freed_prefix_can_be_revived(impl):
    with use_impl(impl, "05.5"):
        bm = BlockManager(6, 4)
        a = computed(bm, list(range(8)))
        table = list(a.block_table)
        bm.deallocate(a)
        b = Sequence(list(range(8)) + [3])
        bm.allocate(b)
    assert b.block_table[:2] == table and b.num_cached_tokens == 8


@pytest.fixture(scope="module")
def engine_reference(tiny_checkpoint):
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 40, 41], [9] * 5]
    model = build_model(tiny_checkpoint)
    return prompts, [list(generate_naive(model, p, 12)) for p in prompts]


@pytest.mark.parametrize(
    "exercise", [pytest.param(e, marks=pytest.mark.exercise(e)) for e in ("05.1", "05.2", "05.3", "05.4", "05.5")]
)
def test_the_engine_runs_on_your_code(impl, tiny_checkpoint, engine_reference, exercise):
    prompts, expected = engine_reference
    with use_impl(impl, exercise):
        # the torch reference backend: the one whose decode attention is exercise 05.2
        llm = LLM(tiny_checkpoint, kvcache_block_size=4, num_kvcache_blocks=64, attention_backend="torch")
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    assert llm.block_manager.num_free_blocks == 64, "every block must be free again"
