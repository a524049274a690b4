"""Workers: ranks 1..N-1 of a tensor- or pipeline-parallel engine, one process each, running the steps that rank 0
sends. N = tensor_parallel_size x pipeline_parallel_size, and rank r is tensor-parallel rank r % tp of pipeline
stage r // tp (vLLM's layout): rank 0 is stage 0's first rank, and runs the engine.

`LLM(tensor_parallel_size=..., pipeline_parallel_size=...)` is rank 0. It serves a torch.distributed store on a
free port and starts each worker as a Python process running `main` with the env:// variables torchrun also sets
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK). A worker finds the engine's settings in the store, builds
its part of the model (its stage's layers, its shard of each) and loops on `ModelRunner.loop` until rank 0 sends
the end. Under torchrun there are no workers to start: every rank runs the user's script, and `LLM(...)` on ranks
> 0 becomes the loop (see `serve`).
"""

import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from minillm.config import Config
from minillm.engine.model_runner import ModelRunner
from minillm.platforms import cpu_threads_per_rank
from minillm.utils.parallel import TensorParallelGroup, env_store, launched_by_torchrun
from minillm.utils.pipeline import PipelineGroup

CONFIG_KEY = "minillm/config"
WORKER = "from minillm.engine.worker import main; main()"


def num_ranks(config: Config) -> int:
    return config.tensor_parallel_size * config.pipeline_parallel_size


def join_groups(
    store: dist.Store, rank: int, config: Config, local_rank: int
) -> tuple[TensorParallelGroup | None, PipelineGroup | None]:
    """This rank's groups: the tensor-parallel group of its stage (None with one rank per stage) and, with several
    stages, the pipeline group. Each stage's tensor-parallel group is its own, on its own part of the store."""
    tp, pp, device = config.tensor_parallel_size, config.pipeline_parallel_size, torch.device(config.device)
    stage_store = dist.PrefixStore(f"stage{rank // tp}", store) if pp > 1 else store
    group = TensorParallelGroup(stage_store, rank % tp, tp, device, local_rank) if tp > 1 else None
    return group, PipelineGroup(store, rank, tp, pp, local_rank) if pp > 1 else None


def join_workers(config: Config, path: Path) -> tuple[TensorParallelGroup | None, PipelineGroup | None, list]:
    """Rank 0's groups and the worker processes it started. Under torchrun, ranks > 0 serve rank 0 here and then
    exit the process (one script runs on every rank; only rank 0 gets past `LLM(...)`)."""
    if not launched_by_torchrun():
        return start_workers(config, path)
    store, rank, size = env_store()
    if size != num_ranks(config):
        raise ValueError(
            f"tensor_parallel_size={config.tensor_parallel_size} x pipeline_parallel_size="
            f"{config.pipeline_parallel_size} needs {num_ranks(config)} ranks but torchrun started {size} "
            f"processes: use --nproc-per-node (times --nnodes) = {num_ranks(config)}"
        )
    group, pipe = join_groups(store, rank, config, int(os.environ.get("LOCAL_RANK", 0)))
    if rank > 0:
        serve(ModelRunner(config, path, group, pp=pipe))
        raise SystemExit(0)
    return group, pipe, []


def start_workers(config: Config, path: Path) -> tuple[TensorParallelGroup | None, PipelineGroup | None, list]:
    """Rank 0: serve the store, start ranks 1..N-1 and join the groups with them."""
    size = num_ranks(config)
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)  # port 0: a free port
    store.set(CONFIG_KEY, pickle.dumps((config, path)))
    procs = []
    try:
        for rank in range(1, size):
            env = dict(
                os.environ,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(store.port),
                RANK=str(rank),
                WORLD_SIZE=str(size),
                LOCAL_RANK=str(rank),
                MINILLM_PARENT_PID=str(os.getpid()),
            )
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env))
        wait_until_joined(store, procs)
        return *join_groups(store, 0, config, 0), procs
    except BaseException:
        stop_workers(None, None, procs)
        raise


def wait_until_joined(store: dist.Store, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    """Wait for every worker to reach the store, or say which one exited while starting."""
    deadline = time.monotonic() + timeout
    for rank, proc in enumerate(procs, 1):
        while not store.check([f"joined{rank}"]):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker rank {rank} exited with code {proc.returncode} while starting; its error is printed above"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker rank {rank} did not start within {timeout:.0f} s")
            time.sleep(0.02)


def describe_failed(procs: list[subprocess.Popen], tp_size: int = 1, pp_size: int = 1) -> str | None:
    """Which workers have exited, and how (and, under pipeline parallelism, of which stage); None while all run."""
    dead = [
        f"rank {rank} (pid {p.pid}){f' of pipeline stage {rank // tp_size}' if pp_size > 1 else ''} "
        f"exited with code {p.returncode}"
        for rank, p in enumerate(procs, 1)
        if p.poll() is not None
    ]
    return "; ".join(dead) or None


def stop_workers(
    group: TensorParallelGroup | None, pipe: PipelineGroup | None, procs: list[subprocess.Popen], timeout: float = 10
) -> None:
    """Rank 0: send the end, give the workers `timeout` seconds to exit, then terminate, then kill them (at once
    when they cannot all hear it: a worker is gone, or a step was abandoned on a group that cannot be renewed)."""
    groups = [g for g in (group, pipe) if g is not None]
    if describe_failed(procs) or any(g.abandoned and not g.renewable for g in groups):
        timeout = 0
    try:
        if groups and timeout:
            if group:
                group.send_step(None)
            if pipe:
                pipe.send_end(timeout)
    except Exception:
        pass  # a worker already gone, or one that does not answer: terminated below
    for g in groups:
        g.close()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def serve(runner) -> None:
    """Ranks > 0: run rank 0's steps until it ends them, then leave the groups."""
    try:
        runner.loop()
    finally:
        for g in (runner.group, runner.pp):
            if g is not None:
                g.close()


def exit_with_parent(parent_pid: int) -> None:
    """A worker whose engine's process is gone (killed, crashed) exits too, instead of lingering."""

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    """A worker started by start_workers: the env:// variables say where the store is and which rank this is."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches every process: rank 0 handles it
    exit_with_parent(int(os.environ["MINILLM_PARENT_PID"]))
    store, rank, size = env_store()
    config, path = pickle.loads(store.get(CONFIG_KEY))
    torch.set_num_threads(cpu_threads_per_rank(size))  # the ranks split the CPU's cores
    store.set(f"joined{rank}", "1")
    group, pipe = join_groups(store, rank, config, int(os.environ["LOCAL_RANK"]))
    serve(ModelRunner(config, path, group, pp=pipe))
