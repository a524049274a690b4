"""Pipeline parallelism (chapter 15): the layers split into stages as evenly as possible, each rank holds and loads
only its stage, `LLM(pipeline_parallel_size=2)` (also with tensor_parallel_size=2, and under torchrun with two
"nodes") gives the tokens of one process with two batches in flight, the scheduler keeps an in-flight request out of
the next batch, and a lost stage or a failed step ends the engine clearly with no process left behind."""

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from checkpoints import make_checkpoint
from test_parallel import alive, shm

import minillm.engine.core as core
import minillm.utils.loader as loader
from minillm import LLM, SamplingParams
from minillm.config import Config, ModelConfig, default_model_path
from minillm.engine.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.models import build_model
from minillm.utils.pipeline import (
    IntermediateTensors,
    PPMissingLayer,
    StageRecord,
    bubble_share,
    check_pipeline_parallel,
    get_pp_indices,
    pipeline_parallel,
)

STORY = "Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog. "
PROMPTS = ["Once upon a time", "The little dog", STORY * 3, "Tom had", STORY * 5 + "One day"]  # two past 64 tokens
GREEDY = SamplingParams(temperature=0, max_tokens=20)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=20, seed=7)
SETTINGS = dict(max_num_batched_tokens=64)  # the long prompts are prefilled in chunks
IDS = [[5, 80, 13, 200, 7], [1, 2, 3], list(range(40, 130)), [9] * 20]  # for the random model (256 byte tokens)
OVERSUBSCRIBED = "ignore:tensor_parallel_size x pipeline_parallel_size"  # 4 ranks on a 2-core machine: warned


@pytest.fixture(autouse=True)
def bounded():
    """No test may hang: past 240 s the run stops with every thread's traceback (workers exit with their parent)."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def tokens(llm, prompts=PROMPTS, sp=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]


@contextmanager
def engine(*args, **kwargs):
    """A parallel engine; afterwards every KV block it held is free, its workers are gone and /dev/shm is as
    before."""
    before = shm()
    llm = LLM(*args, **SETTINGS, **kwargs)
    pids = [p.pid for p in llm.workers]
    try:
        yield llm
        assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks), "a KV block was leaked"
    finally:
        llm.close()
    assert not any(alive(pid) for pid in pids), "a worker outlived its engine"
    assert shm() <= before, f"shared memory left behind: {shm() - before}"


@pytest.fixture(scope="module")
def expected():
    with LLM(**SETTINGS) as llm:
        return {"greedy": tokens(llm), "seeded": tokens(llm, sp=SEEDED), "blocks": llm.model_runner.num_kvcache_blocks}


@pytest.fixture(scope="module")
def random5(tmp_path_factory):
    """An untied GQA model with an odd number of layers (5: stages of 3 and 2), and one process's tokens on it."""
    path = tmp_path_factory.mktemp("qwen3-5-layers")
    make_checkpoint("qwen3-gqa-untied", path, num_hidden_layers=5)
    with LLM(path, **SETTINGS) as llm:
        return path, tokens(llm, IDS)


def test_layers_split_as_evenly_as_possible_the_last_stage_lighter():
    assert [get_pp_indices(4, r, 2) for r in range(2)] == [(0, 2), (2, 4)]
    assert [get_pp_indices(5, r, 2) for r in range(2)] == [(0, 3), (3, 5)]
    assert [get_pp_indices(6, r, 4) for r in range(4)] == [(0, 1), (1, 3), (3, 5), (5, 6)]
    for layers in range(1, 30):
        for size in range(1, layers + 1):
            parts = [get_pp_indices(layers, r, size) for r in range(size)]
            sizes = [end - start for start, end in parts]
            assert parts[0][0] == 0 and parts[-1][1] == layers, "every layer, once"
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:])), "contiguous stages"
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1 and sizes[-1] == min(sizes)


