"""Structured outputs (chapter 16): output that must match a JSON schema, a regex, a choice or an EBNF grammar.

The names and boundaries are vLLM V1's (vllm/v1/structured_output/), the grammar engine is xgrammar:
- the front end checks each spec cheaply, without a tokenizer: validate_structured_outputs;
- the engine core's StructuredOutputManager compiles each spec against the vocabulary, once per spec, off the
  critical path (grammar_init returns a future), and gives each request a StructuredOutputGrammar;
- each step, every structured request's grammar fills its row of a token bitmask (fill_bitmask), the sampler masks
  the logits with it (apply_bitmask_inplace; apply_token_bitmask is exercise 16.1), and the tokens the request
  keeps advance its grammar (accept_tokens; validate_tokens and rollback for speculative drafts).
"""

from minillm.structured_output.backend_xgrammar import validate_structured_outputs
from minillm.structured_output.bitmask import allocate_bitmask, apply_bitmask_inplace, apply_token_bitmask
from minillm.structured_output.grammar import StructuredOutputGrammar
from minillm.structured_output.manager import StructuredOutputManager

__all__ = [
    "StructuredOutputGrammar",
    "StructuredOutputManager",
    "allocate_bitmask",
    "apply_bitmask_inplace",
    "apply_token_bitmask",
    "validate_structured_outputs",
]
