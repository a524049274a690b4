"""Tensor-parallel state: this process's rank, how many ranks share each weight matrix, and the group whose
collectives add up their partial results.

One process alone is rank 0 of 1 and every layer holds all of its matrix. Under `LLM(tensor_parallel_size=N)`
(chapter 10) each rank builds the model inside `tensor_parallel(group)`: its layers take their share of the
weights and keep the group for their all-reduces.
"""

import datetime
import os
import pickle
import signal
import threading
import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

FOREVER = datetime.timedelta(days=365)  # a worker may wait that long for rank 0's next step (an idle notebook)
STEP_TIMEOUT = datetime.timedelta(minutes=10)  # one collective of a forward pass


class TensorParallelGroup:
    """`size` processes, this one `rank`, that split every layer. Two torch.distributed process groups on one
    store: `control` (gloo) carries rank 0's step messages, `device` (gloo on CPU, NCCL on CUDA) the collectives
    of the forward pass. Standalone groups, not torch.distributed's default one, so that one process can hold
    several engines, or drop one and start another.

    A step that fails on one rank half-way leaves the others waiting inside a collective it will never join.
    That rank abandons the step: it shuts its device group down, which fails their wait too; before the next
    step, rank 0 sends RENEW and every rank opens a fresh device group. The KV cache stays: the engine
    recomputes the failed step's tokens. Not on CUDA (`renewable` False): shutting an NCCL communicator down does
    not fail a peer's pending kernel (it waits until the watchdog), and captured CUDA graphs would replay the old
    communicator; there the engine closes on a failed step."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device, local_rank: int = 0):
        self.store, self.rank, self.size, self.device, self.local_rank = store, rank, size, device, local_rank
        self.control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, FOREVER)
        self.generation, self.abandoned = -1, True
        # the bytes of this rank's tensors in its all-reduces and gathers; a ring all-reduce over N ranks sends
        # 2 (N - 1) / N of them from each rank (as many, for N = 2)
        self.bytes_reduced = 0
        self.renewable = device.type != "cuda"
        self.renew()

    def renew(self) -> None:
        """Open the next device group (closing the current one if no failure did)."""
        self.close_device_group()
        self.generation += 1
        store = dist.PrefixStore(f"device{self.generation}", self.store)
        if self.device.type == "cuda":
            self.device_group = dist.ProcessGroupNCCL(store, self.rank, self.size)
        else:
            self.device_group = dist.ProcessGroupGloo(store, self.rank, self.size, STEP_TIMEOUT)
        self.abandoned = False

    def abandon_step(self, error: BaseException) -> None:
        """Give up the current step: fail the collectives the other ranks wait in (see the class docstring)."""
        self.close_device_group()
        if self.rank > 0 and "closed by peer" not in str(error):  # not rank 0 abandoning: this rank's own fault
            traceback.print_exception(error)

    def send_step(self, inputs) -> None:
        """Rank 0: send a step's inputs (None: the end) to the other ranks, renewing the group first if needed."""
        if self.abandoned:
            self.broadcast_object(RENEW)
            self.renew()
        self.broadcast_object(inputs)

    def receive_step(self):
        """Ranks > 0: the next step's inputs from rank 0 (None: the end)."""
        while (inputs := self.broadcast_object()) == RENEW:
            self.renew()
        return inputs

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        self.bytes_reduced += x.nbytes
        self.device_group.allreduce([x]).wait()
        return x

    def min(self, n: int) -> int:
        """The smallest of every rank's n."""
        opts, t = dist.AllreduceOptions(), torch.tensor([n])
        opts.reduceOp = dist.ReduceOp.MIN
        self.control.allreduce([t], opts).wait()
        return int(t)

    def gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's x, in rank order, on rank 0 (None on the others)."""
        opts = dist.GatherOptions()
        opts.rootRank = 0
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else []
        self.bytes_reduced += x.nbytes
        self.device_group.gather([parts] if parts else [], [x], opts).wait()
        return parts or None

    def broadcast_object(self, obj=None):
        """Rank 0 sends a picklable object, the others receive it (and return it): its length, then its bytes.
        Ctrl-C waits until both have gone, so that no rank is left half-way through a message."""
        with deferred_interrupt():
            data = pickle.dumps(obj) if self.rank == 0 else b""
            length = torch.tensor([len(data)])
            self.control.broadcast(length, 0).wait()
            payload = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if data
                else torch.empty(int(length), dtype=torch.uint8)
            )
            self.control.broadcast(payload, 0).wait()
            return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def close_device_group(self) -> None:
        """Shut the device group down; dropping the last reference closes its connections, which is what fails
        a peer's pending collective."""
        if not self.abandoned:
            self.device_group.shutdown()
            self.device_group, self.abandoned = None, True

    def close(self) -> None:
        self.close_device_group()
        self.control.shutdown()