def test_bubble_share_of_synthetic_timelines():
    one_at_a_time = [StageRecord(t % 2, t // 2, t, t + 1, 0) for t in range(4)]  # stage 0, 1 of batch 0, then 1
    overlapped = [StageRecord(0, b, b, b + 1, 0) for b in range(3)] + [
        StageRecord(1, b, b + 1, b + 2, 0) for b in range(3)
    ]
    assert bubble_share(one_at_a_time, 2) == 0.5
    assert bubble_share(overlapped, 2) == 0.25
    assert bubble_share([StageRecord(0, 0, 0, 1, 0)], 1) == 0.0 and bubble_share([], 2) == 0.0


def test_an_in_flight_request_stays_out_of_the_next_batch():
    """The batch queue's contract with the scheduler: a request of a batch in flight keeps its seat and its blocks,
    but no plan schedules or preempts it until its tokens are back."""
    s = Scheduler(Config(new_token_ratio=0.0, max_num_seqs=3), BlockManager(6, 4), eos_token_ids=[0])
    a, b, c = Sequence([1, 2, 3, 4]), Sequence([5, 6, 7, 8]), Sequence([9, 10, 11])
    for seq in (a, b, c):
        s.add(seq)
    first = s.schedule(max_seqs=2)  # two batches in flight share the three requests
    assert first.scheduled == [a, b] and list(s.waiting) == [c]
    s.in_flight.update(first.scheduled)
    second = s.schedule()
    assert second.scheduled == [c] and list(s.running) == [a, b, c], "a and b stay running, out of the plan"
    s.in_flight.update(second.scheduled)
    assert s.schedule().scheduled == [], "everything is in flight: nothing to plan, wait for the oldest batch"
    s.in_flight.difference_update(first.scheduled)  # the first batch's tokens come back
    s.update_from_output(first, [[20], [21]])
    third = s.schedule()
    assert third.scheduled == [a, b] and not third.is_prefill, "c is still in flight"

    # 2 blocks of 2 tokens, both held: a's next token needs a block. The victim would be c (the later arrival),
    # but c is in flight, so a preempts itself
    s = Scheduler(Config(new_token_ratio=0.0, max_num_seqs=2), BlockManager(2, 2), eos_token_ids=[0])
    a, c = Sequence([1, 2]), Sequence([3, 4])
    s.add(a)
    s.add(c)
    first = s.schedule(max_seqs=1)
    s.in_flight.update(first.scheduled)
    s.in_flight.update(s.schedule().scheduled)
    assert s.in_flight == {a, c}
    s.in_flight.discard(a)
    s.update_from_output(first, [[7]])
    assert s.schedule().scheduled == [] and a.status == SequenceStatus.WAITING and not a.block_table
    assert c.status == SequenceStatus.RUNNING and c.block_table and list(s.running) == [c]


def stage_model(path, rank: int, size: int):
    with pipeline_parallel(SimpleNamespace(rank=rank, size=size)):
        return build_model(path)


def test_each_stage_builds_and_loads_only_its_layers(tmp_path, monkeypatch):
    """Built in one process, stage by stage: each holds (and reads from the checkpoint) only its layers, the first
    the embedding, the last the norm and the LM head (untied here); run one after the other, they give the logits
    of the whole model."""
    make_checkpoint("qwen3-gqa-untied", tmp_path, num_hidden_layers=5)
    read, original = [], loader.safetensors_tensors  # the checkpoint tensors each stage reads
    monkeypatch.setattr(
        loader, "safetensors_tensors", lambda *a: ((n, t) for n, t in original(*a) if read.append(n) or 1)
    )
    first, read_first = stage_model(tmp_path, 0, 2), list(read)
    last, read_last = stage_model(tmp_path, 1, 2), read[len(read_first) :]
    params = [[n for n, _ in m.named_parameters()] for m in (first, last)]
    layers = [{int(n.split(".")[2]) for n in names if ".layers." in n} for names in params + [read_first, read_last]]
    holds = lambda names, prefix: any(n.startswith(prefix) for n in names)
    assert layers == [{0, 1, 2}, {3, 4}] * 2
    assert isinstance(first.model.layers[3], PPMissingLayer) and isinstance(last.model.layers[2], PPMissingLayer)
    for names in params[0], read_first:
        assert holds(names, "model.embed_tokens.") and not holds(names, ("model.norm.", "lm_head."))
    for names in params[1], read_last:
        assert not holds(names, "model.embed_tokens.") and holds(names, "model.norm.") and holds(names, "lm_head.")
    whole, ids = build_model(tmp_path), torch.tensor(IDS[0])
    with torch.inference_mode():
        hidden = first(ids, torch.arange(len(ids)))
        assert isinstance(hidden, IntermediateTensors)
        logits = last.compute_logits(last(ids, torch.arange(len(ids)), hidden))
        torch.testing.assert_close(logits, whole.compute_logits(whole(ids, torch.arange(len(ids)))))


def test_a_tied_head_on_the_last_stage_keeps_the_embedding_table():
    last = stage_model(default_model_path(), 1, 2)  # the default model ties its LM head to the embedding
    assert last.lm_head.weight is last.model.embed_tokens.weight
    assert isinstance(stage_model(default_model_path(), 0, 2).lm_head, PPMissingLayer)


def test_settings_a_pipeline_cannot_take_fail_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(ValueError, match="pipeline_parallel_size must be a positive integer, got 0"):
        LLM(pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="pipeline_parallel_size=5 exceeds the model's 4 layers.*at most 4"):
        LLM(pipeline_parallel_size=5)
    with pytest.raises(ValueError, match="speculative decoding is not supported with pipeline_parallel_size > 1"):
        LLM(pipeline_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="quantization='int8' runs on one rank only: set pipeline_parallel_size=1"):
        LLM(pipeline_parallel_size=2, quantization="int8")
    with pytest.raises(ValueError, match="enforce_eager=False with pipeline_parallel_size > 1 is not supported"):
        LLM(pipeline_parallel_size=2, enforce_eager=False)


def test_more_ranks_than_cores_is_warned_one_thread_each(monkeypatch):
    model_config = ModelConfig.from_pretrained(default_model_path())
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.warns(RuntimeWarning, match="= 4 ranks on 2 CPU cores: the stages share cores, one thread each"):
        check_pipeline_parallel(model_config, Config(tensor_parallel_size=2, pipeline_parallel_size=2))


@pytest.mark.slow
def test_pp2_gives_the_tokens_of_one_process_with_two_batches_in_flight(expected, monkeypatch):
    in_flight, submit = [], core.submit  # how many batches were in flight whenever one was submitted

    with engine(pipeline_parallel_size=2) as llm:
        queue = llm.engine_core.batch_queue
        monkeypatch.setattr(core, "submit", lambda *args: in_flight.append(len(queue)) or submit(*args))
        assert llm.model_runner.num_kvcache_blocks == 2 * expected["blocks"], "a stage caches half the layers"
        llm.model_runner.timeline = []
        assert tokens(llm) == expected["greedy"]
        assert max(in_flight) == 1, "a second batch went in while the first was in flight"
        timeline = llm.model_runner.timeline
        assert set(Counter((r.batch, r.stage) for r in timeline).values()) == {1}
        assert len(timeline) == 2 * len({r.batch for r in timeline}) == 2 * len(in_flight), "both stages ran each"
        assert all(r.start <= r.end and r.bytes_received > 0 for r in timeline)
        assert 0 < bubble_share(timeline, 2) < 1
        assert tokens(llm, sp=SEEDED) == expected["seeded"], "rank 0 samples, with each request's own generator"
        llm.engine_core.max_concurrent_batches = 3
        with pytest.raises(ValueError, match=r"max_concurrent_batches=3: set it from 1 .* to the pipeline's 2 stages"):
            tokens(llm)


@pytest.mark.slow
def test_a_request_aborted_in_flight_loses_only_its_own_token(expected):
    """Aborting a request frees its blocks at once, while its batch is still in flight: the batch's logits rows stay
    those fixed when it was submitted, so every other request of the batch gets its own token."""
    decoding = lambda output: [s for s in output.scheduled if s.num_scheduled_tokens == 1 and s.num_computed_tokens]
    with engine(pipeline_parallel_size=2) as llm:
        seqs = [llm.add_request(prompt, GREEDY) for prompt in PROMPTS]
        while not (flying := [out for out, _ in llm.engine_core.batch_queue if len(decoding(out)) >= 2]):
            llm.step()
        victim = min(decoding(flying[-1]), key=len)  # the first of its batch's logits rows
        llm.abort_request(victim)
        while not llm.is_finished():
            llm.step()
        assert victim.finish_reason == "abort"
        assert [s.completion_token_ids for s in seqs if s is not victim] == [
            want for s, want in zip(seqs, expected["greedy"]) if s is not victim
        ]


@pytest.mark.slow
@pytest.mark.filterwarnings(OVERSUBSCRIBED)
def test_tp2_x_pp2_gives_the_tokens_of_one_process(expected):
    with engine(tensor_parallel_size=2, pipeline_parallel_size=2) as llm:
        assert len(llm.workers) == 3
        assert tokens(llm) == expected["greedy"]


@pytest.mark.slow
@pytest.mark.filterwarnings(OVERSUBSCRIBED)
@pytest.mark.parametrize("tp", [1, 2])
def test_an_odd_number_of_layers_gives_the_tokens_of_one_process(random5, tp):
    path, want = random5
    with engine(path, pipeline_parallel_size=2, tensor_parallel_size=tp) as llm:
        assert tokens(llm, IDS) == want


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_nodes_on_loopback(tmp_path, expected):
    """Two torchrun commands stand for two machines: one rank each, a stage each, the c10d rendezvous on 127.0.0.1
    (torchrun numbers the nodes as they join; --node-rank is only for its static rendezvous)."""
    script = tmp_path / "pp.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        from minillm import LLM, SamplingParams
        llm = LLM(pipeline_parallel_size=2, **{SETTINGS!r})  # rank 1 serves rank 0 here, then exits
        outs = llm.generate({PROMPTS!r}, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
        json.dump([o.token_ids for o in outs], open(sys.argv[1], "w"))
        llm.close()
    """)
    )
    out, port = tmp_path / "out.json", free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"127.0.0.1:{port}", script, out]
    run = lambda: subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    nodes = [run(), run()]
    try:
        logs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:  # each node's whole process group: torchrun and the rank it started
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert json.loads(out.read_text()) == expected["greedy"]


@pytest.mark.slow
@pytest.mark.filterwarnings(OVERSUBSCRIBED)
def test_a_killed_stage_stops_the_engine_with_a_clear_error():
    """TP=2 x PP=2: the last stage's second rank killed mid-generation. The engine names it, and stops the other
    workers: the rank of its stage (which fails in their all-reduce) and stage 0's second rank."""
    before = shm()
    llm = LLM(tensor_parallel_size=2, pipeline_parallel_size=2, **SETTINGS)
    workers = list(llm.workers)
    stream = llm.stream(PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    next(stream)
    os.kill(workers[2].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 3 \(pid \d+\) of pipeline stage 1 exited with code -9.*new LLM"):
        for _ in stream:
            pass
    assert time.monotonic() - start < 15
    assert not any(alive(w.pid) for w in workers) and shm() <= before
    with pytest.raises(RuntimeError, match="this engine is closed"):
        tokens(llm)
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


@pytest.mark.slow
def test_a_failed_step_closes_the_engine_clearly(monkeypatch):
    """A step that fails on rank 0 mid-forward leaves its stages out of step and its batches lost in flight: the
    engine closes with an error that says so, and stops its worker at once."""
    with engine(pipeline_parallel_size=2) as llm:
        mlp, calls = llm.model_runner.model.model.layers[1].mlp, [0]

        def failing(x):
            calls[0] += 1
            if calls[0] == 4:
                raise RuntimeError("injected")
            return type(mlp).forward(mlp, x)

        monkeypatch.setattr(mlp, "forward", failing)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"pipeline-parallel step failed \(RuntimeError: injected\).*new LLM"):
            tokens(llm)
        assert time.monotonic() - start < 10 and not any(alive(w.pid) for w in llm.workers)
        with pytest.raises(RuntimeError, match="this engine is closed"):
            tokens(llm)


@pytest.mark.slow
def test_ctrl_c_waits_for_the_step_and_leaves_the_engine_usable(expected, monkeypatch):
    with engine(pipeline_parallel_size=2) as llm:
        collect, calls = core.collect, [0]

        def interrupted(*args):  # Ctrl-C while rank 0 waits for the last stage's logits
            calls[0] += 1
            if calls[0] == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return collect(*args)

        monkeypatch.setattr(core, "collect", interrupted)
        with pytest.raises(KeyboardInterrupt):
            tokens(llm)
        assert not llm.closed and len(llm.engine_core.batch_queue) == 1, "the other batch is still in flight"
        assert tokens(llm) == expected["greedy"], "its aborted requests' tokens are dropped when they come back"
