"""The xgrammar backend (vLLM's backend_xgrammar.py): every kind of structured output turned into one grammar, the
checks the front end runs without a tokenizer, and the compilers of the checkpoint's vocabulary.

xgrammar compiles a grammar against a vocabulary once (which tokens can start, continue or end each rule), so
that a matcher answers "which tokens may come next?" as a bitmask in microseconds. xgrammar is imported inside
the functions: only a server that sees a structured request pays for its import (it imports transformers).
"""

import json
import os
import re
from pathlib import Path

from minillm.sampling_params import StructuredOutputsParams

JSON_OBJECT_SCHEMA = {"type": "object"}  # json_object=True: any JSON object
# xgrammar's errors start with a timestamp and a C++ source line, sometimes a failed check: not for a user
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def grammar_key(params: StructuredOutputsParams) -> tuple[str, str]:
    """(kind, spec): what xgrammar compiles, as text, so that it keys the cache of compiled grammars.

    A choice becomes an EBNF grammar of its strings, as vLLM writes it (each string a quoted literal with
    JSON's escapes, which xgrammar's EBNF reads too); json_object becomes the schema {"type": "object"}."""
    kind = params.kind
    if kind == "json":
        return kind, params.json if isinstance(params.json, str) else json.dumps(params.json)
    if kind == "json_object":
        return kind, json.dumps(JSON_OBJECT_SCHEMA)
    if kind == "choice":
        return kind, "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in params.choice)
    return kind, getattr(params, kind)


def validate_structured_outputs(params: StructuredOutputsParams) -> None:
    """Raise ValueError naming the field and xgrammar's reason when the spec cannot become a grammar: a JSON schema
    that is not JSON or that xgrammar does not support, a regex or an EBNF grammar that does not parse. Cheap (no
    vocabulary involved): the front end runs it on every structured request before the engine core sees it."""
    import xgrammar as xgr

    try:
        kind, spec = grammar_key(params)  # json.dumps of a dict that holds no JSON value raises TypeError
        schema = json.loads(spec) if kind == "json" else {}
    except (TypeError, ValueError) as e:
        raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"structured_outputs.json must be a JSON schema (a JSON object), got {spec[:100]!r}")
    parse, problem = {
        "json": (xgr.Grammar.from_json_schema, "is not a JSON schema xgrammar supports"),
        "json_object": (xgr.Grammar.from_json_schema, "is not a JSON schema xgrammar supports"),
        "regex": (xgr.Grammar.from_regex, "does not compile"),
        "choice": (xgr.Grammar.from_ebnf, "cannot be turned into a grammar"),
        "grammar": (xgr.Grammar.from_ebnf, "does not parse as an EBNF grammar"),
    }[kind]
    try:
        parse(spec)
    except RuntimeError as e:
        raise ValueError(f"structured_outputs.{kind} {problem}: {_reason(e)}") from None


class XgrammarBackend:
    """xgrammar's compilers for one checkpoint's vocabulary, built offline from its tokenizer.json.

    The vocabulary is each token id's text (byte-level "Ġ" decoded to a space, and so on) over the model's
    `vocab_size` ids, which can exceed the tokenizer's (the extra ids are never allowed); the EOS ids are the stop
    tokens a complete match allows. Special tokens (<bos>, chat markers) get no text, which xgrammar reads as
    "never inside the grammar": from_huggingface alone would let "<bos>" appear inside a JSON string.

    JSON has a compiler of its own whose vocabulary also leaves out every token with a control character: compact
    JSON never contains one raw, and xgrammar 0.2.9 would let one into a string with minLength or maxLength
    (mlc-ai/xgrammar#800), which json.loads then refuses."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, eos_token_ids: list[int]):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(tokenizer_dir) / "tokenizer.json"))
        detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids)
        vocab = [""] * vocab_size
        for token, token_id in tokenizer.get_vocab().items():
            if token_id < vocab_size:
                vocab[token_id] = token
        for token_id, added in tokenizer.backend_tokenizer.get_added_tokens_decoder().items():
            if added.special and token_id < vocab_size:
                vocab[token_id] = ""

        def compiler(vocab: list[str]):
            info = xgr.TokenizerInfo(
                vocab,
                detected.vocab_type,
                vocab_size=vocab_size,
                stop_token_ids=eos_token_ids,
                add_prefix_space=detected.add_prefix_space,
            )
            # xgrammar's own cache stays off: the manager's is the one cache, keyed by spec and counted
            return xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)

        self.compiler = compiler(vocab)  # regexes, choices and EBNF grammars
        texts = detected.decoded_vocab  # bytes, by token id
        self.json_compiler = compiler(["" if any(b < 32 for b in texts[i]) else t for i, t in enumerate(vocab)])

    def compile(self, kind: str, spec: str):
        """The xgr.CompiledGrammar of a grammar_key. JSON is compiled in its compact form (", " and ": " between
        items, no other whitespace): a small model left free to add whitespace may add it forever. Raises
        ValueError naming the field when xgrammar cannot compile it."""
        try:
            if kind in ("json", "json_object"):
                return self.json_compiler.compile_json_schema(spec, any_whitespace=False)
            if kind == "regex":
                return self.compiler.compile_regex(spec)
            return self.compiler.compile_grammar(spec)  # an EBNF grammar, a choice's included
        except RuntimeError as e:
            raise ValueError(f"structured_outputs.{kind} cannot be compiled: {_reason(e)}") from None


def _reason(error: RuntimeError) -> str:
    """xgrammar's message without its timestamp and C++ source line."""
    return _XGRAMMAR_PREFIX.sub("", str(error)).strip()
