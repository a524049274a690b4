"""Property-based tests (hypothesis) of the BlockManager and Scheduler under random workloads: requests arriving
over time, prompts sharing prefixes (prefix caching on and off), both scheduling policies, aborts, KV budgets so
small that requests are preempted, chunked prefill (token budgets down to one token), and failed steps.

Properties, checked after every step and every abort (`check_books`):
- no ref count is negative; a block is free or used, never both; free + used = total;
- each used block's ref count is the number of queued sequences holding it, and every block held is used;
- a finished or aborted request holds no block; an abort frees, at once, every block only it held;
- every hash in the prefix cache names a block that carries it;
and at the end: every request finished with the tokens it would get alone (greedy), nothing is queued, and
every block is free.

Two engines run the workloads: a simulated one (the real LLMEngine, Scheduler and BlockManager around a stand-in
model runner whose KV cache records what each slot should hold and checks every read, so a block handed out
with the wrong contents fails), fast enough for many examples; and a real one on a tiny random checkpoint,
compared token by token with `generate_cached` on each prompt alone. Deliberately broken block managers (test
doubles) must be caught by the same checks.
"""

from collections import Counter, deque
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.config import Config
from minillm.engine.block_manager import BlockManager
from minillm.engine.core import EngineCore
from minillm.engine.exceptions import EngineError
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.processor import Processor
from minillm.engine.scheduler import Scheduler
from minillm.engine.scheduler_output import ModelRunnerOutput
from minillm.engine.sequence import SequenceStatus
from minillm.naive import generate_cached
from minillm.spec_decode.metrics import SpecDecodingStats

BS = 4  # tokens per KV block, most often
SIM_VOCAB, SIM_EOS = 64, 0
REAL_VOCAB = 256  # the tiny checkpoint's byte vocabulary
MAX_TOKENS = 10
MAX_STEPS = 3000  # a workload still running after this many steps is stuck
NGRAM = {"method": "ngram", "prompt_lookup_max": 2, "prompt_lookup_min": 1}


class InjectedFault(Exception):
    """A step made to fail on purpose."""


# --- the checks ----------------------------------------------------------------------------------------------


def check_books(engine: LLMEngine, requests: list) -> None:
    """AssertionError unless the engine's block books balance; `requests` are all the Sequences it was given."""
    bm, s = engine.block_manager, engine.scheduler
    total = len(bm.blocks)
    negative = [b.block_id for b in bm.blocks if b.ref_count < 0]
    assert not negative, f"negative ref counts on blocks {negative}"
    free = list(bm.free_block_ids)
    assert len(free) == len(set(free)) == bm.num_free_blocks, "the free list holds a block twice"
    assert set(free).isdisjoint(bm.used_block_ids), f"blocks both free and used: {set(free) & bm.used_block_ids}"
    assert bm.num_free_blocks + len(bm.used_block_ids) == total, (
        f"free ({bm.num_free_blocks}) + used ({len(bm.used_block_ids)}) != total ({total})"
    )
    queued = list(s.waiting) + list(s.running)
    assert len({id(seq) for seq in queued}) == len(queued), "a sequence is queued twice"
    holders = Counter(b for seq in queued for b in seq.block_table)
    refs = {b: bm.blocks[b].ref_count for b in bm.used_block_ids}
    assert refs == dict(holders), (
        f"ref counts {refs} differ from the queued sequences holding each block {dict(holders)}"
    )
    assert all(bm.blocks[b].ref_count == 0 for b in free), "a free block has a reference"
    for h, b in bm.hash_to_block_id.items():
        assert bm.blocks[b].hash == h, f"the prefix cache names block {b} for a hash it does not carry"
    assert all(seq.status == SequenceStatus.RUNNING for seq in s.running)
    assert all(seq.status == SequenceStatus.WAITING for seq in s.waiting)
    assert len(s.running) <= s.max_num_seqs
    assert not any(seq.block_table for seq in s.waiting), "a waiting sequence holds blocks"
    for seq in s.running:
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens, "a running sequence lacks blocks"
        assert len(seq.block_table) <= bm.num_blocks(len(seq)), (
            "a running sequence holds blocks past its tokens (drafts)"
        )
    ids = {id(seq) for seq in queued}
    for seq in requests:
        if seq.is_finished:
            assert not seq.block_table, f"finished request {seq.seq_id} ({seq.finish_reason}) still holds blocks"
            assert id(seq) not in ids, f"finished request {seq.seq_id} is still queued"


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    arrival: int  # the step before which it is added
    priority: int
    abort_after: int | None  # abort it this many steps after its arrival (if it has not finished)
    stop_at: int | None  # make the token it would produce at this index (mod length) a stop token


