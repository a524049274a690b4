"""Interrupt safety end to end: an exception or a KeyboardInterrupt raised at each point of `generate` and `stream`
(scheduling, the forward, sampling, detokenizing, update_from_output), on the first, second or fourth call there,
leaves the LLM usable: every block free, nothing waiting or running, and the same requests afterwards give the
fresh engine's tokens (so nothing the failed call left in the prefix cache is handed out). Also with compiled
decode steps, and with tensor parallelism (TP=2: rank 0 fails, rank 1 waits in a collective).
test_engine_safety.py covers a failing model forward in generate, closed streams and aborts.
"""

import functools

import pytest

import minillm.engine.llm_engine as llm_engine
import minillm.engine.scheduler as scheduler_module
from minillm import LLM, SamplingParams

# Blocks of 4; a budget of 16 tokens prefills the first prompt in two chunks (16 + 13), and the second, which
# shares its first five blocks, joins the second step with its prefix found in the cache.
ENGINE = dict(kvcache_block_size=4, num_kvcache_blocks=64, max_num_batched_tokens=16)
PROMPTS = [list(range(1, 30)), list(range(1, 21)) + [7, 7]]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def fresh(tiny_checkpoint):
    return [o.token_ids for o in LLM(tiny_checkpoint, **ENGINE).generate(PROMPTS, GREEDY, use_tqdm=False)]


def failing_on_call(fn, n: int, error: type, after: bool = False):
    """fn, except that its n-th call raises error: before doing anything, or (after=True) once it has run."""
    calls = [0]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n and not after:
            raise error("injected fault")
        out = fn(*args, **kwargs)
        if calls[0] == n and after:
            raise error("injected fault")
        return out

    return wrapper


# Where a fault is injected: (object, attribute) of the engine, patched for the failing call only.
POINTS = {
    "schedule": lambda llm: (llm.scheduler, "schedule"),
    "forward": lambda llm: (llm.model_runner, "run_model"),
    "sampling": lambda llm: (llm.model_runner.sampler, "forward"),
    "postprocess": lambda llm: (llm.scheduler, "update_from_output"),
    # inside update_from_output, after a token was appended and num_computed_tokens advanced
    "finish-check": lambda llm: (scheduler_module, "finish_reason"),
    "detokenize": lambda llm: (llm_engine.IncrementalDetokenizer, "add"),
}


def consume(llm, api: str):
    if api == "generate":
        return llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return list(llm.stream(PROMPTS, GREEDY))


def assert_usable(llm, fresh):
    bm = llm.block_manager
    assert llm.is_finished(), f"{len(llm.scheduler.waiting)} waiting and {len(llm.scheduler.running)} running"
    assert bm.num_free_blocks == len(bm.blocks) and not bm.used_block_ids, "blocks leaked"
    assert all(block.ref_count == 0 for block in bm.blocks)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == fresh, "a request after the fault must get the fresh engine's tokens"
    assert llm.is_finished() and bm.num_free_blocks == len(bm.blocks)


def inject_and_check(llm, fresh, monkeypatch, target, name, n, error, api, after=False):
    """An interrupt reaches the caller. An error in a step of one request fails that request (the call raises it);
    in a step of several, each is run alone and, as the fault does not come back, all get their tokens."""
    with monkeypatch.context() as m:
        m.setattr(target, name, failing_on_call(getattr(target, name), n, error, after))
        if error is KeyboardInterrupt:
            with pytest.raises(error, match="injected fault"):
                consume(llm, api)
        else:
            try:
                assert tokens_of(consume(llm, api)) == fresh, "after the fault, each request run alone went on"
            except error as e:
                assert "injected fault" in str(e)
    assert_usable(llm, fresh)


def tokens_of(outputs) -> list[list[int]]:
    """Each request's tokens, from generate's outputs or from a stream's pieces."""
    if outputs and hasattr(outputs[0], "token_ids"):
        return [o.token_ids for o in outputs]
    tokens = [[] for _ in PROMPTS]
    for piece in outputs:
        tokens[piece.index].append(piece.token_id)
    return tokens


# generate detokenizes once, after its requests finished: detokenizing faults are a stream's
CASES = [
    (point, api) for point in POINTS for api in ("generate", "stream") if (point, api) != ("detokenize", "generate")
]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("point, api", CASES)
def test_a_fault_at_each_point_leaves_the_llm_usable(tiny_checkpoint, fresh, monkeypatch, point, api, n, error):
    llm = LLM(tiny_checkpoint, **ENGINE)
    target, name = POINTS[point](llm)
    inject_and_check(llm, fresh, monkeypatch, target, name, n, error, api)


@pytest.mark.parametrize("api", ["generate", "stream"])
@pytest.mark.parametrize("where", ["after cache_blocks", "after schedule"])
def test_a_fault_late_in_scheduling_leaves_the_prefix_cache_clean(tiny_checkpoint, fresh, monkeypatch, api, where):
    # After BlockManager.cache_blocks made the step's blocks findable by hash (or after schedule returned), the
    # step is rolled back: blocks never filled must not be revived as cached by the next identical prompt.
    llm = LLM(tiny_checkpoint, **ENGINE)
    target, name = (llm.block_manager, "cache_blocks") if where == "after cache_blocks" else (llm.scheduler, "schedule")
    inject_and_check(llm, fresh, monkeypatch, target, name, 1, KeyboardInterrupt, api, after=True)


@pytest.mark.parametrize("api", ["generate", "stream"])
def test_an_interrupt_while_a_finished_request_is_released(tiny_checkpoint, fresh, monkeypatch, api):
    # A Ctrl-C in update_from_output between freeing a finished sequence's blocks and taking it out of running: the
    # rollback releases it completely, so the engine is not left waiting on a finished request.
    llm = LLM(tiny_checkpoint, **ENGINE)
    inject_and_check(llm, fresh, monkeypatch, llm.block_manager, "deallocate", 1, KeyboardInterrupt, api, after=True)


def test_an_interrupt_in_a_compiled_decode_step_leaves_the_llm_usable(tiny_checkpoint, fresh, monkeypatch):
    # Decode steps compiled per batch-size bucket (torch.compile on a CPU); the fault hits sampling in a decode
    # step of a stream, after the compiled forward ran.
    llm = LLM(tiny_checkpoint, enforce_eager=False, max_num_seqs=2, **ENGINE)
    assert llm.model_runner.graphs is not None
    inject_and_check(llm, fresh, monkeypatch, llm.model_runner.sampler, "forward", 4, KeyboardInterrupt, "stream")


@pytest.fixture(scope="module")
def tp2(tiny_checkpoint):
    with LLM(tiny_checkpoint, tensor_parallel_size=2, **ENGINE) as llm:
        yield llm


TP_POINTS = {**POINTS, "mid-forward": lambda llm: (llm.model_runner.model.model.layers[1].mlp, "forward")}


@pytest.mark.slow
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize(
    "point, api", [(p, a) for p in TP_POINTS for a in ("generate", "stream") if (p, a) != ("detokenize", "generate")]
)
def test_a_fault_with_tensor_parallelism_leaves_the_llm_usable(tp2, fresh, monkeypatch, point, api, error):
    target, name = TP_POINTS[point](tp2)
    inject_and_check(tp2, fresh, monkeypatch, target, name, 2, error, api)
