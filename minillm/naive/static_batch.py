"""Static batching, the chapter-06 baseline: a fixed batch runs until its longest request is done.

It drives the same ModelRunner as the engine, with the simplest possible schedule: each request reserves
blocks for its maximum length up front (a contiguous cache), finished requests keep their seat (their rows
are still computed, as padding rows are in a padded batch), and nobody joins until the whole batch is done.
"""
import torch

from minillm.engine.model_runner import ModelRunner
from minillm.engine.scheduler import finish_reason
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.sampling_params import SamplingParams


def generate_static(runner: ModelRunner, prompts: list[list[int]], sampling_params: list[SamplingParams],
                    batch_size: int, eos_token_ids: list[int] = ()) -> list[Sequence]:
    """Run prompts batch_size at a time; returns the finished Sequences in prompt order."""
    eos, done = set(eos_token_ids), []
    for start in range(0, len(prompts), batch_size):
        seqs = [Sequence(p, sp) for p, sp in zip(prompts[start:start + batch_size],
                                                 sampling_params[start:start + batch_size])]
        run_batch(runner, seqs, eos)
        done += seqs
    return done


@torch.inference_mode()
def run_batch(runner: ModelRunner, seqs: list[Sequence], eos: set[int]) -> None:
    per_seq = max(-(-(len(s) + s.sampling_params.max_tokens) // runner.block_size) for s in seqs)
    if per_seq * len(seqs) > runner.num_kvcache_blocks:
        raise ValueError(f"a static batch of {len(seqs)} needs {per_seq * len(seqs)} KV blocks, the cache has "
                         f"{runner.num_kvcache_blocks}: lower batch_size or max_tokens")
    for i, seq in enumerate(seqs):  # reserve the maximum length, contiguously
        seq.block_table = list(range(i * per_seq, (i + 1) * per_seq))
        seq.num_scheduled_tokens = len(seq)
    is_prefill = True
    while not all(seq.is_finished for seq in seqs):
        for seq, token in zip(seqs, runner.run(seqs, is_prefill)):
            if not seq.is_finished:
                seq.token_ids.append(token)
                seq.finish_reason = finish_reason(seq, eos)
                seq.status = SequenceStatus.FINISHED if seq.finish_reason else SequenceStatus.RUNNING
            seq.num_computed_tokens, seq.num_scheduled_tokens = len(seq) - 1, 1  # finished rows: wasted work
        is_prefill = False
