"""Pipeline parallelism's steps (chapter 15), on the model runners of the stages.

Rank 0 `submit`s a step: it lays it out, runs stage 0 (the embedding and the first layers) and sends the hidden
states and residual, with the step's inputs, to stage 1, then returns at once, to plan and submit the next batch.
Every other rank runs `stage_loop`: it takes each step from the stage before, runs its own layers and hands the
result on; the last stage sends the logits back to rank 0, which `collect`s them, in the order submitted, and
samples. The engine core keeps up to pipeline_parallel_size steps in flight (EngineCore.step_with_batch_queue), so
that every stage has a batch to run.
"""

import time
from collections import deque
from contextlib import contextmanager
from typing import NamedTuple

import torch

from minillm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minillm.engine.sequence import Sequence
from minillm.utils.parallel import cpu_threads
from minillm.utils.pipeline import IntermediateTensors, StageRecord


class InFlightBatch(NamedTuple):
    """A step rank 0 submitted: its sequences (as scheduled, and those that sample, in the order of their logits
    rows, fixed now: an abort meanwhile changes a sequence) and when stage 0's forward pass started and ended, until
    `collect` gets its tokens."""

    seqs: list[Sequence]
    sampled: list[Sequence]
    batch_id: int
    start: float
    end: float


def submit(runner, output: SchedulerOutput, batch_id: int) -> InFlightBatch:
    """Rank 0 (vLLM V1's non-blocking execute_model): start a step and return without waiting for its tokens: run
    stage 0 and send its hidden states and residual, with the step, to stage 1."""
    pp = runner.pp
    sampled, inputs = runner.prepare(output)
    start = time.perf_counter()
    try:
        hidden = runner.forward(inputs)
        end = time.perf_counter()
        pp.send(pp.next_rank, (batch_id, inputs, []), torch.stack(hidden))
    except BaseException:
        pp.abandoned = True  # the stages are out of step: the engine closes (EngineCore.stop_if_lost)
        raise
    return InFlightBatch(output.scheduled, sampled, batch_id, start, end)


def collect(runner, step: InFlightBatch) -> ModelRunnerOutput:
    """Rank 0: wait for the logits of the oldest step submitted, from the last stage's first rank, and sample them;
    keep every stage's record of the step when the runner records a `timeline`."""
    pp = runner.pp
    try:
        records, logits, received = pp.recv(pp.tp_size * (pp.size - 1))
    except BaseException:
        pp.abandoned = True
        raise
    if runner.timeline is not None:
        runner.timeline += [StageRecord(0, step.batch_id, step.start, step.end, received), *records]
    return runner.sample(step.seqs, step.sampled, None if logits is None else logits.to(runner.device))


def stage_loop(runner) -> None:
    """Every rank but 0: take each step from the stage before (stage 0's other ranks: from rank 0, through their
    tensor-parallel group), run this stage's layers and hand the result on: the hidden states to the next stage or,
    from the last stage's first rank, the logits back to rank 0. The end (None) is handed on too. A failure ends the
    process; the ranks waiting on it fail in turn, and rank 0 closes the engine."""
    pp = runner.pp
    while True:
        if pp.is_first:
            (batch_id, inputs, records), hidden, received = (None, runner.group.receive_step(), []), None, 0
        else:
            message, hidden, received = pp.recv(pp.prev_rank)
            batch_id, inputs, records = message or (None, None, None)
        if inputs is None:
            if not pp.is_last:
                pp.send_end()
            return
        start = time.perf_counter()
        with cpu_threads(runner.platform.threads):
            out = runner.execute(inputs, None if hidden is None else IntermediateTensors(*hidden.to(runner.device)))
        records = [*records, StageRecord(pp.rank, batch_id, start, time.perf_counter(), received)]
        if not pp.is_last:
            pp.send(pp.next_rank, (batch_id, inputs, records), torch.stack(out))
        elif out is not None:  # the last stage's first rank (its tensor-parallel ranks' logits gathered there)
            pp.send(0, records, out if out.numel() else None)


@contextmanager
def held_back(scheduler, max_seqs: int | None):
    """A scheduler plans over part of `running`: the requests in flight and, past the first max_seqs of the others, the rest
    are held back: neither scheduled nor preempted, but in their seats and in `can_admit`'s reckoning. The plan's
    seats are what max_num_seqs leaves, at most max_seqs. Afterwards `running` is whole again, in its order,
    with the requests the plan admitted at the end."""
    running, seats = list(scheduler.running), scheduler.max_num_seqs
    free = [seq for seq in running if seq not in scheduler.in_flight]
    limit = len(free) if max_seqs is None else max_seqs
    scheduler.held = [seq for seq in running if seq in scheduler.in_flight] + free[limit:]
    scheduler.running, scheduler.max_num_seqs = deque(free[:limit]), min(seats - len(scheduler.held), max_seqs or seats)
    try:
        yield
    finally:
        planned = list(scheduler.running)  # less the preempted, plus the admitted
        kept = set(planned) | set(scheduler.held)
        scheduler.running = deque(dict.fromkeys([seq for seq in running if seq in kept] + planned))
        scheduler.held, scheduler.max_num_seqs = [], seats
