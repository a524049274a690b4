"""Sequence: one request's tokens, its place in the scheduler and its blocks in the KV cache."""

import time
from enum import Enum, auto
from itertools import count

import torch

from minillm.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """A prompt plus the tokens generated so far, and the bookkeeping the engine keeps about it."""

    _ids = count()

    def __init__(
        self,
        token_ids: list[int],
        sampling_params: SamplingParams = SamplingParams(),
        priority: int = 0,
        request_id: str | None = None,
    ):
        self.seq_id = next(Sequence._ids)
        self.request_id = str(self.seq_id) if request_id is None else request_id  # the front end's name for it
        self.status = SequenceStatus.WAITING
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0  # leading tokens found in the prefix cache when its blocks were allocated
        self.num_prompt_cached_tokens: int | None = None  # the same at its first admission (what outputs report)
        self.num_computed_tokens = 0  # leading tokens whose keys/values are in the cache
        self.num_scheduled_tokens = 0  # tokens the current step computes
        self.block_table: list[int] = []
        # speculative decoding (chapter 13): the tokens a proposer guessed after the newest one, and the draft
        # model's distributions [k, V] they were drawn from (None for a lookup); then those the step verifies
        self.draft_token_ids: list[int] = []
        self.spec_probs: torch.Tensor | None = None
        self.spec_token_ids: list[int] = []  # a prefix of draft_token_ids, set by the scheduler
        self.num_draft_tokens = self.num_accepted_tokens = 0  # drafts verified for this request, and kept
        self.sampling_params = sampling_params
        self.priority = priority
        self.generator: torch.Generator | None = None  # made from sampling_params.seed when first sampled
        self.finish_reason: str | None = None  # "stop" (EOS or a stop token), "length" (max_tokens) or "abort"
        self.arrival_time, self.first_token_time, self.finish_time = time.perf_counter(), None, None
        self.fork_of: str | None = None  # n > 1: the request id of the sibling whose prompt it shares
        # chapter 16: requests with n > 1 waiting for this one's prompt, to share its blocks (parallel_sampling.py);
        # the grammar its tokens must follow (structured outputs), once compiled
        self.forks: list[Sequence] = []
        self.grammar = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def remaining_tokens(self) -> int:
        """How many more tokens max_tokens allows (an EOS may end the request before)."""
        return self.sampling_params.max_tokens - self.num_completion_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def stamp(self, now: float) -> None:
        """Record that it got a token at `now`: the time of its first token, and of its last once it finished."""
        self.first_token_time = self.first_token_time or now
        if self.is_finished:
            self.finish_time = now

    @property
    def is_decoding(self) -> bool:
        """Are all its tokens but the newest in the cache (the prompt computed), so that a step computes the newest
        (and any drafts after it)? Otherwise it is part-way through its prompt."""
        return self.num_computed_tokens == len(self.token_ids) - 1

    @property
    def samples_this_step(self) -> bool:
        """Does the current step reach the end of the sequence (so its last logits give a new token)? A step
        that verifies drafts goes past it, over the drafts."""
        return self.num_computed_tokens + self.num_scheduled_tokens >= len(self.token_ids)

    @property
    def decodes_this_step(self) -> bool:
        """Does the current step decode it: its newest token (and any drafts after it) over keys and values in the
        cache, rather than a chunk of its prompt?"""
        return self.num_scheduled_tokens == 1 or self.num_computed_tokens + self.num_scheduled_tokens > len(self)

    def tokens_at(self, start: int, end: int) -> list[int]:
        """Its tokens at positions start..end-1, the drafts the step verifies following its own tokens."""
        n = len(self.token_ids)
        return self.token_ids[start:end] + self.spec_token_ids[max(0, start - n) : max(0, end - n)]


def finish_reason(seq: Sequence, eos_token_ids: set[int]) -> str | None:
    """Why seq stops after its newest token: "stop" (EOS or a stop token), "length" (max_tokens), or None."""
    sp, token = seq.sampling_params, seq.last_token
    if (token in eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
        return "stop"
    return "length" if seq.num_completion_tokens >= sp.max_tokens else None
