"""LLMEngine: add requests, step the scheduler and the model runner, hand back text as it is produced."""

import json
import time
import weakref
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

from tqdm.auto import tqdm

from minillm.config import Config, ModelConfig, default_model_path, resolve_dtype
from minillm.engine.block_manager import BlockManager
from minillm.engine.model_runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.worker import describe_failed, join_tensor_parallel, stop_workers
from minillm.sampling_params import SamplingParams
from minillm.spec_decode import make_proposer
from minillm.spec_decode.metrics import SpecDecodingStats
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer
from minillm.utils.loader import resolve_model_path
from minillm.utils.parallel import check_tensor_parallel


@dataclass
class RequestOutput:
    """One finished request: its text and tokens, why it stopped, how many prompt tokens came from the
    prefix cache, and when (time.perf_counter seconds); with speculative decoding, how many draft tokens were
    verified for it and how many of them kept."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int
    arrival_time: float
    first_token_time: float
    finish_time: float
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class StreamOutput:
    """New text of request `index` (its position in the prompts list); `finished` on its last piece."""

    index: int
    text: str
    token_id: int
    finished: bool


class LLMEngine:
    workers = ()  # tensor-parallel worker processes (none for one process)
    closed: str | None = None  # why the engine was closed, once it is
    _stop_workers = None  # the finalizer that stops the workers

    def __init__(self, model=None, **kwargs):
        names = {f.name for f in fields(Config)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown engine option(s) {sorted(unknown)}; the options are {sorted(names)}")
        if str(model).endswith(".gguf") and "quantization" not in kwargs:
            kwargs["quantization"] = "gguf"  # a GGUF file runs as it is stored, as in vLLM
        self.config = config = Config(model=model, **kwargs)
        path = resolve_model_path(model if model is not None else default_model_path())
        model_config = ModelConfig.from_pretrained(path)
        max_len = model_config.max_position_embeddings
        if config.max_model_len is None:
            config.max_model_len = max_len
        elif config.max_model_len > max_len:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's "
                f"max_position_embeddings={max_len}; use max_model_len <= {max_len}."
            )
        config.dtype = resolve_dtype(config.dtype, config.device, model_config.dtype)
        if not config.skip_tokenizer_init and not (path / "tokenizer.json").exists():
            raise FileNotFoundError(
                f"{path} has no tokenizer.json: add the checkpoint's tokenizer files, or pass "
                "skip_tokenizer_init=True to run on token ids alone (outputs then have no text)"
            )
        self.tokenizer = None if config.skip_tokenizer_init else Tokenizer(path)
        group = None
        if config.tensor_parallel_size > 1:  # checked before any process starts
            check_tensor_parallel(model_config, config.tensor_parallel_size, config.device, config.enforce_eager)
            group, self.workers = join_tensor_parallel(config, path)
        try:
            self.model_runner = ModelRunner(config, path, group)
        except BaseException:
            stop_workers(group, self.workers)
            raise
        # the workers stop when the engine is closed, garbage-collected, or the interpreter exits
        self._stop_workers = weakref.finalize(self, stop_workers, group, self.workers) if group else None
        self.vocab_size = model_config.vocab_size
        self.block_manager = BlockManager(
            self.model_runner.num_kvcache_blocks, config.kvcache_block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.block_manager, eos_token_ids(path, model_config, self.tokenizer))
        self.failed_seqs: list[Sequence] = []  # the sequences of the last step that raised, rolled back
        # drafts to verify (chapter 13), or None
        self.proposer = make_proposer(config, self.vocab_size, self.model_runner.num_kvcache_blocks)
        self.spec_stats = SpecDecodingStats()

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams, priority: int = 0) -> Sequence:
        """Tokenize and check a request, then queue it. Raises ValueError naming the problem and the fix."""
        if isinstance(prompt, str) and self.tokenizer is None:
            raise ValueError("this engine has no tokenizer (skip_tokenizer_init=True): give prompts as token id lists")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids or prompt == "":  # "" may encode to a lone BOS: say so rather than generate from nothing
            raise ValueError(
                "the prompt is empty: give at least one token (a non-empty string or id list; to "
                "generate from nothing, the id list of the BOS token)"
            )
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.vocab_size)]
        if bad:
            raise ValueError(f"unknown token ids {bad[:5]}: ids must be integers in [0, {self.vocab_size})")
        total = len(ids) + sampling_params.max_tokens
        if total > self.config.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({sampling_params.max_tokens}) = {total} "
                f"exceeds max_model_len={self.config.max_model_len}: shorten the prompt or lower "
                "max_tokens"
            )
        need, have = self.block_manager.num_blocks(total), len(self.block_manager.blocks)
        if need > have:
            raise ValueError(
                f"the KV cache ({have} blocks of {self.config.kvcache_block_size} tokens) cannot hold "
                f"one request of {total} tokens ({need} blocks): raise num_kvcache_blocks or "
                "kvcache_memory_bytes, or lower max_tokens"
            )
        seq = Sequence(ids, sampling_params, priority)
        self.scheduler.add(seq)
        return seq

    def abort_request(self, seq: Sequence) -> None:
        """Stop an unfinished request (as returned by add_request) and free its blocks."""
        if not seq.is_finished:
            self.scheduler.abort(seq)
            if self.proposer:
                self.proposer.release([seq])

    def step(self) -> tuple[list[Sequence], int]:
        """Schedule and run one step. Returns the sequences that got a token, and the tokens computed.
        A step that raises (an error, Ctrl-C) is rolled back: its sequences will be recomputed; if scheduling
        itself failed half-way, every queued sequence is."""
        if self.closed:
            raise RuntimeError(f"this engine is closed ({self.closed}): create a new LLM")
        seqs = None
        try:
            if self.proposer:  # guess the tokens after each decoding sequence's newest
                self.proposer.propose([seq for seq in self.scheduler.running if seq.is_decoding])
            output = self.scheduler.schedule()
            seqs = output.scheduled
            assert seqs, "the scheduler planned an empty step although requests are unfinished"
            sampled = self.model_runner.run(output)
            now = time.perf_counter()
            if self.proposer:
                self.spec_stats.observe(seqs, sampled)
            updated = self.scheduler.update_from_output(output, sampled)
            if self.proposer:
                self.proposer.release([seq for seq in updated if seq.is_finished])
        except BaseException as e:
            self.failed_seqs = [*self.scheduler.running, *self.scheduler.waiting] if seqs is None else seqs
            self.scheduler.rollback(self.failed_seqs)
            if failed := describe_failed(self.workers):
                self.close(f"tensor-parallel worker {failed}")
                raise RuntimeError(
                    f"tensor-parallel worker {failed} during a step; the engine has stopped its "
                    "other workers and cannot continue: create a new LLM"
                ) from e
            if self.workers and not self.model_runner.group.renewable:
                self.close("a tensor-parallel step failed on CUDA")
                raise RuntimeError(
                    "a tensor-parallel step failed half-way on CUDA, where the ranks waiting in its NCCL "
                    "collectives cannot be released to run another step; the engine has stopped its "
                    "workers and cannot continue: create a new LLM"
                ) from e
            raise
        record_token_times(updated, now)
        return updated, output.total_num_scheduled_tokens

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

    def close(self, reason: str = "close() was called") -> None:
        """Stop the tensor-parallel workers (if any); the engine runs no more steps. Also on `with LLM(...)` exit."""
        self.closed = self.closed or reason
        if self._stop_workers:
            self._stop_workers()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _add_all(self, prompts, sampling_params, priorities) -> list[Sequence]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if len({isinstance(p, str) for p in prompts}) > 1:
            raise ValueError("the prompts mix strings and token id lists: give all as strings or all as id lists")
        sps = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params or SamplingParams()] * len(prompts)
        )
        prios = priorities if priorities is not None else [0] * len(prompts)
        if not (len(sps) == len(prios) == len(prompts)):
            raise ValueError(
                f"{len(prompts)} prompts but {len(sps)} sampling params and {len(prios)} priorities: "
                "give one per prompt, or a single SamplingParams for all"
            )
        seqs = []
        try:
            for prompt, sp, prio in zip(prompts, sps, prios):
                seqs.append(self.add_request(prompt, sp, prio))
        except ValueError as e:  # reject the whole call before any work starts
            for seq in seqs:
                self.scheduler.waiting.remove(seq)
            raise ValueError(f"prompt {len(seqs)}: {e}") from None
        return seqs

    def stream(self, prompts, sampling_params=None, priorities=None) -> Iterator[StreamOutput]:
        """Yield each request's text as it is produced (incrementally detokenized). Closing the stream early
        (break, an exception, Ctrl-C) aborts its unfinished requests."""
        seqs = self._add_all(prompts, sampling_params, priorities)
        index = {seq.seq_id: i for i, seq in enumerate(seqs)}
        sent = dict.fromkeys(index, 0)  # completion tokens yielded, per request
        detoks = {
            seq.seq_id: IncrementalDetokenizer(self.tokenizer, seq.token_ids)
            for seq in seqs
            if self.tokenizer is not None
        }
        try:
            while not self.is_finished():
                for seq in self.step()[0]:  # a token, or several where a step kept drafts (chapter 13)
                    new = seq.completion_token_ids[sent[seq.seq_id] :]
                    sent[seq.seq_id] += len(new)
                    for i, token in enumerate(new):
                        text = detoks[seq.seq_id].add(token) if detoks else ""
                        yield StreamOutput(index[seq.seq_id], text, token, seq.is_finished and i == len(new) - 1)
        finally:
            for seq in seqs:
                self.abort_request(seq)

    def generate(self, prompts, sampling_params=None, priorities=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion; one output per prompt, in order. On an
        exception or Ctrl-C its unfinished requests are aborted, so the engine stays usable."""
        seqs = self._add_all(prompts, sampling_params, priorities)
        try:
            with tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm, dynamic_ncols=True) as bar:
                while not self.is_finished():
                    start = time.perf_counter()
                    updated, num_tokens = self.step()
                    bar.update(sum(seq.is_finished for seq in updated))
                    bar.set_postfix(tok_s=f"{num_tokens / (time.perf_counter() - start):.0f}", refresh=False)
        finally:
            for seq in seqs:
                self.abort_request(seq)
        decode = self.tokenizer.decode if self.tokenizer is not None else lambda ids: ""
        return [
            RequestOutput(
                seq.token_ids[: seq.num_prompt_tokens],
                seq.completion_token_ids,
                decode(seq.completion_token_ids),
                seq.finish_reason,
                seq.num_prompt_cached_tokens,
                seq.arrival_time,
                seq.first_token_time,
                seq.finish_time,
                seq.num_draft_tokens,
                seq.num_accepted_tokens,
            )
            for seq in seqs
        ]


def record_token_times(seqs: list[Sequence], now: float) -> None:
    """Stamp the sequences that got a token at `now`: the time of each one's first token, and of its last."""
    for seq in seqs:
        seq.first_token_time = seq.first_token_time or now
        if seq.is_finished:
            seq.finish_time = now


def eos_token_ids(path: Path, model_config: ModelConfig, tokenizer: Tokenizer | None) -> list[int]:
    """The tokens that end a request: those of config.json, generation_config.json and the tokenizer."""
    ids = set(model_config.eos_token_id)
    gen_file = path / "generation_config.json"
    if gen_file.exists():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        ids |= {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)
