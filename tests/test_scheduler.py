"""Scheduler decisions on their own (no model): budgets, chunking, preemption order, finishing."""

import pytest
from scheduling import run_step  # tests/ is on sys.path

from minillm.config import Config
from minillm.engine.block_manager import BlockManager, FreeBlockQueue
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.sampling_params import SamplingParams


def scheduler(num_blocks=16, block_size=4, **kw) -> Scheduler:
    """A scheduler that admits whatever fits (new_token_ratio 0) unless told otherwise: the tests of budgets and
    preemption set up caches that the running requests outgrow."""
    return Scheduler(Config(**{"new_token_ratio": 0.0, **kw}), BlockManager(num_blocks, block_size), eos_token_ids=[0])


def test_prefill_respects_the_sequence_and_token_budgets():
    s = scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for n in (10, 10, 10):
        s.add(Sequence([1] * n))
    output = s.schedule()
    assert output.is_prefill and len(output.scheduled) == 2 and len(s.waiting) == 1


def test_a_long_prompt_is_prefilled_in_chunks():
    s = scheduler(num_blocks=16, max_num_batched_tokens=8)
    seq = Sequence(list(range(1, 21)))
    s.add(seq)
    chunks = []
    while seq.num_completion_tokens == 0:
        seqs, is_prefill = run_step(s)
        chunks.append(seq.num_scheduled_tokens)
    assert chunks == [8, 8, 4] and seq.status == SequenceStatus.RUNNING


def test_a_mixed_step_decodes_the_running_then_prefills_in_what_is_left():
    s = scheduler(max_num_batched_tokens=6)
    first = Sequence([1, 2, 3])
    s.add(first)
    run_step(s)
    second = Sequence([4, 5, 6, 7, 8, 9])
    s.add(second)
    seqs, is_prefill = run_step(s)  # first's token, then 5 of second's 6 (the budget left)
    assert is_prefill and seqs == [first, second] and [x.num_scheduled_tokens for x in seqs] == [1, 5]
    assert first.num_completion_tokens == 2 and second.num_completion_tokens == 0
    seqs, is_prefill = run_step(s)  # first's token and second's last prompt token: a decode row like first's
    assert not is_prefill and [x.num_scheduled_tokens for x in seqs] == [1, 1] and second.num_completion_tokens == 1
    seqs, is_prefill = run_step(s)
    assert not is_prefill and seqs == [first, second]


def test_without_mixed_steps_prefill_comes_before_decode():
    s = scheduler(mixed_steps=False)
    s.add(Sequence([1, 2, 3]))
    run_step(s)
    s.add(Sequence([4, 5]))
    seqs, is_prefill = run_step(s)
    assert is_prefill and [len(x) for x in seqs] == [3]
    seqs, is_prefill = run_step(s)
    assert not is_prefill and len(seqs) == 2


@pytest.mark.parametrize("mixed", [True, False])
def test_running_requests_get_a_token_every_step_only_with_mixed_steps(mixed):
    """The stall of chapter 06: a long prompt arrives while requests decode. Mixed, each step gives every
    running request a token; separate, the prompt's chunks are steps without one."""
    s = scheduler(num_blocks=64, max_num_batched_tokens=16, mixed_steps=mixed)
    running = [Sequence([i + 1] * 4, SamplingParams(max_tokens=30)) for i in range(4)]
    for seq in running:
        s.add(seq)
    run_step(s)
    s.add(Sequence([9] * 100))
    steps_without_token = 0
    for _ in range(10):
        before = [seq.num_completion_tokens for seq in running]
        run_step(s)
        steps_without_token += all(seq.num_completion_tokens == n for seq, n in zip(running, before))
    assert steps_without_token == (0 if mixed else 7)  # 100 tokens in chunks of 16: 6 full chunks, the 7th at 4


def test_long_prefill_token_threshold_caps_a_prompts_chunk():
    s = scheduler(num_blocks=16, max_num_batched_tokens=100, long_prefill_token_threshold=8)
    seq = Sequence(list(range(1, 21)))
    s.add(seq)
    chunks = []
    while seq.num_completion_tokens == 0:
        run_step(s)
        chunks.append(seq.num_scheduled_tokens)
    assert chunks == [8, 8, 4]


