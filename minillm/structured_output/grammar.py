"""StructuredOutputGrammar: one request's position in its grammar (vLLM's XgrammarGrammar).

The engine core asks it, before each step, which tokens may come next (fill_bitmask), and tells it, after the
step, which tokens the request kept (accept_tokens). With speculative decoding it checks drafts without moving
(validate_tokens) and takes back tokens the verifier rejected (rollback).
"""

import torch


class StructuredOutputGrammar:
    """Wraps an xgrammar GrammarMatcher: a pushdown automaton over the grammar, advanced one token at a time,
    that can roll back any number of accepted tokens (xgrammar keeps its history)."""

    def __init__(self, matcher):
        self.matcher = matcher

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False at the first token the grammar rejects, which leaves the grammar after
        the last accepted one. A terminated grammar (its EOS accepted) accepts nothing more."""
        return not self.matcher.is_terminated() and all(self.matcher.accept_token(t) for t in token_ids)

    def validate_tokens(self, token_ids: list[int]) -> list[int]:
        """The longest prefix of `token_ids` the grammar accepts, the grammar left where it was: how a step checks
        speculative drafts before the verifier sees them."""
        if self.matcher.is_terminated():
            return []
        accepted = []
        for t in token_ids:
            if not self.matcher.accept_token(t):
                break
            accepted.append(t)
        if accepted:
            self.matcher.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Take back the last `num_tokens` accepted tokens (rejected drafts); an EOS taken back un-terminates."""
        self.matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into bitmask[row] (int32, 32 tokens a word, 1 = allowed). A terminated
        grammar constrains nothing (all ones): its request is finishing on the EOS just accepted."""
        if self.matcher.is_terminated():
            bitmask[row] = -1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token (EOS) after a complete match."""
        return self.matcher.is_terminated()

    def jump_forward_string(self) -> str:
        """The text the grammar forces next, whatever the model would say ('{"name": "' after nothing, for a
        schema whose first property is name): SGLang's jump-forward decoding appends it without a forward pass."""
        return self.matcher.find_jump_forward_string()
