"""Tensor parallelism (chapter 10): the layers' shards add up to the whole model, `LLM(tensor_parallel_size=2)`
gives the tokens of one process, also under torchrun, and its worker processes never outlive it: not after
close, garbage collection, a failed step, or a worker killed mid-generation."""

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from checkpoints import make_checkpoint

from minillm import LLM, SamplingParams
from minillm.kernels.cpu import cpu_kernels
from minillm.models import build_model
from minillm.utils.parallel import TensorParallelGroup, divide, get_tp_rank, get_tp_size, tensor_parallel

NAMES = ["qwen3-gqa-tied", "qwen2-gqa-bias", "llama-mha-llama3-rope"]  # GQA, qkv bias, untied LM head
IDS = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])
PROMPTS = ["Once upon a time", "The little dog", "A girl named Lily went to the park", "Tom had"]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=24, seed=7)

pytestmark = pytest.mark.slow


def logits_of(path) -> torch.Tensor | None:
    model = build_model(path)
    with torch.inference_mode():
        return model.compute_logits(model(IDS, torch.arange(len(IDS))))


def tp_worker(rank: int, port: int, paths: list, results: dict) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    group = TensorParallelGroup(store, rank, 2, torch.device("cpu"))
    with tensor_parallel(group):
        shapes = build_model(paths[0]).model.layers[0].self_attn.qkv_proj.weight.shape
        out = [logits_of(p) for p in paths]
    group.close()
    results.update(logits=out, shape=tuple(shapes)) if rank == 0 else results.update(none=all(o is None for o in out))


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def tokens(llm, prompts=PROMPTS, sp=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]


@pytest.fixture(scope="module")
def expected():
    llm = LLM()
    return {"greedy": tokens(llm), "seeded": tokens(llm, sp=SEEDED)}


@pytest.fixture
def tp2():
    """A TP=2 engine on the default model; afterwards its worker is gone and /dev/shm is as before."""
    before = shm()
    llm = LLM(tensor_parallel_size=2)
    pids = [p.pid for p in llm.workers]
    yield llm
    llm.close()
    assert not any(alive(pid) for pid in pids), "a worker outlived its engine"
    assert shm() <= before, f"shared memory left behind: {shm() - before}"


def test_one_process_is_rank_0_of_1():
    assert (get_tp_rank(), get_tp_size()) == (0, 1)
    with pytest.raises(ValueError, match=r"key/value heads \(2\) does not split evenly across tensor_parallel_size=4"):
        divide(2, 4, "key/value heads")


def test_two_ranks_compute_the_logits_of_one(tmp_path):
    paths = []
    for name in NAMES:
        make_checkpoint(name, tmp_path / name)
        paths.append(tmp_path / name)
    expected_logits = [logits_of(p) for p in paths]
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    with mp.Manager() as manager:
        results = [manager.dict(), manager.dict()]
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=tp_worker, args=(rank, store.port, paths, results[rank])) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0]
        rank0, rank1 = dict(results[0]), dict(results[1])
    assert rank0["shape"] == (128, 64), "rank 0 holds half of q (2 of 4 heads) and of k, v (1 of 2 heads each)"
    assert rank1["none"], "only rank 0 gathers the logits"
    for name, got, want in zip(NAMES, rank0["logits"], expected_logits):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=name)


def test_tp2_gives_the_tokens_of_one_process(tp2, expected):
    if cpu_kernels():  # each rank's row-parallel shards are packed and multiplied by the C++ kernel too
        o_proj = tp2.model_runner.model.model.layers[0].self_attn.o_proj
        assert o_proj.tp_size == 2 and o_proj.kernel is not None and o_proj.weight.dim() == 3
    assert tokens(tp2) == expected["greedy"]
    assert tokens(tp2, sp=SEEDED) == expected["seeded"], "rank 0 samples, with the request's own seed"
    assert tp2.block_manager.num_free_blocks == len(tp2.block_manager.blocks)


def test_tp2_verifies_drafts_as_one_process(tmp_path):
    """Speculative decoding under tensor parallelism: a verify step goes to every rank; rank 0 accepts."""
    make_checkpoint("qwen3-gqa-tied", tmp_path)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [9, 8, 7, 9, 8], list(range(40, 60))]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    with LLM(tmp_path) as one, LLM(tmp_path, tensor_parallel_size=2, speculative_config=spec) as two:
        assert tokens(two, prompts) == tokens(one, prompts)
        assert two.spec_stats.num_accepted_tokens > 0


def test_tp2_on_an_untied_gqa_oracle_model(tmp_path):
    make_checkpoint("qwen3-gqa-untied", tmp_path)
    prompts = [[5, 80, 13, 200, 7], [1, 2, 3], list(range(40, 90))]
    with LLM(tmp_path) as one, LLM(tmp_path, tensor_parallel_size=2) as two:  # two engines side by side
        assert tokens(two, prompts) == tokens(one, prompts)


