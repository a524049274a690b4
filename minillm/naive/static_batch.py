"""Static batching, the chapter-06 baseline: a fixed batch runs until its longest request is done.

It drives the same engine pieces as continuous batching, with the simplest possible schedule: each request
reserves blocks for its maximum length up front (as a contiguous cache would), finished requests keep their
seat (their rows are still computed, as padding rows are in a padded batch), and nobody joins until the
whole batch is done.
"""

import time

import torch

from minillm.engine.llm_engine import LLMEngine
from minillm.engine.scheduler import finish_reason
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.sampling_params import SamplingParams


def generate_static(
    engine: LLMEngine, prompts: list[list[int]], sampling_params: list[SamplingParams], batch_size: int
) -> list[Sequence]:
    """Run prompts batch_size at a time on engine's model and KV cache; the finished Sequences, in order.
    Every request's arrival time is the call's start, so latencies compare with the engine's."""
    if batch_size > engine.config.max_num_seqs:
        raise ValueError(
            f"batch_size={batch_size} exceeds the engine's max_num_seqs={engine.config.max_num_seqs}: "
            "lower it, or make the engine with a larger max_num_seqs"
        )
    seqs = [Sequence(p, sp) for p, sp in zip(prompts, sampling_params)]
    start = time.perf_counter()
    for i in range(0, len(seqs), batch_size):
        batch = seqs[i : i + batch_size]
        for seq in batch:
            seq.arrival_time = start
            engine.block_manager.reserve(seq, len(seq) + seq.sampling_params.max_tokens)
        try:
            run_batch(engine, batch)
        finally:
            for seq in batch:
                engine.block_manager.deallocate(seq)
    return seqs


@torch.inference_mode()
def run_batch(engine: LLMEngine, seqs: list[Sequence]) -> None:
    """Prefill every prompt (in several steps when they exceed the token budget), then decode every row, finished
    or not, until the last request is done."""
    while not all(seq.completion_token_ids for seq in seqs):
        step, budget = [], engine.config.max_num_batched_tokens
        for seq in seqs:
            left = len(seq) - seq.num_computed_tokens
            if not seq.completion_token_ids and budget:
                seq.num_scheduled_tokens = min(left, budget)
                budget -= seq.num_scheduled_tokens
                step.append(seq)
        record_step(engine, step, engine.model_runner.run(step, True))
    while not all(seq.is_finished for seq in seqs):
        for seq in seqs:
            seq.num_computed_tokens, seq.num_scheduled_tokens = len(seq) - 1, 1  # finished rows: wasted work
        record_step(engine, seqs, engine.model_runner.run(seqs, False))


def record_step(engine: LLMEngine, seqs: list[Sequence], tokens: list[int | None]) -> None:
    now = time.perf_counter()
    for seq, token in zip(seqs, tokens):
        if seq.is_finished:
            continue
        seq.num_computed_tokens += seq.num_scheduled_tokens
        if token is None:  # a chunk of a prompt longer than the token budget
            continue
        seq.token_ids.append(token)
        seq.first_token_time = seq.first_token_time or now
        seq.finish_reason = finish_reason(seq, engine.scheduler.eos_token_ids)
        seq.status = SequenceStatus.FINISHED if seq.finish_reason else SequenceStatus.RUNNING
        seq.finish_time = now if seq.finish_reason else None
