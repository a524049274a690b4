"""Chapter 06 exercises: top-k/top-p truncation (06.1), prefill selection (06.2), preemption (06.3) and
update_from_output (06.4).

The scheduler pieces are checked on hand-made queues (no model needed; your method runs inside minillm's
Scheduler, with the reference for the rest), then the engine runs with your code on a batch of prompts under a
tiny token budget and a tiny KV cache, so that chunked prefill and preemption both happen: every request must
still get exactly the tokens it gets alone.

    python -m minillm.course grade 06
"""

import pytest
import torch
from scheduling import run_step  # tests/ is on sys.path

from minillm import LLM, SamplingParams
from minillm.config import Config
from minillm.course import use_impl
from minillm.engine.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.models import build_model
from minillm.naive import generate_naive


def keep_top(logits, k, p):
    """Which tokens survive top-k then top-p (on the top-k renormalised), one row at a time, written plainly."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])[: k or len(logits)]
    probs = torch.softmax(logits[order], -1)  # renormalised over the top-k
    kept, total = set(), 0.0
    for rank, i in enumerate(order):
        if total >= p:
            break
        kept.add(i)
        total += float(probs[rank])
    return kept


@pytest.mark.exercise("06.1")
def test_top_k_top_p_masks_exactly_the_truncated_tokens(impl):
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 2
    top_k, top_p = torch.tensor([0, 5, 0, 3]), torch.tensor([1.0, 1.0, 0.6, 0.5])
    out = impl.apply_top_k_top_p(logits, top_k, top_p)
    for row in range(4):
        kept = {i for i in range(50) if out[row, i] > float("-inf")}
        assert kept == keep_top(logits[row], int(top_k[row]), float(top_p[row])), f"row {row}"
        assert torch.equal(out[row, sorted(kept)], logits[row, sorted(kept)]), "kept logits stay as they were"


@pytest.mark.exercise("06.1")
def test_top_p_of_one_keeps_every_token_of_a_peaked_row(impl):
    """In float32 the running sum of a peaked 4096-token row reaches 1.0 long before its tail: top_p=1 still
    keeps all (and with top_k, all k)."""
    logits = torch.linspace(30, -30, 4096).unsqueeze(0).repeat(2, 1)
    out = impl.apply_top_k_top_p(logits, torch.tensor([0, 3000]), torch.tensor([1.0, 1.0]))
    assert torch.isfinite(out).sum(dim=-1).tolist() == [4096, 3000]


@pytest.mark.exercise("06.1")
def test_top_p_applies_to_the_top_k_renormalised(impl):
    """The docstring's example: top-p over the full distribution would keep three tokens, not two."""
    logits = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]]).log()
    out = impl.apply_top_k_top_p(logits, torch.tensor([3]), torch.tensor([0.6]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False, False], (
        "top-k first, then top-p on the k survivors' renormalised probabilities"
    )
    assert torch.equal(logits, torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]]).log()), "logits must not be modified"


def scheduler(num_blocks=16, block_size=4, **config):
    return Scheduler(
        Config(**{"new_token_ratio": 0.0, **config}), BlockManager(num_blocks, block_size), eos_token_ids=[0]
    )


@pytest.mark.exercise("06.2")
def test_prefill_admits_under_the_sequence_budget(impl):
    with use_impl(impl, "06.2"):
        s = scheduler(max_num_seqs=2)
        for n in (10, 11, 12):
            s.add(Sequence(list(range(1, n + 1))))
        seqs = s.schedule_prefill(100)
        assert [len(x) for x in seqs] == [10, 11] and len(s.waiting) == 1
        assert all(x.status == SequenceStatus.RUNNING and x.block_table for x in seqs)


@pytest.mark.exercise("06.2")
def test_prefill_chunks_a_prompt_longer_than_the_token_budget(impl):
    with use_impl(impl, "06.2"):
        s = scheduler(max_num_batched_tokens=8)
        seq = Sequence(list(range(1, 21)))
        s.add(seq)
        chunks = []
        while not seq.completion_token_ids:
            run_step(s)
            chunks.append(seq.num_scheduled_tokens)
            assert seq.status == SequenceStatus.RUNNING, "admitted with its first chunk, it runs from then on"
        assert chunks == [8, 8, 4]


