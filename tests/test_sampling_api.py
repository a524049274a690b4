"""The rest of vLLM's sampling API (chapter 16), offline: logprobs equal log_softmax of transformers' logits on the
same weights; n > 1 answers share the prompt's blocks (held once, copied on write); penalties, logit_bias, min_p,
min_tokens and bad_words do what a reference does; bad values are refused naming the field."""

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from minillm import LLM, SamplingParams
from minillm.config import default_model_path
from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence
from minillm.layers.logits_processors import apply_penalties

PROMPT = "Once upon a time, there was a little girl named Lily who loved"


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kvcache_blocks=64, kvcache_block_size=16)


@pytest.fixture(scope="module")
def hf():
    return AutoModelForCausalLM.from_pretrained(default_model_path(), local_files_only=True).eval()


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


def test_logprobs_are_log_softmax_of_transformers_logits(llm, hf):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, logprobs=5), use_tqdm=False)[0]
    assert len(out.logprobs) == len(out.token_ids) == 12 and out.outputs[0].logprobs is out.logprobs
    ids = list(out.prompt_token_ids)
    for token, entry in zip(out.token_ids, out.logprobs):
        ref = hf_logits(hf, ids).log_softmax(-1)
        assert next(iter(entry)) == token and entry[token].rank == 1  # greedy: the chosen token is the likeliest
        assert math.isclose(entry[token].logprob, ref[token].item(), abs_tol=1e-4)
        top = ref.topk(5)
        assert len(entry) == 5  # the chosen token is the first of the top 5
        assert list(entry) == top.indices.tolist()
        assert [e.logprob for e in entry.values()] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert entry[token].decoded_token == llm.tokenizer.decode([token], False)
        ids.append(token)


def test_a_sampled_token_has_its_rank_and_logprob(llm, hf):
    sp = SamplingParams(temperature=1.5, max_tokens=16, logprobs=0, seed=7)
    out = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    ids = list(out.prompt_token_ids)
    for token, entry in zip(out.token_ids, out.logprobs):
        ref = hf_logits(hf, ids).log_softmax(-1)
        assert list(entry) == [token]  # logprobs=0: the chosen token only
        assert entry[token].rank == int((ref > ref[token]).sum()) + 1
        assert math.isclose(entry[token].logprob, ref[token].item(), abs_tol=1e-4)
        ids.append(token)
    assert any(e[t].rank > 1 for t, e in zip(out.token_ids, out.logprobs)), "at temperature 1.5 some are not the top"


def test_n_answers_share_the_prompts_blocks_and_copy_on_write(llm):
    bm, free = llm.block_manager, llm.block_manager.num_free_blocks
    sp = SamplingParams(temperature=1.0, max_tokens=24, n=4, seed=3)
    seqs = llm._add_all([PROMPT + " to play. " + PROMPT], sp, None)
    prompt_blocks = bm.num_blocks(len(seqs[0]))
    assert prompt_blocks > 1 and len(seqs[0]) % bm.block_size, "full blocks, then one partly filled"
    assert len(seqs) == 4 and [len(s.forks) for s in seqs] == [3, 0, 0, 0]
    llm.step()  # the prompt, once, and the first token of each of the four
    assert all(s.num_completion_tokens == 1 for s in seqs)
    assert len({tuple(s.block_table) for s in seqs}) == 1, "the four share the prompt's blocks"
    assert free - bm.num_free_blocks == prompt_blocks, "the prompt's blocks are held once"
    assert [bm.blocks[b].ref_count for b in seqs[0].block_table] == [4] * prompt_blocks
    llm.step()  # each writes into the partly filled last block: three copies, the last writes in place
    assert len({s.block_table[-1] for s in seqs}) == 4 and len({s.block_table[0] for s in seqs}) == 1
    assert free - bm.num_free_blocks == prompt_blocks + 3
    while not llm.is_finished():
        llm.step()
    assert bm.num_free_blocks == free, "every block given back"
    texts = {llm.tokenizer.decode(s.completion_token_ids, True) for s in seqs}
    assert len(texts) == 4, "each answer draws its own tokens"


def test_n_answers_are_reproducible_and_each_equals_its_seed_alone(llm):
    sp = SamplingParams(temperature=1.0, max_tokens=20, n=3, seed=11)
    first = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    again = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    alone = SamplingParams(temperature=1.0, max_tokens=20, seed=12)  # the second answer's seed
    assert llm.generate([PROMPT], alone, use_tqdm=False)[0].token_ids == first.outputs[1].token_ids