@dataclass
class Workload:
    requests: list[Request]
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str
    prefix_caching: bool
    block_size: int
    chunk_cap: int  # long_prefill_token_threshold (0: none)
    mixed_steps: bool
    new_token_ratio: float
    faults: frozenset  # model-runner calls (1-based) that fail
    speculate: int  # draft tokens per step (speculative decoding, chapter 13); 0: none


def cut(tokens: list[int], stop: set[int]) -> list[int]:
    """Tokens up to and including the first stop token."""
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[: i + 1]
    return tokens


def run_workload(engine: LLMEngine, w: Workload, alone) -> None:
    """Feed w's requests in at their arrival steps, abort those that say so, step until everything is done,
    checking the books after every step and abort; then compare each request with `alone(prompt, n)`, the n
    greedy tokens its prompt gets alone."""
    bm, eos = engine.block_manager, engine.scheduler.eos_token_ids
    seqs, expected = {}, {}
    params = []
    for r in w.requests:
        full = alone(r.prompt, r.max_tokens)
        stop = () if r.stop_at is None else (full[r.stop_at % len(full)],)
        params.append(SamplingParams(temperature=0, max_tokens=r.max_tokens, stop_token_ids=stop))
        expected_tokens = cut(full, eos | set(stop))
        reason = "stop" if expected_tokens[-1] in eos | set(stop) else "length"
        expected[len(params) - 1] = (expected_tokens, reason)
    step = 0
    while len(seqs) < len(w.requests) or not engine.is_finished():
        for i, r in enumerate(w.requests):
            if r.arrival == step:
                seqs[i] = engine.add_request(r.prompt, params[i], r.priority)
        for i, r in enumerate(w.requests):
            if r.abort_after is not None and r.arrival + r.abort_after == step and not seqs[i].is_finished:
                seq = seqs[i]
                own = sum(bm.blocks[b].ref_count == 1 for b in seq.block_table)
                before = bm.num_free_blocks
                engine.abort_request(seq)
                assert seq.finish_reason == "abort" and not seq.block_table, f"aborted request {i} still holds blocks"
                assert bm.num_free_blocks == before + own, (
                    f"aborting request {i} freed {bm.num_free_blocks - before} blocks, it alone held {own}"
                )
                check_books(engine, list(seqs.values()))
        if not engine.is_finished():
            try:
                engine.step()
            except EngineError as e:  # a request whose step failed with it alone
                assert "InjectedFault" in str(e), e
            check_books(engine, list(seqs.values()))
        step += 1
        assert step < MAX_STEPS, (
            f"still running after {MAX_STEPS} steps: {len(engine.scheduler.waiting)} waiting, "
            f"{len(engine.scheduler.running)} running"
        )
    assert bm.num_free_blocks == len(bm.blocks) and not bm.used_block_ids, "blocks leaked at the end"
    for i, seq in seqs.items():
        tokens, reason = expected[i]
        if seq.finish_reason in ("abort", "error"):
            assert tokens[: seq.num_completion_tokens] == seq.completion_token_ids, (
                f"{seq.finish_reason} {i} went astray"
            )
        else:
            assert (seq.completion_token_ids, seq.finish_reason) == (tokens, reason), (
                f"request {i} (prompt {w.requests[i].prompt}) got {seq.completion_token_ids} ({seq.finish_reason}), "
                f"alone it gets {tokens} ({reason})"
            )


# --- workloads -----------------------------------------------------------------------------------------------


