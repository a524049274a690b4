"""LLMEngine: the offline front end (vLLM's vllm/v1/engine/llm_engine.py). It checks and tokenizes requests (the
Processor), hands them to an engine core in this process (EngineCore: the scheduler, the model runner, the KV
cache), steps it, and turns its new token ids into text. In one process, the core's pieces can be watched and
driven by hand: `llm.scheduler`, `llm.block_manager`, `llm.model_runner`."""

import json
import time
from dataclasses import dataclass, field, fields
from itertools import count
from pathlib import Path
from typing import Iterator

from tqdm.auto import tqdm

from minillm.config import Config, ModelConfig, default_model_path, resolve_dtype
from minillm.engine.core import EngineCore
from minillm.engine.exceptions import EngineError
from minillm.engine.messages import EngineCoreRequest
from minillm.engine.output_processor import decode_logprobs
from minillm.engine.parallel_sampling import child_requests, split_request_id
from minillm.engine.processor import Processor
from minillm.engine.sequence import Sequence
from minillm.logprobs import PromptLogprobs, SampleLogprobs
from minillm.sampling_params import SamplingParams
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer
from minillm.utils.loader import resolve_model_path


@dataclass
class CompletionOutput:
    """One answer to a request (vLLM's name): n > 1 gives n of them (chapter 16); logprobs, if asked, one
    {token id: Logprob} per token, the chosen token first."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: SampleLogprobs | None = None


@dataclass
class RequestOutput:
    """One finished request: its text and tokens, why it stopped, how many prompt tokens came from the
    prefix cache, and when (time.perf_counter seconds); with speculative decoding, how many draft tokens were
    verified for it and how many of them kept. `outputs` holds each of its n answers (chapter 16); the fields
    text, token_ids, finish_reason and logprobs are the first's."""

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
    outputs: list[CompletionOutput] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None  # per prompt token (None for the first), if asked


@dataclass
class StreamOutput:
    """New text of request `index` (its position in the prompts list); `finished` on its last piece."""

    index: int
    text: str
    token_id: int
    finished: bool


def engine_config(model=None, **kwargs) -> tuple[Config, Path, ModelConfig]:
    """The engine's settings from LLM(...)'s keywords, resolved against the checkpoint (max_model_len, dtype):
    what the front end and the engine core both work from (vLLM's EngineArgs.create_engine_config)."""
    names = {f.name for f in fields(Config)}
    unknown = set(kwargs) - names
    if unknown:
        raise TypeError(f"unknown engine option(s) {sorted(unknown)}; the options are {sorted(names)}")
    if str(model).endswith(".gguf") and "quantization" not in kwargs:
        kwargs["quantization"] = "gguf"  # a GGUF file runs as it is stored, as in vLLM
    config = Config(model=model, **kwargs)
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
    return config, path, model_config


