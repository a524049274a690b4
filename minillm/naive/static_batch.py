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


def generate_static(engine: LLMEngine, prompts: list[list[int]], sampling_params: list[SamplingParams],
                    batch_size: int) -> list[Sequence]:
    """Run prompts batch_size at a time on engine's model and KV cache; the finished Sequences, in order.
    Every request's arrival time is the call's start, so latencies compare with the engine's."""
    seqs = [Sequence(p, sp) for p, sp in zip(prompts, sampling_params)]
    start = time.perf_counter()
    for i in range(0, len(seqs), batch_size):
        batch = seqs[i:i + batch_size]
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
    for seq in seqs:
        seq.num_scheduled_tokens = len(seq)
    is_prefill = True
    while not all(seq.is_finished for seq in seqs):
        tokens = engine.model_runner.run(seqs, is_prefill)
        now = time.perf_counter()
        for seq, token in zip(seqs, tokens):
            if not seq.is_finished:
                seq.token_ids.append(token)
                seq.first_token_time = seq.first_token_time or now
                seq.finish_reason = finish_reason(seq, engine.scheduler.eos_token_ids)
                seq.status = SequenceStatus.FINISHED if seq.finish_reason else SequenceStatus.RUNNING
                seq.finish_time = now if seq.finish_reason else None
            seq.num_computed_tokens, seq.num_scheduled_tokens = len(seq) - 1, 1  # finished rows: wasted work
        is_prefill = False
