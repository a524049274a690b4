"""Tensor-parallel state: one process is rank 0 of 1; two gloo processes split every layer and still compute the
logits of the whole model (the layers' shard arithmetic and collectives, before chapter 10's workers)."""
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from checkpoints import make_checkpoint

from minillm.models import build_model
from minillm.utils.parallel import divide, get_tp_rank, get_tp_size

NAMES = ["qwen3-gqa-tied", "qwen2-gqa-bias", "llama-mha-llama3-rope"]  # GQA, qkv bias, untied LM head
IDS = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])


def logits_of(path) -> torch.Tensor | None:
    model = build_model(path)
    with torch.inference_mode():
        return model.compute_logits(model(IDS, torch.arange(len(IDS))))


def tp_worker(rank: int, port: int, paths: list, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        shapes = build_model(paths[0]).model.layers[0].self_attn.qkv_proj.weight.shape
        out = [logits_of(p) for p in paths]
        if rank == 0:
            results.update(logits=out, shape=tuple(shapes))
        else:
            results.update(rank1_none=all(o is None for o in out))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_process_is_rank_0_of_1():
    assert (get_tp_rank(), get_tp_size()) == (0, 1)
    with pytest.raises(ValueError, match=r"key/value heads \(2\) does not split evenly across tensor_parallel_size=4"):
        divide(2, 4, "key/value heads")


@pytest.mark.slow
def test_two_ranks_compute_the_logits_of_one(tmp_path):
    paths = []
    for name in NAMES:
        make_checkpoint(name, tmp_path / name)
        paths.append(tmp_path / name)
    expected = [logits_of(p) for p in paths]
    with mp.Manager() as manager:
        results = [manager.dict(), manager.dict()]
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [ctx.Process(target=tp_worker, args=(rank, port, paths, results[rank])) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0]
        rank0, rank1 = dict(results[0]), dict(results[1])
    assert rank0["shape"] == (128, 64), "rank 0 holds half of q (2 of 4 heads) and of k, v (1 of 2 heads each)"
    assert rank1["rank1_none"], "only rank 0 gathers the logits"
    for name, got, want in zip(NAMES, rank0["logits"], expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=name)
