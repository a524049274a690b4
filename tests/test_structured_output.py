"""minillm.structured_output (chapter 16): specs checked without a tokenizer, grammars compiled once per spec against
the default model's vocabulary, and every walk through a grammar ends in text that matches it.

The walks stand in for a model: at each step they pick, at random (seeded), one of the tokens the grammar's bitmask
allows, so they reach corners (escapes, long numbers, empty arrays) that a trained model rarely writes. Past
CLOSE_AFTER tokens they prefer the end of the text, then tokens that close a string, an array or an object."""

import json
import random
import re
import time

import jsonschema
import pytest
import torch

from minillm.config import default_model_path
from minillm.sampling_params import StructuredOutputsParams
from minillm.structured_output import (
    StructuredOutputManager,
    allocate_bitmask,
    apply_bitmask_inplace,
    apply_token_bitmask,
    validate_structured_outputs,
)
from minillm.tokenizer import Tokenizer

VOCAB_SIZE, EOS = 1280, 2  # the default model's config.json
MAX_TOKENS, CLOSE_AFTER = 400, 200
CLOSING = ('"', "]", "}", ")")  # past CLOSE_AFTER, in this order: end a string, an array, an object, a group

STRING = {"type": "string"}
SCHEMAS = [
    {"type": "object", "properties": {"name": STRING, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 17}}, "required": ["n"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -2.5, "maximum": 10}}, "required": ["x"]},
    {"type": "object", "properties": {"code": {"type": "string", "maxLength": 4}}, "required": ["code"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 3}}},
    {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}}},
        "required": ["scores"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1}, "email": STRING},
                "required": ["id"],
            }
        },
        "required": ["user"],
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "object", "properties": {"c": {"type": "boolean"}}, "required": ["c"]}},
                "required": ["b"],
            }
        },
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": STRING, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["sku", "qty"],
                },
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"point": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}},
    },
    {
        "type": "object",
        "properties": {"level": {"enum": [1, 2, 3, "max", None, True]}, "label": {"type": "string", "maxLength": 10}},
        "required": ["level", "label"],
    },
    {"type": "object", "properties": {"v": {"type": ["integer", "null"]}}, "required": ["v"]},
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 2, "maxLength": 12},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "rating": {"type": "number", "minimum": 0, "maximum": 5},
            "seen": {"type": "boolean"},
        },
        "required": ["title", "year"],
    },
    {
        "type": "object",
        "properties": {
            "grid": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                "maxItems": 3,
            }
        },
    },
    {
        "type": "object",
        "properties": {"status": {"const": "done"}, "count": {"type": "integer", "exclusiveMinimum": 0}},
        "required": ["status", "count"],
    },
    {
        "type": "object",
        "properties": {"answer": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]}},
        "required": ["answer"],
    },
    {"type": "array", "items": {"type": "object", "properties": {"k": STRING}, "required": ["k"]}, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "address": {
                "type": "object",
                "properties": {"street": STRING, "zip": {"type": "string", "maxLength": 5}, "apt": {"type": "integer"}},
                "required": ["street", "zip"],
            },
            "phones": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
        },
        "required": ["name", "address"],
    },
]


@pytest.fixture(scope="module")
def manager():
    manager = StructuredOutputManager(default_model_path(), VOCAB_SIZE, [EOS])
    yield manager
    manager.close()


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(default_model_path())


@pytest.fixture(scope="module")
def texts(tokenizer):
    """Each token's text, by id."""
    return [tokenizer.decode([t]) for t in range(VOCAB_SIZE)]


def grammar_for(manager, **spec):
    return manager.grammar_init(StructuredOutputsParams(**spec)).result(timeout=60)


