"""Chapter 16 exercises: applying a grammar's token bitmask to a batch of logits (16.1), the repetition, frequency
and presence penalties (16.2), and the copy-on-write of a shared block (16.3).

Checked on hand-made words (all ones, none, the sign bit), then against xgrammar's own kernel on random bitmasks
of several vocabulary sizes, then inside minillm: the engine's masking step runs your function where it does not
use xgrammar's kernel, and a JSON schema compiled against the default model's vocabulary is walked, token by token,
by taking the largest logit that your mask leaves. The penalties are checked against a token-by-token reference,
then in the engine: greedy answers with penalties follow the reference on the default model's logits. Copy-on-write
is checked on a hand-made fork, then in the engine: four answers to one prompt share its blocks, each copies the
shared last block before it writes, and every block comes back.

    python -m minillm.course grade 16
"""

import json

import jsonschema
import pytest
import torch
import xgrammar as xgr

from minillm import LLM, SamplingParams, default_model_path
from minillm.course import use_impl
from minillm.engine.sequence import Sequence
from minillm.sampling_params import StructuredOutputsParams
from minillm.structured_output import StructuredOutputManager, allocate_bitmask, apply_bitmask_inplace
from minillm.tokenizer import Tokenizer

INF = float("-inf")


# --- 16.1: applying a token bitmask ---------------------------------------------------------------------------------


