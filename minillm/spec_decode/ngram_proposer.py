"""Prompt lookup (vLLM's "ngram" method): guess the next tokens by finding the sequence's newest n tokens earlier in
its own text and copying what followed them there. No model runs: a guess costs a search over the tokens, and pays
wherever the output repeats its input (a rewrite, a summary quoting it, code edited in place)."""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from minillm.spec_decode.inputs import DraftInput


def ngram_propose(token_ids: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k draft tokens for a sequence whose tokens so far are token_ids, found by n-gram lookup.

    For n from n_max down to n_min (the longest match first, as it predicts best): take the last n tokens of
    token_ids (the suffix) and look for an earlier occurrence of them, starting before that suffix; of several,
    take the most recent (the one nearest the end). If one is found at position i (token_ids[i : i + n] equals
    the suffix and i + n < len(token_ids)), propose the tokens that followed it, token_ids[i + n : i + n + k]
    (fewer than k if the text ends sooner), and stop. If no n finds one, propose nothing: [].
    A suffix longer than what comes before it cannot have an earlier occurrence (n must be < len(token_ids)).

    Examples: token_ids [1, 2, 3, 4, 1, 2], k=2, n_max=2, n_min=1: the suffix [1, 2] occurs at 0, so [3, 4].
    [5, 1, 2, 9, 1, 2, 7, 1, 2], k=3, n_max=2, n_min=2: [1, 2] occurs at 1 and 4; the most recent is 4, so
    [7, 1, 2]. [1, 2, 3], k=4, n_max=3, n_min=1: no earlier 3 or 2 or 1 either, so [].
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 13.1: n-gram lookup — find the newest n tokens earlier in the text and copy what followed
    ids = np.asarray(token_ids)
    ends = np.flatnonzero(ids[:-1] == ids[-1])  # where an earlier occurrence can end: the newest token, seen before
    for n in range(min(n_max, len(ids) - 1), n_min - 1, -1):
        match = ends[ends >= n - 1]
        for back in range(1, n):  # keep the candidates whose n - 1 tokens before also match the suffix's
            match = match[ids[match - back] == ids[-1 - back]]
        if len(match):
            start = int(match[-1]) + 1  # after the most recent occurrence
            return token_ids[start : start + k]
    return []
    # END EXERCISE


class NgramProposer:
    """Drafts for each sequence by prompt lookup over its own tokens (prompt and output)."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_max: int, prompt_lookup_min: int):
        self.k, self.n_max, self.n_min = num_speculative_tokens, prompt_lookup_max, prompt_lookup_min

    def propose(self, inputs: list["DraftInput"]) -> tuple[list[list[int]], None]:
        """Up to num_drafts drafts for each sequence (looked up: no distributions to return)."""
        return [
            ngram_propose(i.token_ids, i.num_drafts, self.n_max, self.n_min) if i.num_drafts else [] for i in inputs
        ], None
