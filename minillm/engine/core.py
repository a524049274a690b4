"""EngineCore (vLLM V1's vllm/v1/engine/core.py): the scheduler, the model executor (a ModelRunner, with its
tensor- and pipeline-parallel workers) and the KV cache manager (a BlockManager). It takes requests as token ids
with their sampling parameters, runs steps, and returns each step's new token ids. Nothing in it tokenizes, detokenizes or
matches strings: the front end does that, on its side of the client boundary (core_client.py), so that the core can
run in a process of its own and never waits for that work.

A step that raises is rolled back (its requests are recomputed). A failure of one request's own making must not fail
the others: after a step of several requests fails while it runs, each of them is run alone, once, to its next token;
one that fails alone fails (finish_reason "error"), the others go on. What no request causes (an interrupt, a failure
to schedule, unwritten code) is raised to the caller. Under pipeline parallelism (chapter 15) the core keeps several
batches in flight (`step_with_batch_queue`), and a failed step closes it: its stages cannot be brought back in step.
"""

import time
import weakref
from collections import deque
from itertools import count
from pathlib import Path

from msgspec.structs import replace

from minillm.config import Config, ModelConfig
from minillm.engine.admission import RequestAdmission
from minillm.engine.block_manager import BlockManager
from minillm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minillm.engine.model_runner import ModelRunner
from minillm.engine.parallel_sampling import release_forks
from minillm.engine.pipeline import collect, submit
from minillm.engine.scheduler import Scheduler
from minillm.engine.scheduler_output import SchedulerOutput
from minillm.engine.sequence import Sequence, SequenceStatus
from minillm.engine.worker import describe_failed, join_workers, num_ranks, stop_workers
from minillm.metrics.stats import SchedulerStats
from minillm.spec_decode.metrics import SpecDecodingStats
from minillm.utils.parallel import check_tensor_parallel, deferred_interrupt
from minillm.utils.pipeline import check_pipeline_parallel


