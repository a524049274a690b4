"""The statistics of one step (vLLM's vllm/v1/metrics/stats.py): SchedulerStats from the engine core (queues, KV
cache, preemptions, drafts), IterationStats made by the front end from a step's outputs (tokens, latencies)."""

from dataclasses import dataclass, field

import msgspec


class SchedulerStats(msgspec.Struct, array_like=True):
    """The engine core's queues and KV cache after a step (kv_cache_usage in [0, 1]), and what the step did that
    only the core sees: preemptions, and with speculative decoding its drafts, draft tokens and accepted tokens."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    num_preempted_reqs: int = 0
    spec_decode: tuple[int, int, int] = (0, 0, 0)


@dataclass
class IterationStats:
    """What one step did for the front end's requests (vLLM's IterationStats): tokens, prefix-cache lookups of the
    prompts that got their first token, and latencies in seconds."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, the tokens found there
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    e2e_latencies: list[float] = field(default_factory=list)  # of the requests that finished