def test_greedy_n_answers_agree_with_one(llm):
    one = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    many = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, n=3), use_tqdm=False)[0]
    assert [o.token_ids for o in many.outputs] == [one.token_ids] * 3


def test_stopping_a_stream_of_n_answers_gives_back_every_block(llm):
    free = llm.block_manager.num_free_blocks
    stream = llm.stream([PROMPT], SamplingParams(temperature=1.0, max_tokens=40, n=4, seed=1))
    for _ in range(10):
        next(stream)
    stream.close()
    assert llm.is_finished() and llm.block_manager.num_free_blocks == free


def test_copy_on_write_leaves_a_block_used_by_one_in_place():
    bm = BlockManager(8, 4)
    parent, child = Sequence(list(range(6))), Sequence(list(range(6)))
    bm.allocate(parent)
    bm.fork(parent, child)
    bm.copy_on_write(child, 6)
    assert child.block_table[0] == parent.block_table[0] and child.block_table[1] != parent.block_table[1]
    assert bm.take_copies() == [(parent.block_table[1], child.block_table[1])]
    bm.copy_on_write(parent, 6)  # now parent's alone
    assert bm.take_copies() == [] and bm.blocks[parent.block_table[1]].ref_count == 1


def reference_penalties(logits, prompt, output, presence, frequency, repetition):
    """One row, token by token, as vLLM's documentation states the rules."""
    logits = logits.clone()
    for t in range(len(logits)):
        if t in prompt or t in output:
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        count = output.count(t)
        logits[t] -= frequency * count + presence * (count > 0)
    return logits


def test_batched_penalties_equal_the_reference():
    torch.manual_seed(0)
    vocab, rows = 50, 4
    logits = torch.randn(rows, vocab) * 3
    prompts = [[1, 2, 3], [4, 4, 5], [], [7]]
    outputs = [[3, 3, 9], [], [10, 11, 10, 10], [7, 7]]
    params = [(0.5, 0.25, 1.3), (0.0, 0.0, 2.0), (-0.5, 1.0, 1.0), (1.0, -1.0, 0.8)]
    mask = torch.zeros(rows, vocab, dtype=torch.bool)
    counts = torch.zeros(rows, vocab)
    for r in range(rows):
        mask[r, prompts[r]] = True
        for t in outputs[r]:
            counts[r, t] += 1
    p, f, rep = (torch.tensor(x) for x in zip(*params))
    got = apply_penalties(logits, mask, counts, p, f, rep)
    for r in range(rows):
        ref = reference_penalties(logits[r], prompts[r], outputs[r], *params[r])
        torch.testing.assert_close(got[r], ref)


def test_engine_penalties_follow_the_reference_greedily(llm, hf):
    sp = SamplingParams(
        temperature=0, max_tokens=16, presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3
    )
    out = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    prompt, ids = list(out.prompt_token_ids), list(out.prompt_token_ids)
    for token in out.token_ids:
        output = ids[len(prompt) :]
        expected = reference_penalties(hf_logits(hf, ids), set(prompt), output, 0.8, 0.4, 1.3).argmax().item()
        assert token == expected
        ids.append(token)
    plain = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert plain.token_ids != out.token_ids, "the penalties changed the answer"


