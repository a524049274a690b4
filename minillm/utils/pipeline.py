"""Pipeline parallelism (chapter 15): the model's layers split into stages, one after the other, each stage on its
own ranks. Stage 0 embeds the tokens and runs the first layers, then sends the hidden states (and the residual) to
stage 1, which runs the next layers, and so on; the last stage applies the final norm and the LM head. Each rank
builds and loads only its stage's layers (`make_layers`; the others are `PPMissingLayer`s, which the loader skips),
and its KV cache holds only those layers.

One batch going through P stages keeps each stage busy 1/P of the time: the rest is the pipeline's bubble. So the
engine keeps up to P batches in flight (EngineCore.step_with_batch_queue), and stage 0 runs batch k + 1 while
stage 1 runs batch k. `StageRecord`s, the forward passes timed on each stage, show it, and `bubble_share` measures
it. The names are vLLM's (vllm/distributed/utils.py, vllm/model_executor/models/utils.py).
"""

import datetime
import os
import pickle
import warnings
from collections import deque
from contextlib import contextmanager
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

FOREVER = datetime.timedelta(days=365)  # a stage may wait that long for its next step (an idle engine)


def get_pp_indices(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """The layers of stage `pp_rank` of `pp_size`: range(start, end) of the model's `num_layers` layers.

    Each stage gets num_layers // pp_size layers; when that does not divide evenly, the remainder goes one layer
    each to the stages just before the last, counting back from it (vLLM's rule): the last stage, which also runs
    the final norm and the LM head, and the first, whose rank here also schedules and samples, get an extra layer
    last. Stages are contiguous and cover every layer once.

    Examples: 4 layers on 2 stages: (0, 2) and (2, 4). 5 layers on 2 stages: (0, 3) and (3, 5). 6 layers on 4
    stages: 1, 2, 2 and 1 layers, so (0, 1), (1, 3), (3, 5), (5, 6). 7 layers on 4 stages: 2, 2, 2 and 1. One
    stage: (0, num_layers).
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 15.1: splitting layers into stages — equal shares, the remainder one each to the stages before the last
    sizes = [num_layers // pp_size] * pp_size
    for i in range(num_layers % pp_size):
        sizes[-2 - i] += 1
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]
    # END EXERCISE


class PPMissingLayer(nn.Identity):
    """The place of a layer that another pipeline stage holds (vLLM's name): no weights, never run. It keeps the
    other layers' names (`model.layers.3...`) as the checkpoint has them, and tells the loader what to skip."""


class IntermediateTensors(NamedTuple):
    """What a stage hands to the next (vLLM's name): the hidden states and the residual, each [tokens, hidden]."""

    hidden_states: torch.Tensor
    residual: torch.Tensor


_PP: "PipelineGroup | None" = None  # the pipeline group of the model being built (see pipeline_parallel)


@contextmanager
def pipeline_parallel(group: "PipelineGroup | None"):
    """Models built inside this block are `group`'s stage of the model (the whole model for None)."""
    global _PP
    previous, _PP = _PP, group
    try:
        yield
    finally:
        _PP = previous


def get_pp_rank() -> int:
    return _PP.rank if _PP else 0


def get_pp_size() -> int:
    return _PP.size if _PP else 1


def make_layers(num_layers: int, layer_fn: Callable[[], nn.Module]) -> tuple[int, int, nn.ModuleList]:
    """This stage's first and past-last layer index, and all num_layers places: its own layers built by
    layer_fn, the others PPMissingLayer (vLLM's make_layers)."""
    start, end = get_pp_indices(num_layers, get_pp_rank(), get_pp_size())
    return start, end, nn.ModuleList(layer_fn() if start <= i < end else PPMissingLayer() for i in range(num_layers))


class PipelineGroup:
    """This rank's stage (`rank` of `size`) and the gloo group over every rank of the engine on which the stages
    hand each step on. Rank r = stage x tp_size + tensor-parallel rank (vLLM's layout): each rank of a stage sends
    to the rank of the next stage with the same tensor-parallel rank (all of them hold the whole hidden states),
    and the last stage's first rank sends the logits back to rank 0, which samples.

    A message is a header (two byte counts) and a body: a tensor's bytes, then a pickled object that also gives the
    tensor's shape and dtype. Sends return at once, so that a stage goes on with its next step while the next stage
    receives; a message is kept until it is received. Everything runs through host memory (a CUDA tensor is copied
    first), where vLLM sends from device to device over NCCL."""

    def __init__(self, store: dist.Store, rank: int, tp_size: int, pp_size: int, local_rank: int = 0):
        self.global_rank, self.tp_size, self.local_rank = rank, tp_size, local_rank
        self.rank, self.size = rank // tp_size, pp_size
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("pipeline", store), rank, tp_size * pp_size, FOREVER)
        self.sends: deque[list] = deque()  # per message not known to be received: its works and tensors
        self.abandoned, self.renewable = False, False  # a failed step ends the engine (see EngineCore.stop_if_lost)

    is_first = property(lambda self: self.rank == 0)
    is_last = property(lambda self: self.rank == self.size - 1)
    next_rank = property(lambda self: self.global_rank + self.tp_size)  # the same tensor-parallel rank, a stage on
    prev_rank = property(lambda self: self.global_rank - self.tp_size)

    def send(self, dst: int, obj, tensor: torch.Tensor | None = None) -> None:
        """Send obj (and a tensor) to rank dst without waiting. At most `size` steps are in flight, so by the time a
        stage sends a step, the message it sent `size` steps before has been received: waiting for it costs nothing
        and frees its buffers."""
        while len(self.sends) >= self.size:
            for work in self.sends.popleft()[0]:
                work.wait()
        meta = None if tensor is None else (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        data = pickle.dumps((obj, meta))
        raw = torch.empty(0) if tensor is None else tensor.detach().cpu().contiguous()
        raw = raw.view(-1).view(torch.uint8)
        body = torch.empty(raw.numel() + len(data), dtype=torch.uint8)  # the tensor first (aligned), then the pickle
        body[: raw.numel()], body[raw.numel() :] = raw, torch.frombuffer(bytearray(data), dtype=torch.uint8)
        header = torch.tensor([raw.numel(), len(data)])
        self.sends.append([[self.group.send([t], dst, 0) for t in (header, body)], (header, body)])

    def send_end(self, timeout: float | None = None) -> None:
        """Send the end (None) to the next stage, and wait until it has it (after the steps still in flight there;
        at most timeout seconds): each stage hands it on before it leaves."""
        self.send(self.next_rank, None)
        for work in self.sends[-1][0]:
            work.wait(*([datetime.timedelta(seconds=timeout)] if timeout is not None else []))

    def recv(self, src: int) -> tuple[object, torch.Tensor | None, int]:
        """The next message from rank src: its object, its tensor (None if it had none) and the bytes received."""
        header = torch.empty(2, dtype=torch.long)
        self.group.recv([header], src, 0).wait()
        num_raw, num_data = header.tolist()
        body = torch.empty(num_raw + num_data, dtype=torch.uint8)
        self.group.recv([body], src, 0).wait()
        obj, meta = pickle.loads(body[num_raw:].numpy().tobytes())
        tensor = None if meta is None else body[:num_raw].view(getattr(torch, meta[1])).view(meta[0])
        return obj, tensor, header.nbytes + body.nbytes

    def min(self, n: int) -> int:
        """The smallest of every rank's n (every stage of every tensor-parallel rank)."""
        opts, t = dist.AllreduceOptions(), torch.tensor([n])
        opts.reduceOp = dist.ReduceOp.MIN
        self.group.allreduce([t], opts).wait()
        return int(t)

    def close(self) -> None:
        self.sends.clear()
        self.group.shutdown()


class StageRecord(NamedTuple):
    """One stage's forward pass of one batch: when it started and ended (time.perf_counter seconds: comparable
    between the processes of one machine, not between machines), and the bytes its rank received for the batch: the
    step and the hidden states from the stage before or, for stage 0 (rank 0), the logits from the last stage."""

    stage: int
    batch: int
    start: float
    end: float
    bytes_received: int


def bubble_share(records: list[StageRecord], num_stages: int) -> float:
    """The pipeline's bubble: the share of the stages' time, from the first forward's start to the last one's end,
    in which a stage ran no forward pass: 1 - (the stages' busy seconds) / (num_stages x the span).

    One batch in flight on P equal stages keeps each busy 1/P of the time: a bubble of (P - 1) / P. Two stages of
    1 s each: batches one at a time (stage 0 in [0, 1], stage 1 in [1, 2], stage 0 in [2, 3], stage 1 in [3, 4])
    give 1 - 4 / (2 x 4) = 0.5; batches overlapped (stage 0 in [0, 1], [1, 2], [2, 3], stage 1 in [1, 2], [2, 3],
    [3, 4]) 1 - 6 / 8 = 0.25, where only filling and draining the pipeline is left. No records: 0.

    records: StageRecords of any stages and batches, in any order; each gives its forward pass's `start` and `end`
    (seconds, one clock for all). The span is max(end) - min(start) over all records, the busy seconds the sum of
    every record's end - start. A span of 0 (a single instant) gives 0 too.
    """
    # use_impl swaps this function for a student's: minillm calls it by name, never a kept reference
    # BEGIN EXERCISE 15.3: the pipeline's bubble — 1 - busy seconds / (stages x the timeline's span)
    if not records:
        return 0.0
    span = max(r.end for r in records) - min(r.start for r in records)
    busy = sum(r.end - r.start for r in records)
    return 1 - busy / (num_stages * span) if span > 0 else 0.0
    # END EXERCISE


def check_pipeline_parallel(model_config, config) -> None:
    """Errors, before any process starts, for a pipeline_parallel_size this model, its settings or this machine
    cannot take; a warning where its ranks outnumber the CPU's cores.

    More ranks than cores is allowed for pipeline stages (not for tensor-parallel ranks): the ranks of a
    tensor-parallel group meet in every layer's all-reduce, where one waiting for a core stalls all of them, while
    a stage waits for the one before only once per step. Each rank then runs on one thread."""
    pp, tp, layers = config.pipeline_parallel_size, config.tensor_parallel_size, model_config.num_hidden_layers
    if pp > layers:
        raise ValueError(
            f"pipeline_parallel_size={pp} exceeds the model's {layers} layers: every stage needs at least one layer, "
            f"so choose at most {layers}"
        )
    if config.enforce_eager is False:
        raise ValueError(
            "enforce_eager=False with pipeline_parallel_size > 1 is not supported (a stage's step starts from the "
            "hidden states the stage before sent, which a replayed decode step does not take): leave enforce_eager "
            "at its default"
        )
    ranks = tp * pp
    if torch.device(config.device).type == "cuda":
        if ranks > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size x pipeline_parallel_size = {ranks} ranks exceed the "
                f"{torch.cuda.device_count()} CUDA devices of this machine: one rank per device"
            )
    elif ranks > (cores := os.cpu_count() or 1):
        warnings.warn(
            f"tensor_parallel_size x pipeline_parallel_size = {ranks} ranks on {cores} CPU cores: the stages share "
            "cores, one thread each, and run slower than on a machine with a core per rank",
            RuntimeWarning,
            stacklevel=3,
        )