def test_a_step_that_preempts_admits_no_one():
    s = scheduler(num_blocks=3, block_size=2)
    old, new = Sequence([1, 2]), Sequence([3, 4])
    s.add(old), s.add(new)
    run_step(s)  # one block each, a sampled token each
    seqs, is_prefill = run_step(s)  # old takes the last block, new is preempted and is not readmitted at once
    assert seqs == [old] and not is_prefill and s.waiting[0] is new


def test_preemption_takes_the_lowest_priority_and_requeues_it():
    s = scheduler(num_blocks=3, block_size=2, scheduling_policy="priority")
    low, high = Sequence([1, 2], priority=0), Sequence([3, 4], priority=9)
    s.add(low), s.add(high)
    run_step(s)  # both prefilled: one full block each, plus a sampled token each
    run_step(s)  # decode: high first takes the last free block; low then has none -> low is preempted
    assert low.status == SequenceStatus.WAITING and not low.block_table and s.waiting[0] is low
    assert high.status == SequenceStatus.RUNNING
    assert s.block_manager.num_free_blocks == 1


def test_fcfs_preempts_the_newest():
    s = scheduler(num_blocks=3, block_size=2)
    old, new = Sequence([1, 2]), Sequence([3, 4])
    s.add(old), s.add(new)
    run_step(s)
    run_step(s)
    assert new.status == SequenceStatus.WAITING and old.status == SequenceStatus.RUNNING


def test_finish_on_eos_or_max_tokens_frees_blocks():
    s = scheduler()
    eos, capped = Sequence([1, 2]), Sequence([3], SamplingParams(max_tokens=2))
    s.add(eos), s.add(capped)
    s.update_from_output(s.schedule(), [[0], [5]])  # eos gets EOS (id 0)
    assert eos.finish_reason == "stop" and not eos.block_table
    run_step(s)
    assert capped.finish_reason == "length" and capped.completion_token_ids == [5, 7]
    assert s.is_finished() and s.block_manager.num_free_blocks == 16


def test_ignore_eos_keeps_going():
    s = scheduler()
    seq = Sequence([1], SamplingParams(max_tokens=3, ignore_eos=True))
    s.add(seq)
    for _ in range(3):
        run_step(s, token=0)
    assert seq.finish_reason == "length" and seq.completion_token_ids == [0, 0, 0]


def recomputed_tokens(new_token_ratio: float) -> tuple[int, int]:
    """Run 6 requests (8-token prompts, 24 tokens each) on a cache of 20 blocks of 4 (80 slots; together they need
    192): the tokens computed beyond the 6 x (8 + 24) needed, which preemptions recompute, and the peak batch."""
    s = scheduler(num_blocks=20, new_token_ratio=new_token_ratio)
    for i in range(6):
        s.add(Sequence(list(range(10 * i + 1, 10 * i + 9)), SamplingParams(max_tokens=24, ignore_eos=True)))
    computed, peak = 0, 0
    while not s.is_finished():
        seqs, _ = run_step(s)
        computed += sum(seq.num_scheduled_tokens for seq in seqs)
        peak = max(peak, len(s.running))
    return computed - 6 * (8 + 24 - 1), peak  # the last token is sampled, never computed


def test_admission_keeps_room_for_the_running_requests_growth():
    """Admitting whatever fits (ratio 0, vLLM's way) overfills the cache and recomputes preempted requests; with
    room kept for the whole remaining max_tokens (ratio 1) nothing is recomputed and fewer requests run at once."""
    wasted, peak = recomputed_tokens(0.0)
    assert wasted > 0 and peak >= 4
    wasted, peak = recomputed_tokens(1.0)
    assert wasted == 0 and peak == 2


@pytest.mark.parametrize("ratio", [-0.1, 1.5, "half"])
def test_new_token_ratio_is_checked(ratio):
    with pytest.raises(ValueError, match="new_token_ratio must be a number in \\[0, 1\\]"):
        Config(new_token_ratio=ratio)


