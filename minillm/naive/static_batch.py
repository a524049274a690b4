"""Static batching, the chapter-06 baseline: a fixed batch runs until its longest request is done.

It drives the same engine pieces as continuous batching, with the simplest possible schedule: each request
reserves blocks for its maximum length up front (as a contiguous cache would), finished requests keep their
seat (their rows are still computed, as padding rows are in a padded batch), and nobody joins until the
whole batch is done.
"""

import time

import torch

from minillm.engine.llm_engine import LLMEngine
from minillm.engine.scheduler import Scheduler
from minillm.engine.scheduler_output import SchedulerOutput
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


class ReservedBlocks:
    """The block manager a static batch's Scheduler sees: the blocks were reserved up front (BlockManager.reserve)
    and are freed when the whole batch is done, so the scheduler neither frees a finished request's (its row keeps
    its seat) nor shares any through the prefix cache."""

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        pass

    def deallocate(self, seq: Sequence) -> None:
        pass


@torch.inference_mode()
def run_batch(engine: LLMEngine, seqs: list[Sequence]) -> None:
    """Admit every row at once, prefill the prompts as the engine's Scheduler does (in chunks when they exceed the
    token budget), then decode every row, finished or not, until the last request is done; the Scheduler records
    every step."""
    scheduler = Scheduler(engine.config, ReservedBlocks(), engine.scheduler.eos_token_ids)
    for seq in seqs:
        seq.status = SequenceStatus.RUNNING
    scheduler.running.extend(seqs)
    while not all(seq.is_decoding for seq in seqs):
        step = scheduler.schedule_chunks(scheduler.max_num_batched_tokens)
        record_step(scheduler, step, engine.model_runner.run(SchedulerOutput([], step)).sampled_token_ids)
    while scheduler.running:
        for seq in seqs:
            seq.num_scheduled_tokens = 1  # finished rows too: wasted work
        record_step(scheduler, seqs, engine.model_runner.run(SchedulerOutput([], seqs)).sampled_token_ids)


def record_step(scheduler: Scheduler, seqs: list[Sequence], sampled: list[list[int]]) -> None:
    """Scheduler.update_from_output on the rows not finished before the step (a finished row's token is thrown
    away)."""
    now = time.perf_counter()
    rows = [i for i, seq in enumerate(seqs) if not seq.is_finished]
    output = SchedulerOutput([], [seqs[i] for i in rows])
    for seq in scheduler.update_from_output(output, [sampled[i] for i in rows]):
        seq.stamp(now)
