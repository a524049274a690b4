"""BlockManager: block boundaries, prefix sharing, revival, collisions, and no leaked blocks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence

BS = 4


def computed(bm: BlockManager, tokens: list[int]) -> Sequence:
    """A sequence that got its blocks and whose keys/values were all computed (so its full blocks are cached)."""
    seq = Sequence(tokens)
    bm.allocate(seq)
    bm.cache_blocks(seq, len(seq))
    seq.num_computed_tokens = len(seq)
    return seq


def assert_consistent(bm: BlockManager, live: list[Sequence]):
    holders = {}
    for seq in live:
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    assert {b: bm.blocks[b].ref_count for b in bm.used_block_ids} == holders
    assert set(bm.free_block_ids).isdisjoint(bm.used_block_ids)
    assert len(bm.free_block_ids) + len(bm.used_block_ids) == len(bm.blocks)


@pytest.mark.parametrize("n", [2 * BS - 1, 2 * BS, 2 * BS + 1])
def test_blocks_at_boundaries(n):
    bm = BlockManager(16, BS)
    a = computed(bm, list(range(n)))
    assert len(a.block_table) == -(-n // BS)
    b = Sequence(list(range(n)))
    bm.allocate(b)
    assert b.num_cached_tokens == (n // BS) * BS  # only full blocks are shared
    assert b.block_table[: n // BS] == a.block_table[: n // BS]
    assert b.block_table[n // BS :] != a.block_table[n // BS :] or n % BS == 0
    assert_consistent(bm, [a, b])
    bm.deallocate(a), bm.deallocate(b)
    assert bm.num_free_blocks == 16


def test_prompt_fully_covered_by_cached_blocks():
    bm = BlockManager(8, BS)
    a = computed(bm, list(range(2 * BS)))
    b = Sequence(list(range(2 * BS)))
    bm.allocate(b)
    assert b.num_cached_tokens == len(b) and b.block_table == a.block_table
    assert all(bm.blocks[i].ref_count == 2 for i in a.block_table)


def test_sharing_a_prefix_and_diverging_inside_a_block():
    bm = BlockManager(8, BS)
    a = computed(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = Sequence([1, 2, 3, 4, 5, 6, 0, 0, 9])
    bm.allocate(b)
    assert b.num_cached_tokens == BS and b.block_table[0] == a.block_table[0]
    assert set(b.block_table[1:]).isdisjoint(a.block_table)
    assert_consistent(bm, [a, b])


def test_a_freed_block_is_revived_by_a_later_identical_prefix():
    bm = BlockManager(8, BS)
    a = computed(bm, list(range(10)))
    table = list(a.block_table)
    bm.deallocate(a)
    assert bm.num_free_blocks == 8
    b = Sequence(list(range(10)))
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == table[:2]


def test_a_freed_block_taken_for_new_tokens_is_forgotten():
    bm = BlockManager(3, BS)
    a = computed(bm, list(range(8)))
    bm.deallocate(a)
    c = computed(bm, [50 + i for i in range(12)])  # needs all three blocks: evicts a's
    bm.deallocate(c)
    b = Sequence(list(range(8)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_a_hash_collision_is_caught_by_comparing_tokens():
    bm = BlockManager(8, BS, hash_fn=lambda token_ids, prefix: 42)  # every block collides
    a = computed(bm, [1, 2, 3, 4])
    b = Sequence([5, 6, 7, 8])
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table != a.block_table
    c = Sequence([1, 2, 3, 4, 9])
    bm.allocate(c)
    assert c.num_cached_tokens == 4 and c.block_table[0] == a.block_table[0]


def test_blocks_become_findable_only_once_computed():
    bm = BlockManager(8, BS)
    a = Sequence(list(range(8)))
    bm.allocate(a)  # allocated, not computed
    b = Sequence(list(range(8)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_decode_appends_a_block_when_the_last_one_is_full():
    bm = BlockManager(4, BS)
    a = computed(bm, [1, 2, 3, 4])
    a.token_ids.append(5)
    assert bm.can_append(a)
    bm.may_append(a)
    assert len(a.block_table) == 2
    a.token_ids.append(6)
    bm.may_append(a)
    assert len(a.block_table) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["new", "grow", "free"]), st.integers(0, 7), st.integers(1, 14)), max_size=40)
)
def test_random_workloads_keep_ref_counts_consistent_and_leak_nothing(ops):
    bm = BlockManager(24, BS)
    live: list[Sequence] = []
    for op, pick, n in ops:
        if op == "new":  # prompts from a small alphabet share prefixes often
            seq = Sequence([pick % 3] * (n // 2) + list(range(n - n // 2)))
            if bm.can_allocate(seq):
                bm.allocate(seq)
                bm.cache_blocks(seq, len(seq))
                live.append(seq)
        elif live and op == "grow":
            seq = live[pick % len(live)]
            seq.token_ids.append(n)
            if bm.can_append(seq):
                bm.may_append(seq)
                bm.cache_blocks(seq, len(seq))
            else:
                seq.token_ids.pop()
        elif live:
            bm.deallocate(live.pop(pick % len(live)))
        assert_consistent(bm, live)
    for seq in live:
        bm.deallocate(seq)
    assert bm.num_free_blocks == 24 and not bm.used_block_ids
