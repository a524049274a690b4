"""EngineCore (vLLM V1's vllm/v1/engine/core.py): the scheduler, the model executor (a ModelRunner, with its
tensor-parallel workers) and the KV cache manager (a BlockManager). It takes requests as token ids with their
sampling parameters, runs steps, and returns each step's new token ids. Nothing in it tokenizes, detokenizes or
matches strings: the front end does that, on its side of the client boundary (core_client.py), so that the core can
run in a process of its own and never waits for that work.

A step that raises is rolled back (its requests are recomputed). A failure of one request's own making must not fail
the others: after a step of several requests fails while it runs, each of them is run alone, once, to its next token;
one that fails alone fails (finish_reason "error"), the others go on. What no request causes (an interrupt, a failure
to schedule, unwritten code) is raised to the caller.
"""

import time
import weakref
from collections import deque
from pathlib import Path

from msgspec.structs import replace

from minillm.config import Config, ModelConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minillm.engine.model_runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.engine.worker import describe_failed, join_tensor_parallel, stop_workers
from minillm.metrics.stats import SchedulerStats
from minillm.spec_decode.metrics import SpecDecodingStats
from minillm.utils.parallel import check_tensor_parallel


class EngineCore:
    workers = ()  # tensor-parallel worker processes (none for one process)
    closed: str | None = None  # why the core was closed, once it is
    _stop_workers = None  # the finalizer that stops the workers

    def __init__(self, config: Config, path: Path, eos_token_ids: list[int]):
        """config: resolved by the front end (max_model_len, dtype); path: the checkpoint directory."""
        self.config, model_config = config, ModelConfig.from_pretrained(path)
        group = None
        if config.tensor_parallel_size > 1:  # checked before any process starts
            check_tensor_parallel(model_config, config.tensor_parallel_size, config.device, config.enforce_eager)
            group, self.workers = join_tensor_parallel(config, path)
        try:
            self.model_runner = ModelRunner(config, path, group)
        except BaseException:
            stop_workers(group, self.workers)
            raise
        # the workers stop when the core is closed, garbage-collected, or the interpreter exits
        self._stop_workers = weakref.finalize(self, stop_workers, group, self.workers) if group else None
        num_blocks = self.model_runner.num_kvcache_blocks
        self.block_manager = BlockManager(num_blocks, config.kvcache_block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, eos_token_ids)
        self.spec_stats = SpecDecodingStats()
        self.requests: dict[str, Sequence] = {}  # the unfinished ones, by request id
        self.suspects: deque[Sequence] = deque()  # requests of a failed step, each to be run alone once

    def add_request(self, request: EngineCoreRequest) -> Sequence:
        """Queue a request the front end has checked; its Sequence (an in-process caller may watch it)."""
        seq = Sequence(request.prompt_token_ids, request.sampling_params, request.priority, request.request_id)
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort_requests(self, request_ids) -> None:
        """Stop unfinished requests and free their blocks (ids that are not, or no longer, here are ignored)."""
        for request_id in request_ids:
            if (seq := self.requests.pop(request_id, None)) is None:
                continue
            if seq in self.suspects:  # set aside, holding no blocks
                self.suspects.remove(seq)
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"
            elif not seq.is_finished:  # (a step that finished it may have been interrupted before it said so)
                self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> EngineCoreOutputs:
        """Run one step (or, after a failed step, one of its requests alone): each request's new tokens, and the
        scheduler's statistics after it. Raises, after rolling back, what no single request caused: an interrupt,
        a lost tensor-parallel worker."""
        if self.closed:
            raise RuntimeError(f"this engine is closed ({self.closed}): create a new LLM")
        preemptions, spec = self.scheduler.num_preemptions, self.spec_stats.counts()
        ran = self.run_alone(self.suspects.popleft()) if self.suspects else None
        outputs, num_tokens = ran if ran is not None else self.run_step(self.scheduler)
        spec = tuple(b - a for a, b in zip(spec, self.spec_stats.counts()))
        return EngineCoreOutputs(outputs, self.stats(self.scheduler.num_preemptions - preemptions, spec), num_tokens)

    def stats(self, num_preempted_reqs: int = 0, spec_decode=(0, 0, 0)) -> SchedulerStats:
        """The queues and the KV cache now, with what the last step did that only the core sees."""
        bm = self.block_manager
        waiting = len(self.scheduler.waiting) + len(self.suspects)
        usage = 1 - bm.num_free_blocks / len(bm.blocks)
        return SchedulerStats(len(self.scheduler.running), waiting, usage, num_preempted_reqs, spec_decode)

    def run_step(self, scheduler: Scheduler) -> tuple[list[EngineCoreOutput], int]:
        """Schedule and run one step of `scheduler`; the outputs of the requests it gave tokens or failed."""
        output = None
        try:
            output = scheduler.schedule()
            seqs = output.scheduled
            assert seqs, "the scheduler planned an empty step although requests are unfinished"
            lengths, drafted = [len(seq) for seq in seqs], [len(seq.spec_token_ids) for seq in seqs]
            ran = self.model_runner.run(output)
            updated = set(scheduler.update_from_output(output, ran.sampled_token_ids))
            if ran.draft_token_ids is not None:  # speculative decoding (chapter 13): count, and plan the next verify
                appended = [len(seq) - n for seq, n in zip(seqs, lengths)]
                self.spec_stats.observe(seqs, drafted, ran.sampled_token_ids, appended)
                for seq, ids, q in zip(seqs, ran.draft_token_ids, ran.draft_probs or [None] * len(seqs)):
                    if seq.status == SequenceStatus.RUNNING:  # not finished: its next step verifies them
                        seq.draft_token_ids, seq.spec_probs = ids, q
        except BaseException as e:
            failed = [*scheduler.running, *scheduler.waiting] if output is None else output.scheduled
            scheduler.rollback(failed)
            self.stop_if_lost(e)
            # no request's doing: an interrupt, a scheduler that failed, code not written yet (an exercise's stub)
            if not isinstance(e, Exception) or output is None or isinstance(e, NotImplementedError):
                raise
            return self.isolate(scheduler, [seq for seq in failed if not seq.is_finished], e), 0
        now = time.perf_counter()
        outputs = [self.output(seq, seq.token_ids[n:], now) for seq, n in zip(seqs, lengths) if seq in updated]
        return outputs, output.total_num_scheduled_tokens

    def run_alone(self, seq: Sequence) -> tuple[list[EngineCoreOutput], int] | None:
        """Run a request of a failed step by itself until it gets a token (a prompt may take several chunks), with
        a scheduler of its own over the same cache; then it rejoins the others. If even alone its step fails, it
        fails. None if the cache has no room for it now (it waits, and the others run a step)."""
        alone, outputs, num_tokens = Scheduler(self.config, self.block_manager, self.scheduler.eos_token_ids), [], 0
        alone.add(seq)
        try:
            while not outputs and not seq.is_finished:
                if not alone.running and not alone.can_admit(seq):
                    return None
                outputs, n = self.run_step(alone)
                num_tokens += n
            return outputs, num_tokens
        finally:  # a token, or an interrupt: back with the others, running or to be run alone again
            if seq in alone.running:
                self.scheduler.running.append(seq)
            elif seq in alone.waiting:
                alone.waiting.remove(seq)
                self.suspects.appendleft(seq)

    def isolate(self, scheduler: Scheduler, seqs: list[Sequence], error: Exception) -> list[EngineCoreOutput]:
        """After a failed step (rolled back, its requests back in `scheduler.waiting`): a request that failed alone
        fails; a step of several puts each of them aside, to be run alone (`run_alone`)."""
        for seq in seqs:
            scheduler.waiting.remove(seq)
        if len(seqs) > 1:
            self.suspects.extend(seqs)
            return []
        for seq in seqs:
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, "error"
        now = time.perf_counter()
        return [replace(self.output(seq, [], now), error=f"{type(error).__name__}: {error}") for seq in seqs]

    def output(self, seq: Sequence, new_token_ids: list[int], now: float) -> EngineCoreOutput:
        """What the step did for seq; a finished request leaves the core."""
        seq.stamp(now)
        if seq.is_finished:
            self.requests.pop(seq.request_id, None)
        first = seq.num_completion_tokens == len(new_token_ids)
        cached = (seq.num_prompt_cached_tokens or 0) if first else 0
        return EngineCoreOutput(seq.request_id, new_token_ids, seq.finish_reason, cached)

    def stop_if_lost(self, error: BaseException) -> None:
        """After a failed step: if a tensor-parallel worker died, or a CUDA step failed half-way (its ranks stuck
        in a collective), the core cannot go on: close it and raise."""
        if failed := describe_failed(self.workers):
            self.close(f"tensor-parallel worker {failed}")
            raise RuntimeError(
                f"tensor-parallel worker {failed} during a step; the engine has stopped its other workers and "
                "cannot continue: create a new LLM"
            ) from error
        if self.workers and not self.model_runner.group.renewable:
            self.close("a tensor-parallel step failed on CUDA")
            raise RuntimeError(
                "a tensor-parallel step failed half-way on CUDA, where the ranks waiting in its NCCL collectives "
                "cannot be released to run another step; the engine has stopped its workers and cannot "
                "continue: create a new LLM"
            ) from error

    def close(self, reason: str = "close() was called") -> None:
        """Stop the tensor-parallel workers (if any); the core runs no more steps."""
        self.closed = self.closed or reason
        if self._stop_workers:
            self._stop_workers()