def test_logit_bias_min_p_min_tokens_and_bad_words(llm):
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    forced = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5, logit_bias={"7": 100}), use_tqdm=False)
    assert forced[0].token_ids == [7] * 5
    strict = SamplingParams(temperature=1.5, max_tokens=12, min_p=1.0, seed=3)  # only the likeliest survives
    assert llm.generate([PROMPT], strict, use_tqdm=False)[0].token_ids == greedy.token_ids
    eos = llm.engine_core.scheduler.eos_token_ids
    ends = SamplingParams(temperature=0, max_tokens=20, logit_bias={t: 100 for t in eos}, min_tokens=6)
    out = llm.generate([PROMPT], ends, use_tqdm=False)[0]
    assert len(out.token_ids) == 7 and out.token_ids[-1] in eos and out.finish_reason == "stop"
    word = greedy.text.split()[2]
    banned = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, bad_words=[word]), use_tqdm=False)
    assert word not in banned[0].text.split() and banned[0].text != greedy.text


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(n=0), "n must be an integer from 1"),
        (dict(logprobs=21), "logprobs must be an integer from 0 to 20"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(presence_penalty=3), r"presence_penalty must be in \[-2, 2\]"),
        (dict(frequency_penalty=-2.5), r"frequency_penalty must be in \[-2, 2\]"),
        (dict(repetition_penalty=0), r"repetition_penalty must be in \(0, 100\]"),
        (dict(logit_bias={5: 500}), r"logit_bias maps token ids .* biases in \[-100, 100\]"),
        (dict(min_tokens=10, max_tokens=5), r"min_tokens must be an integer from 0 to max_tokens \(5\)"),
        (dict(bad_words=[""]), "bad_words must be a list of non-empty strings"),
        (dict(structured_outputs=dict(regex="a+", choice=["a"])), "exactly one of json"),
    ],
)
def test_bad_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_what_the_engine_cannot_check_alone_is_refused_before_any_work(llm):
    with pytest.raises(ValueError, match=r"logit_bias has unknown token ids \[99999\]"):
        llm.generate([PROMPT], SamplingParams(logit_bias={99999: 1.0}), use_tqdm=False)
    assert llm.is_finished()


def test_the_async_front_end_streams_n_answers_with_their_logprobs():
    from minillm.engine.async_llm import AsyncLLM

    llm = LLM(num_kvcache_blocks=64, kvcache_block_size=16)
    sp = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=4, logprobs=2)
    reference = llm.generate([PROMPT], sp, use_tqdm=False)[0]

    async def main():
        async with AsyncLLM(llm) as async_llm:
            answers = {}
            async for delta in await async_llm.add_request(PROMPT, sp):
                got = answers.setdefault(delta.index, {"ids": [], "logprobs": [], "end": None})
                got["ids"] += delta.token_ids
                got["logprobs"] += delta.logprobs
                got["end"] = delta.finish_reason
            left = await async_llm.run_in_engine(lambda core: (core.block_manager.num_free_blocks, not core.requests))
            return answers, left

    answers, left = asyncio.run(main())
    assert sorted(answers) == [0, 1, 2] and left == (64, True)
    for out in reference.outputs:
        got = answers[out.index]
        assert got["ids"] == out.token_ids and got["end"] == out.finish_reason
        assert [list(e) for e in got["logprobs"]] == [list(e) for e in out.logprobs]
        assert all(len(e) in (2, 3) for e in got["logprobs"])  # the chosen token and the top 2 (it may be one of them)


def test_prompt_logprobs_are_transformers_and_leave_the_cache_alone(llm, hf):
    prompt = PROMPT + " to play. " + PROMPT  # two blocks of 16 and more: the first two come from the prefix cache
    before = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=3), use_tqdm=False)[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for i in range(1, len(ids)):
        entry = out.prompt_logprobs[i]
        assert next(iter(entry)) == ids[i], "the prompt token itself first"
        assert math.isclose(entry[ids[i]].logprob, ref[i - 1, ids[i]].item(), abs_tol=1e-4)
        assert entry[ids[i]].rank == int((ref[i - 1] > ref[i - 1, ids[i]]).sum()) + 1
        assert set(ref[i - 1].topk(3).indices.tolist()) <= set(entry)
    assert out.token_ids == before.token_ids, "the extra pass wrote nothing into the cache the answer reads"
    again = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert again.token_ids == before.token_ids and out.num_cached_tokens == again.num_cached_tokens == 32


def test_tools_reach_the_chat_template(llm):
    template = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "Hi"}]
    with_tools = llm.encode_chat(chat, chat_template=template, tools=tools)[0]
    assert llm.tokenizer.decode(with_tools).startswith("[get_weather]Hi")
    assert llm.tokenizer.decode(llm.encode_chat(chat, chat_template=template)[0]).startswith("Hi")


def test_more_answers_than_seats_run_as_seats_free_up():
    llm = LLM(max_num_seqs=4)
    sps = [SamplingParams(temperature=1.0, max_tokens=20, n=6, seed=1), SamplingParams(temperature=0, max_tokens=30)]
    seqs = llm._add_all([PROMPT, "A fox"], sps, None)
    most = 0
    while not llm.is_finished():
        llm.step()
        most = max(most, len(llm.scheduler.running))
    assert most == 4, "never more running than max_num_seqs"
    assert [s.num_completion_tokens for s in seqs[:6]] == [20] * 6 and seqs[6].finish_reason in ("stop", "length")
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