def test_torchrun_runs_the_same_script_on_every_rank(tmp_path, expected):
    script = tmp_path / "tp.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        from minillm import LLM, SamplingParams
        llm = LLM(tensor_parallel_size=2)  # ranks > 0 serve rank 0 here, then exit
        outs = llm.generate({PROMPTS!r}, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        json.dump([o.token_ids for o in outs], open(sys.argv[1], "w"))
        llm.close()
    """)
    )
    out = tmp_path / "out.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", script, out], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text()) == expected["greedy"]


def test_a_killed_worker_stops_the_engine_with_a_clear_error(tp2):
    before = shm()
    worker = tp2.workers[0]
    stream = tp2.stream(PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    next(stream)
    os.kill(worker.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) exited with code -9.*create a new LLM"):
        for _ in stream:
            pass
    assert time.monotonic() - start < 10
    assert not alive(worker.pid) and shm() <= before
    with pytest.raises(RuntimeError, match="this engine is closed"):
        tokens(tp2)
    assert tp2.block_manager.num_free_blocks == len(tp2.block_manager.blocks)


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()])
def test_a_step_that_fails_on_rank_0_mid_forward_is_recovered(tp2, expected, monkeypatch, error):
    mlp = tp2.model_runner.model.model.layers[2].mlp
    calls = [0]

    def failing(x):  # rank 0 stops half-way through the forward pass: rank 1 waits in an all-reduce
        calls[0] += 1
        if calls[0] == 5:
            raise error
        return type(mlp).forward(mlp, x)

    monkeypatch.setattr(mlp, "forward", failing)
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            tokens(tp2)
    else:  # the failed step's requests are run alone, once each: the fault does not come back, they all finish
        assert tokens(tp2) == expected["greedy"] and calls[0] > 5
    assert tp2.block_manager.num_free_blocks == len(tp2.block_manager.blocks)
    assert tokens(tp2) == expected["greedy"], "after renewing its group, the engine gives a fresh engine's tokens"


def test_a_failed_step_closes_an_engine_whose_group_cannot_be_renewed(monkeypatch):
    """CUDA's case (NCCL cannot release a peer waiting in a collective), run on gloo with `renewable` off: the
    engine closes with a clear error, and the worker stuck in the all-reduce is terminated at once."""
    before = shm()
    llm = LLM(tensor_parallel_size=2, num_kvcache_blocks=64)
    llm.model_runner.group.renewable = False
    worker = llm.workers[0]
    mlp = llm.model_runner.model.model.layers[2].mlp
    monkeypatch.setattr(mlp, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("injected")))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="failed half-way on CUDA.*create a new LLM"):
        tokens(llm)
    assert time.monotonic() - start < 8 and not alive(worker.pid) and shm() <= before
    with pytest.raises(RuntimeError, match="this engine is closed"):
        tokens(llm)


def test_garbage_collection_stops_the_workers():
    llm = LLM(tensor_parallel_size=2)
    pids = [p.pid for p in llm.workers]
    assert all(alive(pid) for pid in pids)
    del llm
    gc.collect()
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize(
    "size, match",
    [
        (4, r"does not divide the model's key/value heads \(2\): choose one of \[1, 2\]"),
        (3, r"does not divide the model's attention heads \(8\)"),
    ],
)
def test_a_size_that_does_not_divide_the_heads_fails_before_any_process_starts(monkeypatch, size, match):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(ValueError, match=match):
        LLM(tensor_parallel_size=size)


def test_a_size_beyond_the_machine_fails_before_any_process_starts(monkeypatch, tmp_path):
    make_checkpoint("qwen3-mha-untied", tmp_path)  # 4 heads: tensor_parallel_size 4 divides everything
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 exceeds the 2 CPU cores of this machine"):
        LLM(tmp_path, tensor_parallel_size=4)


@pytest.mark.parametrize("ending", ["return", "raise", "KeyboardInterrupt", "SIGKILL"])
def test_no_worker_outlives_a_script_however_it_ends(tmp_path, ending):
    script = tmp_path / "end.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, signal, sys
        from minillm import LLM, SamplingParams
        llm = LLM(tensor_parallel_size=2)
        llm.generate(["Once upon a time"], SamplingParams(max_tokens=4), use_tqdm=False)
        print(llm.workers[0].pid, flush=True)
        ending = {ending!r}
        if ending == "raise":
            raise RuntimeError("the script fails")
        if ending == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if ending == "SIGKILL":  # no atexit, no finalizer: the worker notices its parent is gone
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    )
    before = shm()
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"worker {pid} outlived a script that ended by {ending}"
    assert shm() <= before
