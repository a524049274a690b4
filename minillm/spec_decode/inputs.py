"""What a proposer is given: each scheduled sequence after a step, as plain values from the model runner."""

from dataclasses import dataclass

import torch

from minillm.sampling_params import SamplingParams


@dataclass
class DraftInput:
    """One scheduled sequence after a step, as a proposer sees it."""

    token_ids: list[int]  # all its tokens, the step's new ones included (lookup searches them)
    start: int  # the first position the target computed in the step
    end: int  # and the end: the draft model computes [start, end) too, its keys and values for later steps
    block_table: list[int]  # the target's blocks (a draft model's cache has the same blocks)
    num_drafts: int  # how many drafts to propose at most (0: none, a prompt chunk or a request at its end)
    sampling_params: SamplingParams
    generator: torch.Generator | None  # a seeded request's own stream


def draft_inputs(seqs, new_token_ids: list[list[int]], k: int) -> list[DraftInput]:
    """Each sequence of a step with its new tokens, as a proposer sees it: at most k drafts, and at most what
    max_tokens leaves after the token the next step samples anyway; none for a prompt chunk that sampled nothing."""
    inputs = []
    for seq, new in zip(seqs, new_token_ids):
        start, num_drafts = seq.num_computed_tokens, min(k, seq.remaining_tokens - len(new) - 1)
        end = len(seq) + len(new) if new else start + seq.num_scheduled_tokens
        args = seq.block_table, num_drafts if new else 0, seq.sampling_params, seq.generator
        inputs.append(DraftInput(seq.token_ids + new, start, end, *args))
    return inputs
