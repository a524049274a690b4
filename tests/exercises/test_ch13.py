"""Chapter 13 exercises: n-gram lookup (13.1), greedy verification (13.2), rejection sampling (13.3) and the KV
rollback of rejected drafts (13.4).

Each piece is checked on hand-made inputs, rejection sampling by the distribution of many seeded draws (a chi-square
test against the target's own distribution), then the engine runs with your code and speculation on: greedy
output must be the tokens the tiny model gives alone, with no KV block left behind.

    python -m minillm.course grade 13
"""

import random

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import Config
from minillm.course import use_impl
from minillm.engine.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.models import build_model
from minillm.naive import generate_naive
from minillm.course.stats import chi_square_pvalue


def plain_lookup(ids, k, n_max, n_min):
    """n-gram lookup written as plainly as possible: the reference for random inputs."""
    for n in range(min(n_max, len(ids) - 1), n_min - 1, -1):
        for i in range(len(ids) - n - 1, -1, -1):
            if ids[i : i + n] == ids[len(ids) - n :]:
                return ids[i + n : i + n + k]
    return []


@pytest.mark.exercise("13.1")
def test_lookup_finds_the_most_recent_earlier_occurrence(impl):
    assert impl.ngram_propose([1, 2, 3, 4, 1, 2], 2, 2, 1) == [3, 4]
    assert impl.ngram_propose([5, 1, 2, 9, 1, 2, 7, 1, 2], 3, 2, 2) == [7, 1, 2], "the most recent occurrence"
    assert impl.ngram_propose([1, 2, 3], 4, 3, 1) == [], "no earlier occurrence: no drafts"
    assert impl.ngram_propose([7], 3, 2, 1) == [], "one token has nothing before it"


@pytest.mark.exercise("13.1")
def test_lookup_prefers_the_longest_match_and_stops_at_the_end(impl):
    ids = [4, 2, 3, 8, 9, 1, 2, 3, 6, 2, 3]
    assert impl.ngram_propose(ids, 2, 1, 1) == [6, 2], "n=1: the newest token, 3, occurred last at 7, before 6, 2"
    assert impl.ngram_propose([9, 5, 6, 1, 5, 6, 2, 9, 5, 6], 1, 3, 1) == [1], (
        "[9, 5, 6] matches at 0 (followed by 1): the longest n wins over the more recent [5, 6] at 4"
    )
    assert impl.ngram_propose([3, 3, 3], 5, 2, 1) == [3], "the drafts stop where the text ends"
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        k, n_min = rng.randrange(1, 6), rng.randrange(1, 4)
        n_max = n_min + rng.randrange(0, 3)
        assert impl.ngram_propose(ids, k, n_max, n_min) == plain_lookup(ids, k, n_max, n_min), (ids, k, n_max, n_min)


def batch(rows: list[list[int]], k: int):
    """Ragged drafts as the padded [B, k] tensor and their counts."""
    return torch.tensor([r + [0] * (k - len(r)) for r in rows]).view(len(rows), k), torch.tensor([len(r) for r in rows])


@pytest.mark.exercise("13.2")
def test_greedy_accept_keeps_the_agreeing_prefix_then_the_targets_token(impl):
    drafts, counts = batch([[5, 6, 9], [5], [5, 6, 7], []], 3)
    target = torch.tensor([[5, 6, 7, 8], [4, 6, 0, 0], [5, 6, 7, 1], [3, 3, 3, 3]])
    out = impl.greedy_accept(target, drafts, counts)
    assert out.tolist() == [[5, 6, 7, -1], [4, -1, -1, -1], [5, 6, 7, 1], [3, -1, -1, -1]], (
        "row 0: two kept, then the target's 7; row 1: the first draft wrong; row 2: all kept and the bonus; "
        "row 3: no drafts, the target's token"
    )
    drafts, counts = batch([[1, 2], [1, 9]], 3)
    out = impl.greedy_accept(torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]]), drafts, counts)
    assert out.tolist() == [[1, 2, 3, -1], [1, 2, -1, -1]], "padding after a row's drafts is never compared"


