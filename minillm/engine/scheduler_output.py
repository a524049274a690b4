"""SchedulerOutput: what the scheduler decided for one step, handed to the model runner (vLLM V1's
vllm/v1/core/sched/output.py)."""

from dataclasses import dataclass, field

import torch

from minillm.engine.sequence import Sequence


@dataclass
class SchedulerOutput:
    """One step's plan (vLLM's name): the requests that start in it (new, or back after a preemption: the runner
    holds nothing of theirs) and those that go on, each with `num_scheduled_tokens` set and, in a verify step, the
    drafts it checks in `spec_token_ids`."""

    scheduled_new_reqs: list[Sequence]
    scheduled_cached_reqs: list[Sequence]
    # (source, destination) blocks whose keys and values the runner copies before the step (copy-on-write, chapter 16)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # whether the step computes prompt tokens (the runner then packs it as a prefill, decode rows first) rather than
    # only each request's newest token and its drafts; fixed when the plan is made, as the step changes the requests
    is_prefill: bool = field(init=False)

    def __post_init__(self):
        self.is_prefill = bool(self.scheduled_new_reqs) or not all(s.is_decoding for s in self.scheduled_cached_reqs)

    @property
    def scheduled(self) -> list[Sequence]:
        """The step's requests in the order update_from_output takes their tokens: those that go on, then the new."""
        return self.scheduled_cached_reqs + self.scheduled_new_reqs

    @property
    def num_scheduled_tokens(self) -> dict[int, int]:
        return {seq.seq_id: seq.num_scheduled_tokens for seq in self.scheduled}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(seq.num_scheduled_tokens for seq in self.scheduled)

    @property
    def scheduled_spec_decode_tokens(self) -> dict[int, list[int]]:
        return {seq.seq_id: list(seq.spec_token_ids) for seq in self.scheduled if seq.spec_token_ids}


@dataclass
class ModelRunnerOutput:
    """What the model runner gives back for one step (vLLM's name): for each of the plan's `scheduled` sequences, the
    tokens it produced ([] for a prompt chunk that did not reach the end) and, with speculative decoding (chapter
    13), the drafts its next step is to verify and the draft model's distributions of them (None: looked up, or
    picked greedily)."""

    sampled_token_ids: list[list[int]]
    draft_token_ids: list[list[int]] | None = None
    draft_probs: list[torch.Tensor | None] | None = None
    # chapter 16: per scheduled sequence, the logprobs of its new tokens (None where not asked: see sample_step);
    # and (child, first token, its logprobs) for each child (n > 1) of a request whose prompt just ended
    logprobs: list[list | None] | None = None
    forked: list[tuple[Sequence, int, list | None]] = field(default_factory=list)
    prompt_logprobs: dict[Sequence, list] = field(default_factory=dict)  # of prompts that just ended, if asked