class EngineCore(RequestAdmission):
    workers = ()  # tensor- and pipeline-parallel worker processes (none for one process)
    closed: str | None = None  # why the core was closed, once it is
    _stop_workers = None  # the finalizer that stops the workers
    batch_queue: deque | None = None  # pipeline parallelism: the batches in flight, oldest first (else None)

    def __init__(self, config: Config, path: Path, eos_token_ids: list[int]):
        """config: resolved by the front end (max_model_len, dtype); path: the checkpoint directory."""
        self.config, self.path, model_config = config, path, ModelConfig.from_pretrained(path)
        group = pipe = None
        if config.tensor_parallel_size > 1:  # checked before any process starts
            check_tensor_parallel(model_config, config.tensor_parallel_size, config.device, config.enforce_eager)
        if config.pipeline_parallel_size > 1:
            check_pipeline_parallel(model_config, config)
        if num_ranks(config) > 1:
            group, pipe, self.workers = join_workers(config, path)
        try:
            self.model_runner = ModelRunner(config, path, group, pp=pipe)
        except BaseException:
            stop_workers(group, pipe, self.workers)
            raise
        # the workers stop when the core is closed, garbage-collected, or the interpreter exits
        self._stop_workers = weakref.finalize(self, stop_workers, group, pipe, self.workers) if group or pipe else None
        if pipe:  # up to max_concurrent_batches (vLLM's name) in flight: one per stage (1: one at a time, the bubble)
            self.batch_queue, self.max_concurrent_batches, self.batch_ids = deque(), pipe.size, count()
        num_blocks = self.model_runner.num_kvcache_blocks
        self.block_manager = BlockManager(num_blocks, config.kvcache_block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, eos_token_ids)
        self.spec_stats = SpecDecodingStats()
        self.requests: dict[str, Sequence] = {}  # the unfinished ones, by request id
        self.suspects: deque[Sequence] = deque()  # requests of a failed step, each to be run alone once
        self.model_runner.eos_token_ids = tuple(eos_token_ids)
        self.compiling: dict[Sequence, object] = {}  # structured outputs: requests whose grammar compiles (a Future)

    def add_request(self, request: EngineCoreRequest) -> Sequence:
        """Queue a request the front end has checked; its Sequence (an in-process caller may watch it)."""
        seq = Sequence(request.prompt_token_ids, request.sampling_params, request.priority, request.request_id)
        seq.fork_of = request.fork_of
        self.requests[seq.request_id] = seq
        if request.sampling_params.structured_outputs:  # compiled off the step's path; it waits until then
            self.compiling[seq] = self.structured_output.grammar_init(request.sampling_params.structured_outputs)
        else:
            self.admit(seq)
        return seq

    def abort_requests(self, request_ids) -> None:
        """Stop unfinished requests and free their blocks (ids that are not, or no longer, here are ignored)."""
        for request_id in request_ids:
            if (seq := self.requests.pop(request_id, None)) is None:
                continue
            release_forks(self.scheduler, seq)
            parent = self.requests.get(seq.fork_of) if seq.fork_of else None
            if seq in self.compiling or (parent and seq in parent.forks):  # not in the scheduler yet
                self.compiling.pop(seq, None)
                if parent and seq in parent.forks:
                    parent.forks.remove(seq)
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"
            elif seq in self.suspects:  # set aside, holding no blocks
                self.suspects.remove(seq)
                seq.status, seq.finish_reason = SequenceStatus.FINISHED, "abort"
            elif not seq.is_finished:  # (a step that finished it may have been interrupted before it said so)
                self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> EngineCoreOutputs:
        """Run one step (or, after a failed step, one of its requests alone): each request's new tokens, and the
        scheduler's statistics after it. Raises, after rolling back, what no single request caused: an interrupt,
        a lost worker."""
        if self.closed:
            raise RuntimeError(f"this engine is closed ({self.closed}): create a new LLM")
        preemptions, spec = self.scheduler.num_preemptions, self.spec_stats.counts()
        failed = self.admit_compiled()
        ran = self.run_alone(self.suspects.popleft()) if self.suspects else None
        if ran is None and (self.scheduler.waiting or self.scheduler.running or not failed):
            ran = self.run_step(self.scheduler) if self.batch_queue is None else self.step_with_batch_queue()
        outputs, num_tokens = ran or ([], 0)
        outputs = failed + outputs
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
            forked = self.fork_children(seqs, ran.forked)
            updated = set(scheduler.update_from_output(output, ran.sampled_token_ids))
            for seq, n in [(seq, n) for seq, n in zip(seqs, lengths) if seq in updated and seq.grammar]:
                seq.grammar.accept_tokens(seq.token_ids[n:])  # structured outputs: the grammar follows the tokens
            if ran.draft_token_ids is not None:  # speculative decoding (chapter 13): count, and plan the next verify
                appended = [len(seq) - n for seq, n in zip(seqs, lengths)]
                self.spec_stats.observe(seqs, drafted, ran.sampled_token_ids, appended)
                for seq, ids, q in zip(seqs, ran.draft_token_ids, ran.draft_probs or [None] * len(seqs)):
                    if seq.status == SequenceStatus.RUNNING:  # not finished: its next step verifies them
                        ids = seq.grammar.validate_tokens(ids) if seq.grammar else ids  # drafts the grammar allows
                        seq.draft_token_ids, seq.spec_probs = ids, q if q is None else q[: len(ids)]
        except BaseException as e:
            failed = [*scheduler.running, *scheduler.waiting] if output is None else output.scheduled
            scheduler.rollback(failed)
            self.stop_if_lost(e)
            # no request's doing: an interrupt, a scheduler that failed, code not written yet (an exercise's stub)
            if not isinstance(e, Exception) or output is None or isinstance(e, NotImplementedError):
                raise
            return self.isolate(scheduler, [seq for seq in failed if not seq.is_finished], e), 0
        now = time.perf_counter()
        logprobs = ran.logprobs or [None] * len(seqs)
        outputs = [
            self.output(seq, seq.token_ids[n:], now, lp, ran.prompt_logprobs.get(seq))
            for seq, n, lp in zip(seqs, lengths, logprobs)
            if seq in updated
        ]
        outputs += [self.output(child, child.token_ids[-1:], now, lp) for child, lp in forked]
        return outputs, output.total_num_scheduled_tokens

    def step_with_batch_queue(self) -> tuple[list[EngineCoreOutput], int]:
        """Pipeline parallelism (vLLM V1's step_with_batch_queue): while fewer than max_concurrent_batches are in
        flight, plan a batch of the requests not in flight (`batch_share` of them) and submit it without waiting for
        it; otherwise, or when there is nothing to plan, wait for the oldest batch and record its tokens (those of a
        request aborted meanwhile are dropped). So stage 0 runs batch k + 1 while stage 1 runs batch k, instead of
        each stage waiting for the one batch in turn. Ctrl-C waits until the step ends, which keeps the stages in
        step; a failure closes the engine."""
        queue, scheduler, stages = self.batch_queue, self.scheduler, self.config.pipeline_parallel_size
        if not 1 <= self.max_concurrent_batches <= stages:  # more: a stage could wait on a send that waits on it
            raise ValueError(
                f"max_concurrent_batches={self.max_concurrent_batches}: set it from 1 (one batch at a time) to the "
                f"pipeline's {stages} stages"
            )
        with deferred_interrupt():
            try:
                if len(queue) < self.max_concurrent_batches:
                    output = scheduler.schedule(self.batch_share())
                    if output.scheduled:
                        scheduler.in_flight.update(output.scheduled)
                        queue.append((output, submit(self.model_runner, output, next(self.batch_ids))))
                        return [], output.total_num_scheduled_tokens
                assert queue, "the scheduler planned an empty step although requests are unfinished"
                output, step = queue.popleft()
                ran = collect(self.model_runner, step)
                scheduler.in_flight.difference_update(output.scheduled)
                tokens = dict(zip(output.scheduled, ran.sampled_token_ids))
                kept = lambda seqs: [seq for seq in seqs if not seq.is_finished]  # not aborted meanwhile
                done = SchedulerOutput(kept(output.scheduled_new_reqs), kept(output.scheduled_cached_reqs))
                lengths = [len(seq) for seq in done.scheduled]
                updated = set(scheduler.update_from_output(done, [tokens[seq] for seq in done.scheduled]))
            except BaseException as e:  # the batches in flight are lost with the stages' step: back to waiting
                queue.clear()
                scheduler.in_flight.clear()
                scheduler.rollback(list(scheduler.running))
                self.stop_if_lost(e)  # raises: a pipeline cannot go on after a failed step
        now = time.perf_counter()
        outputs = [
            self.output(seq, seq.token_ids[n:], now) for seq, n in zip(done.scheduled, lengths) if seq in updated
        ]
        return outputs, 0

    def batch_share(self) -> int:
        """How many requests the next batch may take, so that the batches in flight share them: those that can run
        (running and not in flight, or waiting) over the places left in the batch queue, rounded up."""
        s = self.scheduler
        ready = sum(seq not in s.in_flight for seq in s.running) + len(s.waiting)
        return max(1, -(-ready // (self.max_concurrent_batches - len(self.batch_queue))))

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

    def output(
        self, seq: Sequence, new_token_ids: list[int], now: float, logprobs=None, prompt=None
    ) -> EngineCoreOutput:
        """What the step did for seq (with its new tokens' and, on its first, its prompt's logprobs, if asked); a
        finished request leaves the core."""
        seq.stamp(now)
        if seq.is_finished:
            self.requests.pop(seq.request_id, None)
            release_forks(self.scheduler, seq)
        first = seq.num_completion_tokens == len(new_token_ids)
        cached = (seq.num_prompt_cached_tokens or 0) if first else 0
        logprobs = logprobs[: len(new_token_ids)] if logprobs else None  # none for tokens dropped after a finish
        return EngineCoreOutput(
            seq.request_id, new_token_ids, seq.finish_reason, cached, new_logprobs=logprobs, prompt_logprobs=prompt
        )

    def stop_if_lost(self, error: BaseException) -> None:
        """After a failed step: if a worker died, a pipeline-parallel step failed (its stages out of step, batches
        lost in flight), or a CUDA step failed half-way (its ranks stuck in a collective), the core cannot go on:
        close it and raise."""
        config = self.config
        if failed := describe_failed(self.workers, config.tensor_parallel_size, config.pipeline_parallel_size):
            self.close(f"worker {failed}")
            raise RuntimeError(
                f"worker {failed} during a step; the engine has stopped its other workers and cannot continue: "
                "create a new LLM"
            ) from error
        if self.model_runner.pp:
            self.close("a pipeline-parallel step failed")
            raise RuntimeError(
                f"a pipeline-parallel step failed ({type(error).__name__}: {error}); its stages cannot be brought back "
                "in step, so the engine has stopped its workers and cannot continue: create a new LLM"
            ) from error
        if self.workers and not self.model_runner.group.renewable:
            self.close("a tensor-parallel step failed on CUDA")
            raise RuntimeError(
                "a tensor-parallel step failed half-way on CUDA, where the ranks waiting in its NCCL collectives "
                "cannot be released to run another step; the engine has stopped its workers and cannot "
                "continue: create a new LLM"
            ) from error

    def close(self, reason: str = "close() was called") -> None:
        """Stop the workers (if any); the core runs no more steps."""
        self.closed = self.closed or reason
        if self.model_runner.structured_output is not None:  # its compile threads
            self.model_runner.structured_output.close()
        if self._stop_workers:
            self._stop_workers()
