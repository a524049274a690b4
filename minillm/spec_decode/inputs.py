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