def sample_batch(impl, p, drafts, q, n, seed=0, d_from_q=False):
    """n rows of one sequence's verification, each with its own seeded uniforms and noise: [n, k + 1] tokens."""
    g = torch.Generator().manual_seed(seed)
    k = len(drafts)
    ids = torch.tensor(drafts).expand(n, k).clone()
    if d_from_q:  # each row's draft drawn from q
        ids = torch.multinomial(q[0], n, replacement=True, generator=g)[:, None]
    uniform = torch.rand(n, k, dtype=torch.float64, generator=g)
    exponential = torch.empty(n, p.shape[-1]).exponential_(generator=g)
    qs = None if q is None else q.expand(n, *q.shape)
    return impl.rejection_sample(p.expand(n, *p.shape), ids, torch.full((n,), k), qs, uniform, exponential)


@pytest.mark.exercise("13.3")
def test_a_looked_up_draft_leaves_the_targets_distribution_unchanged(impl):
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    for draft in (0, 3, 4):  # a likely draft, an unlikely one, one the target never picks
        out = sample_batch(impl, p, [draft], None, 4000)
        counts = torch.bincount(out[:, 0], minlength=5)
        assert counts[4] == 0, "a token of probability 0 must never come out"
        assert chi_square_pvalue(counts, p[0]) > 0.001, (
            f"draft {draft}: the first token's counts {counts.tolist()} are not distributed as p {p[0].tolist()}"
        )


@pytest.mark.exercise("13.3")
def test_a_drawn_draft_is_corrected_by_the_residual(impl):
    p = torch.tensor([[0.1, 0.6, 0.3], [0.3, 0.3, 0.4]])
    q = torch.tensor([[0.7, 0.2, 0.1]])  # a draft model that is often wrong: its favourite is the target's least
    out = sample_batch(impl, p, [0], q, 4000, seed=1, d_from_q=True)
    assert chi_square_pvalue(torch.bincount(out[:, 0], minlength=3), p[0]) > 0.001


@pytest.mark.exercise("13.3")
def test_accepted_drafts_are_followed_by_the_bonus_and_rows_are_independent(impl):
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]] * 3)
    drafts, counts = batch([[1, 2], [0, 2], [1]], 2)
    uniform, noise = torch.full((3, 2), 0.5, dtype=torch.float64), torch.ones(3, 3)
    out = impl.rejection_sample(p, drafts, counts, None, uniform, noise)
    assert out[0].tolist() == [1, 2, 0], "certain drafts are kept, then the bonus from the row after them"
    assert out[1].tolist() == [1, -1, -1], "a draft of probability 0 is replaced, the rest dropped"
    assert out[2].tolist() == [1, 2, -1], "one draft: kept, then the bonus from its own second row"