RENEW = "renew"  # rank 0's message before a step that follows an abandoned one


@contextmanager
def deferred_interrupt():
    """Hold Ctrl-C (SIGINT) until the block ends, so that no rank stops between two halves of one message."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


@contextmanager
def cpu_threads(n: int | None):
    """torch's intra-op threads set to n inside the block (unchanged for None)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_GROUP: TensorParallelGroup | None = None  # the group of the model being built (see tensor_parallel)


@contextmanager
def tensor_parallel(group: TensorParallelGroup | None):
    """Layers built inside this block are this rank's shards of `group` (whole layers for None)."""
    global _GROUP
    previous, _GROUP = _GROUP, group
    try:
        yield
    finally:
        _GROUP = previous


def get_tp_group() -> TensorParallelGroup | None:
    return _GROUP


def get_tp_rank() -> int:
    return _GROUP.rank if _GROUP else 0


def get_tp_size() -> int:
    return _GROUP.size if _GROUP else 1


def divide(total: int, parts: int, what: str) -> int:
    """total / parts, or an error naming what does not split evenly across the ranks."""
    if total % parts:
        raise ValueError(
            f"{what} ({total}) does not split evenly across tensor_parallel_size={parts}: choose a size that divides it"
        )
    return total // parts


def all_reduce(x: torch.Tensor, group: TensorParallelGroup | None) -> torch.Tensor:
    """Sum x over the ranks of `group`, in place (nothing to do without one)."""
    return group.all_reduce(x) if group else x


def check_tensor_parallel(model_config, size: int, device: str, enforce_eager: bool | None) -> None:
    """Errors, before any process starts, for a tensor_parallel_size this model or machine cannot take."""
    c = model_config
    for what, total in [
        ("attention heads", c.num_attention_heads),
        ("key/value heads", c.num_key_value_heads),
        ("intermediate size", c.intermediate_size),
        ("vocabulary size", c.vocab_size),
    ]:
        if total % size:
            fits = [
                n
                for n in range(1, c.num_key_value_heads + 1)
                if not (
                    c.num_attention_heads % n
                    or c.num_key_value_heads % n
                    or c.intermediate_size % n
                    or c.vocab_size % n
                )
            ]
            raise ValueError(
                f"tensor_parallel_size={size} does not divide the model's {what} ({total}): choose one of {fits}"
            )
    have = torch.cuda.device_count() if torch.device(device).type == "cuda" else os.cpu_count() or 1
    if size > have:
        unit = "CUDA devices" if torch.device(device).type == "cuda" else "CPU cores"
        raise ValueError(
            f"tensor_parallel_size={size} exceeds the {have} {unit} of this machine: one rank per "
            f"{unit[:-1]}, so at most {have}"
        )
    if enforce_eager is False and torch.device(device).type == "cpu":
        raise ValueError(
            "enforce_eager=False with tensor_parallel_size > 1 on a CPU is not supported (a compiled "
            "decode step cannot hold the gloo all-reduces): leave enforce_eager at its default"
        )


def env_store() -> tuple[dist.Store, int, int]:
    """The store, rank and world size of torch.distributed's env:// convention: MASTER_ADDR and MASTER_PORT
    say where rank 0 serves the store, RANK and WORLD_SIZE who this process is (torchrun sets all four)."""
    return next(dist.rendezvous("env://", timeout=STEP_TIMEOUT))


def launched_by_torchrun() -> bool:
    """True in a process that torchrun (or another env:// launcher) started as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