def xgrammar_masked(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """What xgrammar's kernel makes of the logits (on a copy)."""
    out = logits.clone()
    xgr.apply_token_bitmask_inplace(out, bitmask, vocab_size=logits.shape[-1])
    return out


@pytest.mark.exercise("16.1")
def test_the_docstring_example(impl):
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = impl.apply_token_bitmask(logits, torch.tensor([[0b0101]], dtype=torch.int32))
    assert torch.equal(out, torch.tensor([[1.0, INF, 3.0, INF]])), "bit 0 is token 0, bit 2 token 2"


@pytest.mark.exercise("16.1")
def test_a_word_of_ones_of_zeros_and_the_sign_bit_alone(impl):
    logits = torch.arange(2 * 96, dtype=torch.float32).view(2, 96)
    kept = logits.clone()
    bitmask = torch.tensor([[-1, 0, -(2**31)], [1, 1 << 30, 0]], dtype=torch.int32)
    out = impl.apply_token_bitmask(logits, bitmask)
    assert torch.equal(logits, kept), "the input logits must not change: return a new tensor"
    assert out.shape == logits.shape and out.dtype == logits.dtype
    assert torch.equal(out[0, :32], logits[0, :32]), "a word of -1 allows all 32 of its tokens"
    assert torch.isinf(out[0, 32:64]).all(), "a word of 0 allows none of its tokens"
    assert torch.isinf(out[0, 64:95]).all() and out[0, 95] == logits[0, 95], (
        "-2**31 has only the sign bit set: token 31 of its word (95 here), not the 31 below it"
    )
    allowed = (~torch.isinf(out[1])).nonzero().flatten().tolist()
    assert allowed == [0, 62], "row 1: bit 0 of word 0 (token 0) and bit 30 of word 1 (token 62)"


@pytest.mark.exercise("16.1")
@pytest.mark.parametrize("vocab_size", [1280, 1000, 33, 49152])
def test_random_bitmasks_give_xgrammars_result_exactly(impl, vocab_size):
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(5, vocab_size, generator=generator)
    words = (vocab_size + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31, (5, words), dtype=torch.int32, generator=generator)
    bitmask[1] = torch.randint(0, 2, (words,), generator=generator, dtype=torch.int32) << 31  # sign bits only
    out = impl.apply_token_bitmask(logits, bitmask)
    assert torch.equal(out, xgrammar_masked(logits, bitmask)), (
        f"V = {vocab_size}: -inf exactly where xgrammar puts it (bits past V ignored), the other logits unchanged"
    )
    half = impl.apply_token_bitmask(logits.bfloat16(), bitmask)
    assert half.dtype == torch.bfloat16, "bfloat16 logits stay bfloat16"
    assert torch.equal(half, xgrammar_masked(logits.bfloat16(), bitmask))


@pytest.mark.exercise("16.1")
def test_the_engines_masking_step_runs_your_function(impl):
    """apply_bitmask_inplace, which the engine calls, hands logits that xgrammar's kernel does not take (float64
    here) to apply_token_bitmask: inside use_impl, that is yours. Only the listed rows are masked."""
    generator = torch.Generator().manual_seed(16)
    logits = torch.randn(4, 1000, generator=generator, dtype=torch.float64)
    bitmask = torch.randint(-(2**31), 2**31, (4, 32), dtype=torch.int32, generator=generator)
    rows = [0, 2]
    with use_impl(impl, "16.1"):
        masked = logits.clone()
        apply_bitmask_inplace(masked, bitmask, rows)
    expected = logits.clone()
    allowed = xgr.testing.bitmask_to_bool_mask(bitmask, vocab_size=1000)  # xgrammar's own unpacking
    expected[rows] = logits[rows].masked_fill(~allowed[rows], INF)
    assert torch.equal(masked, expected), "rows 0 and 2 masked by your function, rows 1 and 3 untouched"


SCHEMA = {
    "type": "object",
    "properties": {
        "animal": {"enum": ["cat", "dog", "bird"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "pet": {"type": "boolean"},
    },
    "required": ["animal", "legs", "pet"],
}


@pytest.mark.exercise("16.1")
def test_greedy_decoding_under_your_mask_writes_json_that_validates(impl):
    """Random logits stand in for a model: at every step the largest logit your mask leaves is the next token."""
    manager = StructuredOutputManager(default_model_path(), 1280, [2])
    tokenizer, generator = Tokenizer(default_model_path()), torch.Generator().manual_seed(0)
    grammar = manager.grammar_init(StructuredOutputsParams(json=SCHEMA)).result(timeout=60)
    bitmask, ids = allocate_bitmask(1, 1280), []
    while not grammar.is_terminated() and len(ids) < 60:
        grammar.fill_bitmask(bitmask, 0)
        masked = impl.apply_token_bitmask(torch.randn(1, 1280, generator=generator), bitmask)
        token = int(masked.argmax())
        assert masked[0, token] > INF, f"after {tokenizer.decode(ids)!r} your mask left no token allowed"
        ids.append(token)
        accepted = grammar.accept_tokens([token])
        assert accepted, f"{tokenizer.decode(ids)!r}: your mask let a forbidden token through"
    manager.close()
    text = tokenizer.decode(ids)
    assert ids[-1] == 2, f"the walk ends with EOS once the object is complete: {text!r}"
    jsonschema.validate(json.loads(text), SCHEMA)


# --- 16.2: penalties ------------------------------------------------------------------------------------------------


def reference_penalties(row: torch.Tensor, prompt: set, output: list, presence, frequency, repetition):
    """One row, token by token, as the docstring states the rules."""
    row = row.clone()
    for t in range(len(row)):
        if t in prompt or t in output:
            row[t] = row[t] / repetition if row[t] > 0 else row[t] * repetition
        row[t] -= frequency * output.count(t) + presence * (output.count(t) > 0)
    return row


def penalty_inputs(prompts, outputs, vocab):
    mask = torch.zeros(len(prompts), vocab, dtype=torch.bool)
    counts = torch.zeros(len(prompts), vocab)
    for r, (prompt, output) in enumerate(zip(prompts, outputs)):
        mask[r, list(prompt)] = True
        for t in output:
            counts[r, t] += 1
    return mask, counts


@pytest.mark.exercise("16.2")
def test_penalties_of_the_docstring(impl):
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    kept = logits.clone()
    out = impl.apply_penalties(
        logits,
        torch.tensor([[True, False, False]]),
        torch.tensor([[0.0, 2.0, 1.0]]),
        torch.tensor([0.5]),
        torch.tensor([0.25]),
        torch.tensor([2.0]),
    )
    assert torch.equal(logits, kept), "the input logits must not change: return a new tensor"
    assert out.tolist() == [[1.0, -3.0, -0.5]], "repetition (/2 or x2 on the seen), then -0.25 x count, then -0.5"


@pytest.mark.exercise("16.2")
def test_penalties_equal_the_reference_row_by_row(impl):
    generator = torch.Generator().manual_seed(2)
    vocab = 40
    logits = torch.randn(5, vocab, generator=generator) * 3
    prompts = [{1, 2, 3}, set(), {5}, {7, 8}, {0}]
    outputs = [[3, 3, 9], [10, 11, 10], [], [7, 7, 7], [0, 1]]
    params = [(0.5, 0.25, 1.3), (0.0, 0.0, 2.0), (-0.5, 1.0, 1.0), (1.0, -1.0, 0.8), (0.0, 0.0, 1.0)]
    mask, counts = penalty_inputs(prompts, outputs, vocab)
    p, f, r = (torch.tensor(x) for x in zip(*params))
    out = impl.apply_penalties(logits, mask, counts, p, f, r)
    for row in range(5):
        expected = reference_penalties(logits[row], prompts[row], outputs[row], *params[row])
        torch.testing.assert_close(
            out[row], expected, msg=f"row {row} with (presence, frequency, repetition) {params[row]}"
        )
    assert torch.equal(out[4, 2:], logits[4, 2:]), "tokens never seen keep their logits"


@pytest.mark.exercise("16.2")
def test_greedy_answers_with_penalties_follow_the_reference(impl):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(default_model_path(), local_files_only=True).eval()
    sp = SamplingParams(
        temperature=0, max_tokens=12, presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3
    )
    with use_impl(impl, "16.2"):
        out = LLM().generate(["Once upon a time, there was a little girl"], sp, use_tqdm=False)[0]
    prompt, ids = list(out.prompt_token_ids), list(out.prompt_token_ids)
    for token in out.token_ids:
        with torch.no_grad():
            row = hf(torch.tensor([ids])).logits[0, -1].float()
        expected = reference_penalties(row, set(prompt), ids[len(prompt) :], 0.8, 0.4, 1.3).argmax().item()
        assert token == expected, f"after {len(ids) - len(prompt)} tokens the penalised argmax is {expected}"
        ids.append(token)


# --- 16.3: copy-on-write --------------------------------------------------------------------------------------------


def forked(impl, prompt_len: int = 6):
    """A BlockManager (blocks of 4) with a prompt allocated and forked into a second sequence."""
    bm = impl.BlockManager(8, 4)
    parent, child = Sequence(list(range(prompt_len))), Sequence(list(range(prompt_len)))
    bm.allocate(parent)
    bm.fork(parent, child)
    return bm, parent, child


@pytest.mark.exercise("16.3")
def test_the_first_writer_of_a_shared_block_gets_a_copy(impl):
    bm, parent, child = forked(impl)
    shared = list(parent.block_table)
    free = bm.num_free_blocks
    bm.copy_on_write(child, 6)
    assert child.block_table[0] == shared[0], "block 0 holds positions 0-3: not written, still shared"
    assert child.block_table[1] != shared[1], "position 6 is in block 1, shared: the child gets a copy"
    assert bm.num_free_blocks == free - 1 and bm.blocks[child.block_table[1]].ref_count == 1
    assert bm.blocks[shared[1]].ref_count == 1, "the shared block is used by one sequence fewer"
    assert bm.take_copies() == [(shared[1], child.block_table[1])], "record (source, destination) in self.copies"
    assert parent.block_table == shared


@pytest.mark.exercise("16.3")
def test_a_block_used_by_one_sequence_is_written_in_place(impl):
    bm, parent, child = forked(impl)
    bm.copy_on_write(child, 6)
    bm.take_copies()
    table, free = list(parent.block_table), bm.num_free_blocks
    bm.copy_on_write(parent, 6)  # the child copied: the parent's block is its own now
    assert parent.block_table == table and bm.num_free_blocks == free and bm.take_copies() == []
    bm, parent, child = forked(impl, prompt_len=8)
    bm.copy_on_write(child, 8)  # position 8 starts a third block, which nobody has yet
    assert child.block_table == parent.block_table and bm.take_copies() == [], "no block there: nothing to copy"


@pytest.mark.exercise("16.3")
def test_four_answers_share_the_prompt_and_copy_on_write_in_the_engine(impl):
    with use_impl(impl, "16.3"):
        llm = LLM(num_kvcache_blocks=64, kvcache_block_size=16)
        prompt = "Once upon a time, there was a little girl named Lily who loved to play in the park with her dog."
        plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, n=4), use_tqdm=False)[0]
        seqs = llm._add_all([prompt], SamplingParams(temperature=1.0, max_tokens=8, n=4, seed=0), None)
        llm.step()
        llm.step()
        tables = [list(s.block_table) for s in seqs]
        while not llm.is_finished():
            llm.step()
    assert [o.token_ids for o in out.outputs] == [plain.token_ids] * 4, "each answer reads its own copy of the keys"
    assert len({t[0] for t in tables}) == 1 and len({t[-1] for t in tables}) == 4, (
        "after two steps: the full prompt blocks shared, the last block one per answer"
    )
    assert llm.block_manager.num_free_blocks == 64, "every block comes back"