@pytest.mark.exercise("06.2")
def test_prefill_takes_what_the_decode_tokens_left_and_caps_a_chunk(impl):
    with use_impl(impl, "06.2"):
        s = scheduler(max_num_batched_tokens=100, long_prefill_token_threshold=8)
        a, b = Sequence(list(range(1, 6))), Sequence(list(range(1, 21)))
        s.add(a), s.add(b)
        seqs = s.schedule_prefill(9)  # 9 tokens left: all 5 of a, then 4 of b (under the cap of 8)
        assert seqs == [a, b] and [x.num_scheduled_tokens for x in seqs] == [5, 4], (
            "schedule_prefill(budget) spends `budget`, not max_num_batched_tokens"
        )
        assert list(s.running) == [a, b] and not s.waiting, "b runs with its first chunk: it holds blocks"
        c = Sequence(list(range(1, 21)))
        s.add(c)
        assert s.schedule_prefill(50) == [c] and c.num_scheduled_tokens == 8, (
            "a prompt's chunk is at most long_prefill_token_threshold tokens (when it is above 0)"
        )
        assert s.schedule_prefill(0) == [], "no budget left: nothing is scheduled"


@pytest.mark.exercise("06.2")
def test_prefill_waits_when_the_cache_is_full(impl):
    with use_impl(impl, "06.2"):
        s = scheduler(num_blocks=3, block_size=4)
        first, second = Sequence(list(range(1, 9))), Sequence(list(range(20, 28)))
        s.add(first), s.add(second)
        output = s.schedule()
        assert output.scheduled == [first] and s.waiting[0] is second and not second.block_table


@pytest.mark.exercise("06.3")
def test_preemption_frees_the_lowest_priority_sequence(impl):
    with use_impl(impl, "06.3"):
        s = scheduler(num_blocks=3, block_size=2, scheduling_policy="priority")
        low, high = Sequence([1, 2], priority=0), Sequence([3, 4], priority=5)
        s.add(low), s.add(high)
        run_step(s)
        run_step(s)
        assert low.status == SequenceStatus.WAITING and not low.block_table and s.waiting[0] is low
        assert high.status == SequenceStatus.RUNNING and len(high.block_table) == 2


@pytest.mark.exercise("06.4")
def test_update_from_output_appends_finishes_and_frees(impl):
    with use_impl(impl, "06.4"):
        s = scheduler()
        eos, capped, chunked = Sequence([1, 2]), Sequence([3], SamplingParams(max_tokens=1)), Sequence([5, 6, 7])
        for seq in (eos, capped, chunked):
            s.add(seq)
        output = s.schedule()
        chunked.num_scheduled_tokens = 2  # pretend its prefill was cut short: no token is sampled for it
        assert s.update_from_output(output, [[0], [9], []]) == [eos, capped]
        assert (eos.finish_reason, eos.completion_token_ids, eos.block_table) == ("stop", [0], [])
        assert (capped.finish_reason, capped.completion_token_ids) == ("length", [9])
        assert chunked.finish_reason is None and chunked.num_computed_tokens == 2 and len(chunked) == 3
        assert list(s.running) == [chunked]


@pytest.mark.exercise("06.4")
def test_update_from_output_stops_at_the_token_that_finishes(impl):
    with use_impl(impl, "06.4"):
        s = scheduler()
        two, stopped = Sequence([1, 2], SamplingParams(max_tokens=2)), Sequence([3], SamplingParams(stop_token_ids=[8]))
        s.add(two), s.add(stopped)
        s.update_from_output(s.schedule(), [[4, 5, 6], [7, 8, 9]])  # several tokens: as a verify step gives them
        assert (two.completion_token_ids, two.finish_reason) == ([4, 5], "length"), "max_tokens reached at 5"
        assert (stopped.completion_token_ids, stopped.finish_reason) == ([7, 8], "stop"), "8 is a stop token"
        assert not (two.block_table or stopped.block_table or s.running)


@pytest.fixture(scope="module")
def engine_reference(tiny_checkpoint):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 256, (n,), generator=g).tolist() for n in (30, 5, 18, 11)]
    model = build_model(tiny_checkpoint)
    return prompts, [list(generate_naive(model, p, 16)) for p in prompts]


@pytest.mark.parametrize(
    "exercise", [pytest.param(e, marks=pytest.mark.exercise(e)) for e in ("06.1", "06.2", "06.3", "06.4")]
)
def test_the_engine_runs_on_your_code(impl, tiny_checkpoint, engine_reference, exercise):
    """Top-k 1 or a tiny top-p keeps only the most likely token, so sampling with them must give the greedy
    tokens (a greedy batch never truncates, so this is how the engine gets to run your 06.1)."""
    prompts, expected = engine_reference
    truncating = [
        SamplingParams(temperature=1.0, top_k=1, max_tokens=16),
        SamplingParams(temperature=0.7, top_p=1e-6, max_tokens=16),
    ]
    with use_impl(impl, exercise):
        llm = LLM(tiny_checkpoint, max_num_batched_tokens=16, kvcache_block_size=4, num_kvcache_blocks=14)
        outputs = llm.generate(prompts, [truncating[i % 2] for i in range(len(prompts))], use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    assert llm.is_finished() and llm.block_manager.num_free_blocks == 14