@st.composite
def workloads(draw, vocab: int, max_requests: int, budgets, max_faults: int) -> Workload:
    token = st.integers(1, vocab - 1)
    prefixes = draw(
        st.lists(st.lists(token, max_size=14) | st.lists(token, min_size=8, max_size=16), min_size=1, max_size=3)
    )  # shared prompt starts
    requests = []
    for _ in range(draw(st.integers(1, max_requests) | st.integers(max_requests // 2, max_requests))):
        prompt = draw(st.sampled_from(prefixes)) + draw(st.lists(token, max_size=10))
        requests.append(
            Request(
                prompt=prompt or [draw(token)],
                max_tokens=draw(st.integers(1, MAX_TOKENS)),
                arrival=draw(st.integers(0, 2) | st.integers(0, 10)),
                priority=draw(st.integers(0, 2)),
                abort_after=draw(st.none() | st.none() | st.integers(0, 12)),
                stop_at=draw(st.none() | st.integers(0, MAX_TOKENS - 1)),
            )
        )
    block_size = draw(st.sampled_from([BS, BS, 1, 2, 8]))
    need = max(-(-(len(r.prompt) + r.max_tokens) // block_size) for r in requests)  # the largest request, in blocks
    return Workload(
        requests=requests,
        num_blocks=draw(st.integers(need, need + 6) | st.integers(need, need + 16) | st.just(256)),  # mostly tight
        max_num_seqs=draw(st.integers(1, 4)),
        max_num_batched_tokens=draw(st.sampled_from(budgets)),  # small: chunked prefill
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        prefix_caching=draw(st.booleans() | st.just(True)),
        block_size=block_size,
        chunk_cap=draw(st.sampled_from([0, 0, 1, 3, 8])),
        mixed_steps=draw(st.booleans() | st.just(True)),
        new_token_ratio=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
        faults=frozenset(draw(st.sets(st.integers(1, 40), max_size=max_faults))),
        speculate=draw(st.sampled_from([0, 0, 1, 3])),
    )


# --- the simulated engine ------------------------------------------------------------------------------------


def next_token(ids: list[int]) -> int:
    """The simulated model: the next token is a fixed function of the whole sequence (0 is EOS)."""
    return (31 * ids[-1] + 17 * len(ids) + 7 * ids[0] + 3 * sum(ids)) % SIM_VOCAB


def sim_alone(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(next_token(ids))
    return ids[len(prompt) :]


class FakeRunner:
    """Stands in for ModelRunner. Its KV cache holds in each slot what a real one would hold there (the tokens up
    to that position: keys and values depend on all of them), written where the real runner writes (a prefill
    skips positions found in the prefix cache), and every step checks that each sequence reads, at every
    position it attends to, its own tokens. A failing step (`faults`) writes garbage to its slots first, as a
    forward pass that dies part-way may."""

    pp = None  # one process: no pipeline stages
    structured_output = None  # no grammars

    def __init__(self, block_size: int, faults=frozenset(), speculate: int = 0):
        self.kv, self.block_size, self.faults, self.calls = {}, block_size, faults, 0
        self.speculate = speculate  # drafts per step (SimProposer's), 0 for none

    def slot(self, seq, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def run(self, output):
        self.calls += 1
        seqs, is_prefill = output.scheduled, output.is_prefill
        writes, ends = {}, []
        for seq in seqs:
            ids = seq.token_ids + seq.spec_token_ids  # a step verifying drafts computes them too
            if is_prefill:
                start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_scheduled_tokens
                positions = [p for p in range(start, end) if p >= seq.num_cached_tokens]
            else:  # the newest token, and the drafts after it
                assert seq.num_computed_tokens == len(seq) - 1 and seq.num_scheduled_tokens == 1 + len(
                    seq.spec_token_ids
                )
                end = len(seq) + len(seq.spec_token_ids)
                positions = list(range(len(seq) - 1, end))
            for p in positions:
                writes[self.slot(seq, p)] = tuple(ids[: p + 1])
            ends.append(end)
        if self.calls in self.faults:
            self.kv.update(dict.fromkeys(writes, "garbage"))
            raise InjectedFault(f"step {self.calls}")
        self.kv.update(writes)
        for seq, end in zip(seqs, ends):
            ids = seq.token_ids + seq.spec_token_ids
            for p in range(end):
                assert self.kv.get(self.slot(seq, p)) == tuple(ids[: p + 1]), (
                    f"sequence {seq.seq_id} reads wrong keys/values at position {p} "
                    f"(block {seq.block_table[p // self.block_size]})"
                )
        sampled = [self.sample(seq) if seq.samples_this_step else [] for seq in seqs]
        if not self.speculate:
            return ModelRunnerOutput(sampled)
        return ModelRunnerOutput(
            sampled, [sim_drafts(seq, new, self.speculate) if new else [] for seq, new in zip(seqs, sampled)]
        )

    @staticmethod
    def sample(seq) -> list[int]:
        """The simulated model's tokens after seq: its drafts the model agrees with, then its own."""
        ids, n = seq.token_ids + seq.spec_token_ids, 0
        while n < len(seq.spec_token_ids) and seq.spec_token_ids[n] == next_token(ids[: len(seq) + n]):
            n += 1
        return seq.spec_token_ids[:n] + [next_token(ids[: len(seq) + n])]


def sim_drafts(seq, new: list[int], k: int) -> list[int]:
    """Drafts for the simulated model after seq's new tokens: its own next tokens, except at every third position
    one off (rejected); at most what max_tokens leaves after the token the next step samples anyway."""
    ids = seq.token_ids + new
    for _ in range(min(k, seq.remaining_tokens - len(new) - 1)):
        ids.append((next_token(ids) + (len(ids) % 3 == 0)) % SIM_VOCAB)
    return ids[len(seq) + len(new) :]


def sim_engine(w: Workload, manager=BlockManager) -> LLMEngine:
    """The real LLMEngine (add_request, step with its rollback, abort_request), Scheduler and BlockManager, with a
    FakeRunner for the model."""
    config = Config(
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        max_model_len=1024,
        kvcache_block_size=w.block_size,
        num_kvcache_blocks=w.num_blocks,
        enable_prefix_caching=w.prefix_caching,
        scheduling_policy=w.policy,
        long_prefill_token_threshold=w.chunk_cap,
        mixed_steps=w.mixed_steps,
        new_token_ratio=w.new_token_ratio,
    )
    core = EngineCore.__new__(EngineCore)
    core.config, core.requests, core.suspects, core.compiling = config, {}, deque(), {}
    core.model_runner = FakeRunner(w.block_size, w.faults, w.speculate)
    core.block_manager = manager(w.num_blocks, w.block_size, w.prefix_caching)
    core.scheduler = Scheduler(config, core.block_manager, eos_token_ids=[SIM_EOS])
    core.spec_stats = SpecDecodingStats()
    engine = LLMEngine.__new__(LLMEngine)
    engine.config, engine.tokenizer, engine.vocab_size, engine.engine_core = config, None, SIM_VOCAB, core
    engine.processor = Processor(config, Path("."), SimpleNamespace(vocab_size=SIM_VOCAB), None)
    engine.seqs, engine.request_ids, engine.logprobs = {}, count(), {}
    return engine


SIM_WORKLOADS = workloads(SIM_VOCAB, max_requests=8, budgets=[1, 3, 8, 16, 512], max_faults=3)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(SIM_WORKLOADS)
def test_simulated_engine_keeps_its_books_and_gives_each_request_its_own_tokens(w):
    run_workload(sim_engine(w), w, sim_alone)


# --- the real engine on a tiny checkpoint --------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_alone(tiny_checkpoint):
    """alone(prompt, n): the n greedy tokens of prompt on its own (generate_cached, a contiguous cache), memoized."""
    model, memo = LLM(tiny_checkpoint, num_kvcache_blocks=1).model_runner.model, {}

    def alone(prompt, n):
        key = tuple(prompt)
        if key not in memo:
            memo[key] = list(generate_cached(model, prompt, MAX_TOKENS))
        return memo[key][:n]

    return alone


def real_engine(path, w: Workload, manager=None) -> LLM:
    llm = LLM(
        path,
        kvcache_block_size=w.block_size,
        num_kvcache_blocks=w.num_blocks,
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        scheduling_policy=w.policy,
        enable_prefix_caching=w.prefix_caching,
        long_prefill_token_threshold=w.chunk_cap,
        mixed_steps=w.mixed_steps,
        new_token_ratio=w.new_token_ratio,
        speculative_config=dict(NGRAM, num_speculative_tokens=w.speculate) if w.speculate else None,
    )
    if manager is not None:
        llm.engine_core.block_manager = llm.scheduler.block_manager = manager(
            w.num_blocks, w.block_size, w.prefix_caching
        )
    run, calls = llm.model_runner.run, [0]

    def run_or_fail(output):  # a failing step here ran the whole model (its KV written) first
        calls[0] += 1
        tokens = run(output)
        if calls[0] in w.faults:
            raise InjectedFault(f"step {calls[0]}")
        return tokens

    llm.model_runner.run = run_or_fail
    return llm


REAL_WORKLOADS = workloads(REAL_VOCAB, max_requests=6, budgets=[2, 5, 16, 512], max_faults=1)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(w=REAL_WORKLOADS)
def test_real_engine_keeps_its_books_and_gives_each_request_its_greedy_tokens_alone(tiny_checkpoint, real_alone, w):
    run_workload(real_engine(tiny_checkpoint, w), w, real_alone)


# --- broken allocators must be caught ------------------------------------------------------------------------


class LeakyBlockManager(BlockManager):
    """Broken on purpose: deallocate forgets a sequence's first block (its reference is never dropped)."""

    def deallocate(self, seq):
        seq.block_table = seq.block_table[1:]
        super().deallocate(seq)


class UndercountingBlockManager(BlockManager):
    """Broken on purpose: a prefix-cache hit on a block in use does not count its new holder."""

    def allocate(self, seq):
        super().allocate(seq)
        for b in seq.block_table[: seq.num_cached_tokens // self.block_size]:
            if self.blocks[b].ref_count > 1:
                self.blocks[b].ref_count -= 1


class UnrolledScheduler(Scheduler):
    """Broken on purpose: after a step that verified drafts, the rejected ones stay counted as computed."""

    def drop_rejected_drafts(self, seq, num_accepted):
        computed = seq.num_computed_tokens
        super().drop_rejected_drafts(seq, num_accepted)
        seq.num_computed_tokens = computed


def expect_caught(prop) -> str:
    """Run a hypothesis property expected to fail; return the AssertionError's message."""
    with pytest.raises(AssertionError) as caught:
        prop()
    return str(caught.value)


FIND_FAST = dict(deadline=None, derandomize=True, database=None, phases=[Phase.generate])  # no shrinking


@pytest.mark.parametrize("manager", [LeakyBlockManager, UndercountingBlockManager])
def test_the_checks_catch_a_broken_block_manager_in_the_simulated_engine(manager):
    @settings(max_examples=250, **FIND_FAST)
    @given(SIM_WORKLOADS)
    def prop(w):
        run_workload(sim_engine(w, manager), w, sim_alone)

    message = expect_caught(prop)
    assert "ref counts" in message or "holds blocks" in message or "leaked" in message, message


@pytest.mark.parametrize("manager", [LeakyBlockManager, UndercountingBlockManager])
def test_the_checks_catch_a_broken_block_manager_in_the_real_engine(tiny_checkpoint, real_alone, manager):
    @settings(max_examples=40, **FIND_FAST)
    @given(REAL_WORKLOADS)
    def prop(w):
        run_workload(real_engine(tiny_checkpoint, w, manager), w, real_alone)

    message = expect_caught(prop)
    assert "ref counts" in message or "holds blocks" in message or "leaked" in message, message


def test_the_checks_catch_drafts_that_are_not_rolled_back():
    @settings(max_examples=250, **FIND_FAST)
    @given(SIM_WORKLOADS)
    def prop(w):
        engine = sim_engine(w)
        engine.scheduler.__class__ = UnrolledScheduler
        run_workload(engine, w, sim_alone)

    message = expect_caught(prop)
    assert "reads wrong keys/values" in message or "num_computed_tokens" in message, message