def allowed_tokens(bitmask_row: torch.Tensor) -> list[int]:
    """The token ids whose bit is set, read bit by bit in plain Python (independent of apply_token_bitmask)."""
    words = bitmask_row.tolist()
    return [t for t in range(VOCAB_SIZE) if (words[t // 32] >> (t % 32)) & 1]


def walk(grammar, tokenizer, texts, seed: int) -> str:
    """Random allowed tokens until the grammar accepts EOS; the text they decode to."""
    rng, ids, bitmask = random.Random(seed), [], allocate_bitmask(1, VOCAB_SIZE)
    while not grammar.is_terminated():
        assert len(ids) < MAX_TOKENS, f"no end after {MAX_TOKENS} tokens: {tokenizer.decode(ids)!r}"
        grammar.fill_bitmask(bitmask, 0)
        allowed = allowed_tokens(bitmask[0])
        assert allowed, f"the grammar allows nothing after {tokenizer.decode(ids)!r}"
        closers = [t for c in CLOSING for t in allowed if texts[t] == c]  # in CLOSING's order
        if len(ids) >= CLOSE_AFTER and (EOS in allowed or closers):
            allowed = [EOS if EOS in allowed else closers[0]]
        token = rng.choice(allowed)
        assert grammar.accept_tokens([token]), f"token {token} was allowed, so it must be accepted"
        ids.append(token)
    assert ids[-1] == EOS and EOS not in ids[:-1], "EOS comes once, last"
    return tokenizer.decode(ids[:-1])


@pytest.mark.parametrize("number", range(len(SCHEMAS)))
def test_every_walk_through_a_json_schema_gives_json_that_validates(manager, tokenizer, texts, number):
    schema = SCHEMAS[number]
    validate_structured_outputs(StructuredOutputsParams(json=schema))
    for seed in range(3):
        text = walk(grammar_for(manager, json=schema), tokenizer, texts, seed=1000 * number + seed)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_a_schema_given_as_text(manager, tokenizer, texts):
    for seed in range(3):
        assert isinstance(json.loads(walk(grammar_for(manager, json_object=True), tokenizer, texts, seed)), dict)
    text = walk(grammar_for(manager, json=json.dumps(SCHEMAS[0])), tokenizer, texts, seed=7)
    jsonschema.validate(json.loads(text), SCHEMAS[0])


@pytest.mark.parametrize(
    "regex",
    [
        r"\d{3}-\d{4}",
        r"(cat|dog)s?",
        r"[a-z]{2,6}@[a-z]{3,5}\.(com|org)",
        r"-?(0|[1-9]\d{0,5})(\.\d{1,3})?",
        r"[A-Z][a-z]{0,8}( [a-z]{1,8}){0,3}\.",
    ],
)
def test_every_walk_through_a_regex_matches_it(manager, tokenizer, texts, regex):
    validate_structured_outputs(StructuredOutputsParams(regex=regex))
    for seed in range(5):
        text = walk(grammar_for(manager, regex=regex), tokenizer, texts, seed)
        assert re.fullmatch(regex, text), f"{text!r} does not match {regex!r}"


def test_every_walk_through_a_choice_is_one_of_the_choices(manager, tokenizer, texts):
    choices = ("yes", "no", "maybe so", 'say "hi"', "a\\b", "two\nlines", "ünïcode")
    seen = {walk(grammar_for(manager, choice=choices), tokenizer, texts, seed) for seed in range(40)}
    assert seen <= set(choices) and len(seen) >= 4, seen


def test_every_walk_through_an_ebnf_grammar_parses(manager, tokenizer, texts):
    grammar = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"'
    validate_structured_outputs(StructuredOutputsParams(grammar=grammar))
    for seed in range(5):
        text = walk(grammar_for(manager, grammar=grammar), tokenizer, texts, seed)
        reduced, previous = text, None
        while reduced != previous:  # replace innermost groups "(1+2)" by "0" until none is left
            reduced, previous = re.sub(r"\(\d+([+-]\d+)*\)", "0", reduced), reduced
        assert re.fullmatch(r"\d+([+-]\d+)*", reduced), f"{text!r} is not a sum of numbers and groups"


def test_a_grammar_never_allows_special_tokens_or_ids_past_the_tokenizer(texts):
    bitmask = allocate_bitmask(1, VOCAB_SIZE + 64)  # a model whose vocabulary is padded past the tokenizer's
    bigger = StructuredOutputManager(default_model_path(), VOCAB_SIZE + 64, [EOS])
    grammar = bigger.grammar_init(StructuredOutputsParams(regex=r".{1,50}")).result()
    grammar.fill_bitmask(bitmask, 0)
    allowed = apply_token_bitmask(torch.zeros(1, VOCAB_SIZE + 64), bitmask)[0] == 0  # a logit left finite
    assert not allowed[[0, 1, EOS]].any(), "<pad>, <bos> are never text and EOS only ends a complete match"
    assert not allowed[VOCAB_SIZE:].any(), "ids the tokenizer does not have are never allowed"
    whole_lines = [t for t in range(3, VOCAB_SIZE) if not set(texts[t]) & set("\ufffd\r\n")]
    assert allowed[whole_lines].all(), "any token of whole characters without a line break can start .{1,50}"
    bigger.close()


def test_a_length_bounded_string_admits_no_control_character(manager, tokenizer, texts):
    """xgrammar 0.2.9 lets raw control characters into a string with minLength/maxLength (mlc-ai/xgrammar#800);
    JSON's vocabulary has no token with one."""
    for bounded in ({"maxLength": 8}, {"minLength": 1}, {"minLength": 2, "maxLength": 3}):
        grammar = grammar_for(manager, json={"type": "object", "properties": {"s": {"type": "string", **bounded}}})
        assert grammar.accept_tokens(json_ids(tokenizer, '{"s": "'))
        control = [t for t in allowed_tokens(bitmask_of(grammar)[0]) if any(ord(c) < 32 for c in texts[t])]
        assert not control, f"{bounded}: tokens {[texts[t] for t in control]} are allowed inside the string"


def json_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def bitmask_of(grammar) -> torch.Tensor:
    bitmask = allocate_bitmask(1, VOCAB_SIZE)
    grammar.fill_bitmask(bitmask, 0)
    return bitmask


def test_accept_reject_validate_and_rollback(manager, tokenizer):
    schema = SCHEMAS[0]
    ids = json_ids(tokenizer, '{"name": "Tom and Lily", "age": 42}')
    grammar = grammar_for(manager, json=schema)
    assert grammar.jump_forward_string() == '{"name": "', "the grammar forces the first key"
    assert grammar.accept_tokens(ids[:5])
    after_five = bitmask_of(grammar)

    bad = EOS  # rejected before the object is complete
    assert grammar.validate_tokens(ids[5:9] + [bad] + ids[9:]) == ids[5:9], "the longest accepted prefix"
    assert torch.equal(bitmask_of(grammar), after_five), "validate_tokens leaves the grammar where it was"

    assert not grammar.accept_tokens(ids[5:7] + [bad] + ids[7:9]), "a rejected token makes accept_tokens False"
    assert grammar.accept_tokens(ids[7:]), "... and the grammar stays after the last accepted token"
    assert not grammar.is_terminated(), "a complete object still waits for EOS"
    assert allowed_tokens(bitmask_of(grammar)[0]) == [EOS], "after the closing brace only EOS"
    assert grammar.accept_tokens([EOS]) and grammar.is_terminated()
    assert bitmask_of(grammar).eq(-1).all(), "a terminated grammar constrains nothing"
    assert not grammar.accept_tokens([ids[0]]) and grammar.validate_tokens([EOS]) == []

    grammar.rollback(1)  # EOS taken back, as a rejected draft
    assert not grammar.is_terminated()
    grammar.rollback(8)  # speculative decoding takes back up to k drafts and the bonus token
    again = grammar_for(manager, json=schema)
    assert again.accept_tokens(ids[: len(ids) - 8])
    assert torch.equal(bitmask_of(grammar), bitmask_of(again)), "rolled back 8 = never accepted them"
    assert grammar.accept_tokens(ids[len(ids) - 8 :] + [EOS]) and grammar.is_terminated()


@pytest.mark.parametrize(
    "spec, field, reason",
    [
        ({"json": "{not json"}, "json", "is not valid JSON"),
        ({"json": '["a list"]'}, "json", "must be a JSON schema"),
        ({"json": {"type": "object", "properties": 5}}, "json", "properties must be an object"),
        ({"json": {"type": "integer-ish"}}, "json", 'Unsupported type "integer-ish"'),
        ({"regex": "a(b"}, "regex", "does not compile: .*parenthesis is not closed"),
        ({"regex": "[z-a]"}, "regex", "does not compile: .*lower bound is larger than upper bound"),
        ({"grammar": 'root ::= "a" |'}, "grammar", "does not parse as an EBNF grammar: .*line 1"),
        ({"grammar": "root ::= undefined_rule"}, "grammar", 'Rule "undefined_rule" is not defined'),
    ],
)
def test_bad_specs_raise_value_errors_naming_the_field(spec, field, reason):
    with pytest.raises(ValueError, match=rf"^structured_outputs\.{field} .*{reason}") as error:
        validate_structured_outputs(StructuredOutputsParams(**spec))
    assert "/project/cpp" not in str(error.value) and "Check failed" not in str(error.value), "xgrammar's own noise"


def test_the_engine_gets_a_compile_error_in_the_future(manager):
    future = manager.grammar_init(StructuredOutputsParams(json={"type": "integer-ish"}))
    with pytest.raises(ValueError, match=r"structured_outputs\.json cannot be compiled: Unsupported type"):
        future.result(timeout=60)


def test_the_same_spec_compiles_once(manager, tokenizer):
    schema = {"type": "object", "properties": {"fresh": {"type": "string", "maxLength": 7}}, "required": ["fresh"]}
    hits, misses = manager.cache_hits, manager.cache_misses
    start = time.perf_counter()
    first = grammar_for(manager, json=schema)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    second = grammar_for(manager, json=json.loads(json.dumps(schema)))  # an equal dict, not the same object
    warm = time.perf_counter() - start
    assert (manager.cache_hits, manager.cache_misses) == (hits + 1, misses + 1), "compiled once, found once"
    assert second is not first and second.matcher is not first.matcher, "each request gets its own matcher"
    assert first.accept_tokens([json_ids(tokenizer, '{"')[0]])
    assert torch.equal(bitmask_of(second), bitmask_of(grammar_for(manager, json=schema))), "matchers are separate"
    assert warm < cold, f"a cache hit ({warm * 1e3:.2f} ms) skips the compilation ({cold * 1e3:.2f} ms)"


@pytest.mark.parametrize("vocab_size", [1280, 1000, 49152])
def test_the_pure_bitmask_equals_xgrammars_kernel(vocab_size):
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(6, vocab_size, generator=generator)
    bitmask = torch.randint(-(2**31), 2**31, (6, (vocab_size + 31) // 32), dtype=torch.int32, generator=generator)
    bitmask[0] = -1  # a row that allows everything
    bitmask[1, 0] = -(2**31)  # only the sign bit: token 31 of word 0
    kept = logits.clone()
    pure = apply_token_bitmask(logits, bitmask)
    assert torch.equal(logits, kept), "apply_token_bitmask returns a new tensor"
    fast = logits.clone()
    apply_bitmask_inplace(fast, bitmask)
    assert torch.equal(fast, pure), "bit for bit, -inf in the same places"
    assert torch.equal(pure[0], logits[0]) and torch.isinf(pure[1, :31]).all() and pure[1, 31] == logits[1, 31]

    rows = [1, 4]  # a step with structured and unstructured requests: only rows 1 and 4 are masked
    some = logits.clone()
    apply_bitmask_inplace(some, bitmask, rows)
    assert torch.equal(some[rows], pure[rows]) and torch.equal(some[[0, 2, 3, 5]], logits[[0, 2, 3, 5]])
    fallback = logits.double()  # not float32: the pure-torch path
    apply_bitmask_inplace(fallback, bitmask, rows)
    assert torch.equal(fallback.float(), some)
