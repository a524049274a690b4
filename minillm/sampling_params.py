"""SamplingParams: how one request picks its tokens and when it stops."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 (or vLLM's -1) and top_p 1 keep the whole vocabulary; seed makes a
    request's draws reproducible whatever else shares its batch."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if not (
            isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= -1):
            raise ValueError(f"top_k must be an integer >= -1 (0 or -1 = no limit), got {self.top_k!r}")
        object.__setattr__(self, "top_k", max(self.top_k, 0))
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 = no limit), got {self.top_p!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}")