@pytest.mark.parametrize("free_order", ["oldest first", "newest first"])
def test_a_block_is_findable_by_hash_only_once_a_step_wrote_it(monkeypatch, free_order):
    """Hashed => written. A decode step hashes the block it fills when it is scheduled; when the same step then
    preempts that sequence (`high` needs a block, `low` has the lowest priority), the step never runs for it and
    the block's last slot is never written. No later prompt may find that block by its hash, whatever order the
    free list hands blocks out in (oldest first hands that very block to `high` at once, which hid the fault)."""
    if free_order == "newest first":
        monkeypatch.setattr(FreeBlockQueue, "oldest", lambda self: next(reversed(self._ids)))
    s = scheduler(num_blocks=4, block_size=4, scheduling_policy="priority", mixed_steps=False)  # one kind a step
    bm = s.block_manager
    low = Sequence([1, 2, 3, 4, 5, 6, 7], priority=0)
    high = Sequence([9, 8, 7, 6, 5, 4, 3, 2], SamplingParams(max_tokens=2), priority=1)
    s.add(low)
    run_step(s)  # low is prefilled first (so it runs first): 2 blocks, 8 tokens now
    s.add(high)
    run_step(s)  # then high: 2 blocks, 9 tokens; the cache is full
    unwritten = low.block_table[1]  # positions 4-7: the next decode step writes position 7
    output = s.schedule()  # low's decode is scheduled (hashing that block), then high needs a block: low preempted
    assert output.scheduled == [high] and low.status == SequenceStatus.WAITING
    assert bm.hash_to_block_id.get(bm.blocks[unwritten].hash) != unwritten
    s.update_from_output(output, [[7]])  # high finishes (max_tokens 2): every block is free
    run_step(s)  # low is recomputed, into blocks that are written this time
    later = Sequence(low.token_ids[:8] + [11])  # low's two full blocks, then its own token
    bm.allocate(later)
    assert later.num_cached_tokens == 8 and later.block_table[:2] == low.block_table[:2]


def test_a_prompt_part_way_through_its_chunks_runs_and_no_step_is_empty():
    """The fault vLLM V1's shape removes: a prompt part-way through its chunks held blocks while it waited; when
    the only running request had to preempt itself, the step that preempted admitted no one and was empty (the
    engine raised "nothing to run"). Now the partial prompt is running: the decoding request evicts it instead."""
    s = scheduler(num_blocks=10, max_num_batched_tokens=4)
    short = Sequence(list(range(1, 5)), SamplingParams(max_tokens=20, ignore_eos=True))
    long = Sequence(list(range(10, 42)), SamplingParams(max_tokens=4, ignore_eos=True))
    s.add(short), s.add(long)
    steps = 0
    while not s.is_finished():
        seqs, _ = run_step(s)
        assert seqs, f"step {steps} is empty with {len(s.waiting)} waiting and {len(s.running)} running"
        if long.block_table:
            assert long.status == SequenceStatus.RUNNING, "a request holding blocks is running"
        steps += 1
    assert s.num_preemptions and short.num_completion_tokens == 20 and long.num_completion_tokens == 4
    assert s.block_manager.num_free_blocks == 10


def test_every_running_request_gets_its_own_token_before_any_draft():
    """Drafts come second: a's drafts would take the last free block, which b needs for its own next token (old
    code: one pass handed a its drafts first, then preempted b). Now b gets the block and a's drafts are cut."""
    s = scheduler(num_blocks=3, block_size=4)
    a, b = Sequence([1, 2, 3]), Sequence([4, 5, 6, 7])
    s.add(a), s.add(b)
    run_step(s)  # a: 4 tokens in its block; b: 5 tokens, its next one needs a second block; 1 block free
    a.draft_token_ids = [8, 9]
    output = s.schedule()
    assert output.scheduled == [a, b] and s.num_preemptions == 0
    assert (a.spec_token_ids, a.num_scheduled_tokens, b.num_scheduled_tokens) == ([], 1, 1)
    assert s.block_manager.num_free_blocks == 0 and len(b.block_table) == 2


def test_drafts_are_scheduled_within_the_budget_and_the_free_blocks():
    s = scheduler(num_blocks=4, block_size=2, max_num_batched_tokens=4)
    a, b = Sequence([1]), Sequence([4])
    s.add(a), s.add(b)
    run_step(s)  # 2 tokens each, 1 block each, 2 free
    a.draft_token_ids, b.draft_token_ids = [8, 9, 10], [8, 9]
    s.schedule()  # budget 4: the two own tokens, then 2 drafts for a; none is left for b
    assert (a.spec_token_ids, b.spec_token_ids) == ([8, 9], [])
    assert (a.num_scheduled_tokens, b.num_scheduled_tokens) == (3, 1) and len(a.block_table) == 2
