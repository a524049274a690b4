"""Structured outputs in the engine (chapter 16): through LLM, every answer of the default model and of SmolLM2 to
twenty JSON schemas parses and validates, greedy and sampled, in one batch with unconstrained requests (mixed steps);
regexes, choices and EBNF grammars match; a grammar survives preemption (recomputation) and speculative decoding
(drafts checked against it) with the tokens of a plain run; a spec that does not compile is refused before any work.

The schemas are tests/test_structured_output.py's, with limits where they have none (`bounded`): a grammar can only
keep an answer valid as far as it goes, and asked for an unbounded integer the 4-layer story model writes digits
until max_tokens (measured: 3 of 40 answers cut at 256 tokens), which no engine can make valid JSON."""

import copy
import json
from dataclasses import replace

import jsonschema
import pytest
from test_structured_output import SCHEMAS  # tests/ is on sys.path

from minillm import LLM, SamplingParams
from minillm.config import draft_model_path
from minillm.models.hub import KNOWN_MODELS, get_model
from minillm.sampling_params import StructuredOutputsParams

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT = "Once upon a time, there was a"


def bounded(schema: dict) -> dict:
    """The schema with limits where it has none: strings of at most 24 characters, numbers in [-1000, 1000],
    arrays of at most 4 items."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, list):
            for item in node:
                walk(item)
        if not isinstance(node, dict):
            return
        kinds = node["type"] if isinstance(node.get("type"), list) else [node.get("type")]
        if "string" in kinds:
            node.setdefault("maxLength", 24)
        if {"integer", "number"} & set(kinds):
            node.setdefault("minimum", -1000)
            node.setdefault("maximum", 1000)
        if "array" in kinds:
            node.setdefault("maxItems", 4)
        for value in node.values():
            walk(value)

    walk(schema)
    return schema


def guided(schema: dict, temperature: float, seed: int, **kwargs) -> SamplingParams:
    so = StructuredOutputsParams(json=schema)
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=256, structured_outputs=so, **kwargs)


def assert_valid(outputs, params):
    for out, sp in zip(outputs, params):
        schema = sp.structured_outputs.json
        jsonschema.validate(json.loads(out.text), schema)  # raises, naming the schema and the text's problem
        assert out.finish_reason == "stop", f"{out.text!r} ended by {out.finish_reason}, not at the grammar's end"


@pytest.fixture(scope="module")
def llm():
    return LLM()


@pytest.fixture(scope="module")
def answers(llm):
    """Twenty schemas, greedy and sampled, and two unconstrained requests, in one batch."""
    params = [guided(bounded(s), t, seed) for t in (0, 1.0) for seed, s in enumerate(SCHEMAS)]
    free = SamplingParams(temperature=0, max_tokens=48)
    outputs = llm.generate([PROMPT] * (len(params) + 2), params + [free, free], use_tqdm=False)
    return outputs[:-2], params, outputs[-2:]


def test_twenty_schemas_greedy_and_sampled_give_json_that_validates(answers):
    outputs, params, _ = answers
    assert len(outputs) == 40
    assert_valid(outputs, params)
    greedy, sampled = outputs[:20], outputs[20:]
    assert [o.text for o in greedy] != [o.text for o in sampled], "sampling draws other valid answers"


def test_unconstrained_requests_in_the_same_steps_are_untouched(llm, answers):
    alone = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)[0]
    assert [o.token_ids for o in answers[2]] == [alone.token_ids] * 2


def test_greedy_guided_answers_do_not_depend_on_the_batch(llm, answers):
    outputs, params, _ = answers
    for out, sp in list(zip(outputs, params))[:3]:
        assert llm.generate([PROMPT], sp, use_tqdm=False)[0].token_ids == out.token_ids


@pytest.mark.parametrize(
    "spec,check",
    [
        (dict(regex=r"[0-9]{3}-[a-z]{2,5}"), lambda t: len(t.split("-")[0]) == 3 and t.split("-")[1].isalpha()),
        (dict(choice=["happy", "sad", "sleepy"]), lambda t: t in ("happy", "sad", "sleepy")),
        (dict(grammar='root ::= "The " animal " is " ("big" | "small")\nanimal ::= "fox" | "cat"'), None),
    ],
)
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_regex_choice_and_grammar(llm, spec, check, temperature):
    sp = SamplingParams(
        temperature=temperature, seed=5, max_tokens=64, structured_outputs=StructuredOutputsParams(**spec)
    )
    texts = [o.text for o in llm.generate([PROMPT, "The cat"], sp, use_tqdm=False)]
    for text in texts:
        if check is None:
            a, b = text.removeprefix("The ").split(" is ")
            assert a in ("fox", "cat") and b in ("big", "small"), text
        else:
            assert check(text), text


def test_a_grammar_survives_preemption(answers):
    outputs, params, _ = answers
    assert max(len(o.token_ids) for o in outputs[:20]) < 100
    small = LLM(num_kvcache_blocks=16, kvcache_block_size=8, new_token_ratio=0)  # 128 tokens for twenty: preempts
    again = small.generate([PROMPT] * 20, [replace(sp, max_tokens=100) for sp in params[:20]], use_tqdm=False)
    assert small.scheduler.num_preemptions > 0, "the cache was small enough to preempt"
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs[:20]]
    assert small.block_manager.num_free_blocks == 16


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        {"method": "draft_model", "model": str(draft_model_path()), "num_speculative_tokens": 4},
    ],
    ids=["ngram", "draft_model"],
)
def test_speculation_with_a_grammar_gives_the_plain_tokens(answers, spec):
    outputs, params, _ = answers
    llm = LLM(speculative_config=spec)
    again = llm.generate([PROMPT] * 8, params[:8], use_tqdm=False)
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs[:8]]
    assert llm.spec_stats.num_draft_tokens > 0, "drafts were proposed (and checked against the grammar)"


@pytest.mark.parametrize(
    "spec,message",
    [
        (dict(json="{not json"), r"structured_outputs\.json"),
        (dict(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}), r"structured_outputs\.json"),
        (dict(regex="(unclosed"), r"structured_outputs\.regex"),
        (dict(grammar="root ::= missing_rule"), r"structured_outputs\.grammar"),
    ],
)
def test_a_spec_that_does_not_compile_is_refused_before_any_work(llm, spec, message):
    sp = SamplingParams(structured_outputs=StructuredOutputsParams(**spec))
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPT, PROMPT], [SamplingParams(), sp], use_tqdm=False)
    assert llm.is_finished()


@pytest.mark.slow
@pytest.mark.skipif(KNOWN_MODELS[SMOLLM2].source() is None, reason=f"needs {KNOWN_MODELS[SMOLLM2].pip}")
def test_smollm2_answers_twenty_schemas_with_json_that_validates():
    llm = LLM(get_model(SMOLLM2))
    params = [guided(bounded(s), t, seed) for t in (0, 1.0) for seed, s in enumerate(SCHEMAS)]
    chat = [{"role": "user", "content": "Reply with a JSON example."}]  # one prompt: the prefix cache holds it once
    outputs = llm.chat([chat] * len(params), params, use_tqdm=False)
    assert_valid(outputs, params)
    any_object = SamplingParams(
        temperature=0, max_tokens=256, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    cat = [{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}]
    assert isinstance(json.loads(llm.chat(cat, any_object, use_tqdm=False)[0].text), dict)