class LLMEngine:
    def __init__(self, model=None, **kwargs):
        self.config, path, model_config = engine_config(model, **kwargs)
        self.tokenizer = None if self.config.skip_tokenizer_init else Tokenizer(path)
        self.vocab_size = model_config.vocab_size
        self.processor = Processor(self.config, path, model_config, self.tokenizer)
        self.engine_core = EngineCore(self.config, path, eos_token_ids(path, model_config, self.tokenizer))
        self.processor.num_kvcache_blocks = self.engine_core.model_runner.num_kvcache_blocks
        self.seqs: dict[str, Sequence] = {}  # this front end's unfinished requests, by request id
        self.logprobs: dict[Sequence, list] = {}  # the new tokens' logprobs of requests that ask for them
        self.prompt_logprobs: dict[Sequence, list] = {}  # ... and their prompts'
        self.request_ids = count()

    # the engine core's pieces, in this process: to watch and to drive by hand (notebooks, tests)
    scheduler = property(lambda self: self.engine_core.scheduler)
    block_manager = property(lambda self: self.engine_core.block_manager)
    model_runner = property(lambda self: self.engine_core.model_runner)
    drafter = property(lambda self: self.engine_core.model_runner.drafter)
    spec_stats = property(lambda self: self.engine_core.spec_stats)
    closed = property(lambda self: self.engine_core.closed)
    workers = property(lambda self: self.engine_core.workers)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams, priority: int = 0) -> Sequence:
        """Check, tokenize and queue a request; its Sequence. Raises ValueError naming the problem and the fix."""
        return self.queue(self.processor.process(str(next(self.request_ids)), prompt, sampling_params, priority))

    def queue(self, request: EngineCoreRequest) -> Sequence:
        """Hand a processed request to the engine core; its Sequence, kept to map the core's outputs back."""
        seq = self.seqs[request.request_id] = self.engine_core.add_request(request)
        return seq

    def abort_request(self, seq: Sequence) -> None:
        """Stop an unfinished request (as returned by add_request) and free its blocks."""
        self.seqs.pop(seq.request_id, None)
        self.engine_core.abort_requests([seq.request_id])

    def step(self) -> tuple[list[Sequence], int]:
        """Run one engine-core step: the sequences that got tokens, and the tokens computed. A step that raises (an
        error, Ctrl-C) is rolled back; a request that fails on its own raises EngineError (the others go on)."""
        out = self.engine_core.step()
        updated = [self.seqs[o.request_id] for o in out.outputs if o.request_id in self.seqs]
        for o in out.outputs:
            if o.prompt_logprobs and o.request_id in self.seqs:
                self.prompt_logprobs[self.seqs[o.request_id]] = o.prompt_logprobs
            if o.new_logprobs and o.request_id in self.seqs:
                self.logprobs.setdefault(self.seqs[o.request_id], []).extend(o.new_logprobs)
            if o.finished:
                self.seqs.pop(o.request_id, None)
            if o.error:
                raise EngineError(f"request {o.request_id} failed: {o.error}")
        return updated, out.num_scheduled_tokens

    def is_finished(self) -> bool:
        return not self.engine_core.has_unfinished_requests()

    def close(self, reason: str = "close() was called") -> None:
        """Stop the parallel workers (if any); the engine runs no more steps. Also on `with LLM(...)` exit."""
        self.engine_core.close(reason)

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
        requests = []
        for i, (prompt, sp, prio) in enumerate(zip(prompts, sps, prios)):
            try:  # all checked before any is queued: a bad prompt rejects the whole call
                requests.append(self.processor.process(str(next(self.request_ids)), prompt, sp, prio))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        # a request with n > 1 runs as n (chapter 16): its answers are its seqs' next n entries
        return [self.queue(child) for request in requests for child in child_requests(request)]

    def stream(self, prompts, sampling_params=None, priorities=None) -> Iterator[StreamOutput]:
        """Yield each request's text as it is produced (incrementally detokenized). Closing the stream early
        (break, an exception, Ctrl-C) aborts its unfinished requests."""
        seqs = self._add_all(prompts, sampling_params, priorities)
        index = {seq.seq_id: i for i, seq in enumerate(seqs)}
        sent = dict.fromkeys(index, 0)  # completion tokens yielded, per request
        detoks = {
            seq.seq_id: IncrementalDetokenizer(self.tokenizer, seq.token_ids, seq.sampling_params.skip_special_tokens)
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
                self.logprobs.pop(seq, None)
                self.prompt_logprobs.pop(seq, None)

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
            logprobs = {seq: self.logprobs.pop(seq, []) for seq in seqs}
            prompts = {seq: self.prompt_logprobs.pop(seq, None) for seq in seqs}
        decode = self.tokenizer.decode if self.tokenizer is not None else lambda ids, skip: ""
        answers = [
            CompletionOutput(
                i,
                decode(seq.completion_token_ids, seq.sampling_params.skip_special_tokens),
                seq.completion_token_ids,
                seq.finish_reason,
                decode_logprobs(logprobs[seq], self.tokenizer) if seq.sampling_params.logprobs is not None else None,
            )
            for seq in seqs
            for i in [split_request_id(seq.request_id, seq.sampling_params.n)[0]]
        ]
        outputs, start = [], 0
        while start < len(seqs):
            seq, n = seqs[start], seqs[start].sampling_params.n
            first = answers[start]
            outputs.append(
                RequestOutput(
                    seq.token_ids[: seq.num_prompt_tokens],
                    first.token_ids,
                    first.text,
                    first.finish_reason,
                    seq.num_prompt_cached_tokens,
                    seq.arrival_time,
                    seq.first_token_time,
                    max(s.finish_time for s in seqs[start : start + n]),
                    seq.num_draft_tokens,
                    seq.num_accepted_tokens,
                    answers[start : start + n],
                    first.logprobs,
                    [None, *decode_logprobs(prompts[seq], self.tokenizer)] if prompts[seq] else None,
                )
            )
            start += n
        return outputs


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
