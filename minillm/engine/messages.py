"""What crosses the client boundary between the front end and the engine core (vLLM's vllm/v1/engine/__init__.py):
requests as token ids with their sampling parameters, and each step's outputs as new token ids. msgspec Structs,
so that the multiprocess client sends them as compact msgpack arrays (field order, no names)."""

import msgspec

from minillm.metrics.stats import SchedulerStats
from minillm.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A request the front end has checked and tokenized."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0
    fork_of: str | None = None  # n > 1 (chapter 16): the sibling whose prompt it shares, if still to be computed


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one step did for one request: its new tokens (several after a verify step, chapter 13); on its last,
    why it finished ("stop", "length", "abort", or "error" with the error's text); on its first, how many prompt
    tokens the prefix cache held."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    new_logprobs: list | None = None  # per new token: (token ids, logprobs, rank of the first), if asked (chapter 16)
    prompt_logprobs: list | None = None  # the same per prompt token after the first, with the first token, if asked

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's outputs, a request each, with the scheduler's statistics after it and the tokens it computed;
    engine_index: which of a data-parallel front end's cores ran it (chapter 15)."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    num_scheduled_tokens: int = 0
    engine_index: int = 0
