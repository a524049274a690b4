"""Chapter 07 exercises: the decode buckets (07.1), picking a batch's bucket (07.2), padding a batch to its
bucket (07.3).

Each is checked on its own; then your padding drives a real engine whose decode steps run per bucket: its
greedy tokens must equal the naive loop's, and padded rows must write only into the cache's spare block.

    python -m minillm.course grade 07
"""

import pytest
import torch

from minillm import LLM, SamplingParams, default_model_path
from minillm.course import use_impl
from minillm.models import build_model
from minillm.naive import generate_naive


@pytest.mark.exercise("07.1")
@pytest.mark.parametrize(
    "max_batch, expected",
    [
        (256, [1, 2, 4, 8] + list(range(16, 257, 16))),
        (512, [1, 2, 4, 8] + list(range(16, 513, 16))),
        (20, [1, 2, 4, 8, 16]),
        (16, [1, 2, 4, 8, 16]),
        (8, [1, 2, 4, 8]),
        (3, [1, 2]),
        (1, [1]),
    ],
)
def test_decode_buckets(impl, max_batch, expected):
    assert impl.decode_buckets(max_batch) == expected


@pytest.mark.exercise("07.2")
@pytest.mark.parametrize(
    "batch, expected", [(1, 1), (2, 2), (3, 4), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32), (33, None), (100, None)]
)
def test_pick_bucket(impl, batch, expected):
    assert impl.pick_bucket([1, 2, 4, 8, 16, 32], batch) == expected


def buffers(rows=6, width=3):
    """Input buffers whose rows all hold a real-looking step (values 5..), as the model runner's would."""
    return [torch.arange(5, 5 + rows) for _ in range(4)] + [torch.arange(rows * width).view(rows, width) + 5]


@pytest.mark.exercise("07.3")
@pytest.mark.parametrize("batch, bucket", [(3, 4), (1, 2), (5, 5), (0, 4)])
def test_pad_decode_inputs(impl, batch, bucket):
    bufs = buffers()
    before = [b.clone() for b in bufs]
    assert impl.pad_decode_inputs(*bufs, batch, bucket) is None
    input_ids, positions, slot_mapping, context_lens, block_tables = bufs
    pad = slice(batch, bucket)
    assert (input_ids[pad] == 0).all() and (positions[pad] == 0).all()
    assert (slot_mapping[pad] == -1).all(), "padded rows write to PAD_SLOT_ID, the spare slot -1"
    assert (context_lens[pad] == 1).all() and (block_tables[pad] == 0).all()
    for b, old in zip(bufs, before):  # the real rows and the rows past the bucket keep their values
        assert torch.equal(b[:batch], old[:batch]) and torch.equal(b[bucket:], old[bucket:])


@pytest.mark.exercise("07.3")
def test_your_padding_runs_the_engine(impl):
    """Decode batches of 5 (padded to 8), 4, 3 (padded to 4), 2 and 1, each padded by your pad_decode_inputs.
    The buckets' steps replay the model eagerly here (compiling them is the engine's business and takes
    seconds each), so what is tested is yours: the padded rows change no sequence's tokens and write only
    into the spare block."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 11, 6, 9, 3)]
    params = [SamplingParams(temperature=0, max_tokens=2 + 2 * i, ignore_eos=True) for i in range(5)]
    with use_impl(impl, "07.3"):
        llm = LLM(max_num_seqs=8, num_kvcache_blocks=32, enforce_eager=False)
        runner = llm.model_runner
        runner.graphs.compiled = runner.model  # a test double for the compiled model: the same forward, eager
        spare = runner.kv_cache[:, :, -1].clone()
        outputs = llm.generate(prompts, params, use_tqdm=False)
    model = build_model(default_model_path())
    tokens = [o.token_ids for o in outputs]
    alone = [list(generate_naive(model, p, sp.max_tokens)) for p, sp in zip(prompts, params)]
    buckets_used, free = sorted(runner.graphs.build_seconds), llm.block_manager.num_free_blocks
    spare_written = not torch.equal(runner.kv_cache[:, :, -1], spare)
    assert tokens == alone, "with your padding, a sequence's tokens changed"
    assert buckets_used == [1, 2, 4, 8] and free == 32
    assert spare_written, "padded rows write into the spare block (slot -1)"