@pytest.mark.exercise("13.3")
def test_u_of_exactly_zero_keeps_no_draft_of_probability_zero_and_a_zero_residual_falls_back_to_p(impl):
    """A uniform can be exactly 0: u * q(d) <= p(d) would then keep a draft the target never picks. And p, q
    that differ only by rounding can leave max(p - q, 0) all zeros after a rejection."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [1 / 3] * 3]])
    zero = torch.zeros(1, 1, dtype=torch.float64)
    out = impl.rejection_sample(p, torch.tensor([[0]]), torch.tensor([1]), None, zero, torch.ones(1, 3))
    assert out[0, 0] != 0, "u = 0 kept a draft of probability 0"
    q = torch.tensor([[[0.5, 0.5, 0.0]]])
    below = torch.tensor([[[0.5 - 1e-7, 0.5 - 1e-7, 0.0], [1 / 3] * 3]])  # p <= q everywhere: the residual is 0
    almost_one = torch.full((1, 1), 0.9999999, dtype=torch.float64)  # rejects draft 0
    noise = torch.tensor([[1.0, 0.5, 1.0]])
    out = impl.rejection_sample(below, torch.tensor([[0]]), torch.tensor([1]), q, almost_one, noise)
    assert out[0, 0] == 1, "a zero residual must fall back to p (argmax(p / noise) is token 1 here)"


def scheduler(num_blocks=16, block_size=4):
    return Scheduler(Config(new_token_ratio=0.0), BlockManager(num_blocks, block_size), eos_token_ids=[0])


def verifying(s, prompt, drafts):
    """A running sequence of `prompt` with one sampled token, and the plan of a step that verifies `drafts`."""
    seq = Sequence(prompt)
    s.add(seq)
    s.update_from_output(s.schedule(), [[5]])
    seq.draft_token_ids = list(drafts)
    output = s.schedule()
    assert seq.num_scheduled_tokens == 1 + len(drafts) and seq.spec_token_ids == list(drafts)
    return seq, output


@pytest.mark.exercise("13.4")
def test_rollback_uncounts_the_rejected_drafts_and_frees_their_blocks(impl):
    with use_impl(impl, "13.4"):
        s = scheduler()
        seq, _ = verifying(s, [1, 2, 3, 4, 5], [40, 50, 60])
        assert len(seq.block_table) == 3 and seq.num_computed_tokens == 5
        seq.num_computed_tokens += seq.num_scheduled_tokens  # what update_from_output does first
        s.drop_rejected_drafts(seq, 1)
        assert seq.num_computed_tokens == 7, "the newest token and the kept draft are computed; the rejected are not"
        assert len(seq.block_table) == 2, "blocks for the 8 tokens seq will hold; the third held only rejected drafts"
        assert seq.spec_token_ids == [] and s.block_manager.num_free_blocks == 14
        assert seq.token_ids == [1, 2, 3, 4, 5, 5], "the kept draft is appended by update_from_output, not here"


@pytest.mark.exercise("13.4")
def test_a_verify_step_keeps_the_accepted_drafts_and_the_targets_token(impl):
    with use_impl(impl, "13.4"):
        s = scheduler()
        seq, output = verifying(s, [1, 2, 3, 4, 5], [40, 50, 60])
        assert s.update_from_output(output, [[40, 41]]) == [seq]
        assert seq.token_ids == [1, 2, 3, 4, 5, 5, 40, 41] and seq.num_computed_tokens == 7
        assert len(seq.block_table) == 2 and seq.spec_token_ids == []
        s = scheduler()
        seq, output = verifying(s, [1, 2, 3, 4, 6], [40, 0, 60])
        s.update_from_output(output, [[40, 0, 61]])
        assert seq.token_ids == [1, 2, 3, 4, 6, 5, 40, 0] and not seq.block_table, (
            "EOS (id 0) among the kept drafts ends the request: what follows is dropped"
        )
        s = scheduler()
        seq, output = verifying(s, [9, 9, 9, 9, 9, 9, 9, 9], [1, 2, 3])
        s.update_from_output(output, [[7]])
        assert seq.num_computed_tokens == 9 and len(seq.block_table) == 3, (
            "all drafts rejected: only the newest token is computed, blocks for its 10 tokens stay"
        )


@pytest.fixture(scope="module")
def engine_reference(tiny_checkpoint):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 256, (n,), generator=g).tolist() for n in (30, 5, 18, 11)]
    prompts.append(prompts[0][:10] * 3)  # repeats: lookup finds long matches
    model = build_model(tiny_checkpoint)
    return prompts, [list(generate_naive(model, p, 24)) for p in prompts]


@pytest.mark.parametrize(
    "exercise", [pytest.param(e, marks=pytest.mark.exercise(e)) for e in ("13.1", "13.2", "13.4")]
)
def test_the_engine_speculates_on_your_code(impl, tiny_checkpoint, engine_reference, exercise):
    prompts, expected = engine_reference
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with use_impl(impl, exercise):
        llm = LLM(tiny_checkpoint, kvcache_block_size=4, num_kvcache_blocks=40, speculative_config=spec)
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected, "greedy speculation must give the tokens of plain decoding"
    stats = llm.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "drafts were both kept and rolled back"
    free = llm.block_manager.num_free_blocks
    assert free == 40, "no KV block is left behind"
