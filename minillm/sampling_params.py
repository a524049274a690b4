"""SamplingParams: how one request picks its tokens and when it stops."""

import math
from dataclasses import dataclass

import torch

# temperatures in (0, _MAX_TEMP) are raised to it: logits / 1e-5 overflows to inf and the softmax gives NaN
# (vLLM's name and value; 0 itself stays greedy)
_MAX_TEMP = 1e-2
_LONG_INFO = torch.iinfo(torch.long)  # a seed seeds a torch.Generator: it must fit an int64 (vLLM's bound)
# the engine looks each new token up in stop_token_ids: a bound keeps that check, and the request, small
MAX_STOP_TOKEN_IDS = 1024


def is_int(value) -> bool:
    """An int and not a bool (True is an int to Python, never a token count or a seed to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 (or vLLM's -1) and top_p 1 keep the whole vocabulary; seed makes a
    request's draws reproducible whatever else shares its batch. Bounds as vLLM's: a temperature in (0, 0.01) is
    raised to 0.01, a seed fits an int64; top_k above the vocabulary is refused where the vocabulary is known."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    skip_special_tokens: bool = True  # leave special tokens (EOS, chat markers) out of the text

    def __post_init__(self):
        t = self.temperature
        if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if 0 < t < _MAX_TEMP:
            object.__setattr__(self, "temperature", _MAX_TEMP)
        if not (is_int(self.top_k) and self.top_k >= -1):
            raise ValueError(f"top_k must be an integer >= -1 (0 or -1 = no limit), got {self.top_k!r}")
        object.__setattr__(self, "top_k", max(self.top_k, 0))
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 = no limit), got {self.top_p!r}")
        if not (is_int(self.max_tokens) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not (is_int(self.seed) and _LONG_INFO.min <= self.seed <= _LONG_INFO.max):
            raise ValueError(
                f"seed must be an integer in [{_LONG_INFO.min}, {_LONG_INFO.max}] (an int64) or None, got {self.seed!r}"
            )
        if not isinstance(self.skip_special_tokens, bool):
            raise ValueError(f"skip_special_tokens must be True or False, got {self.skip_special_tokens!r}")
        self._check_stop_token_ids()

    def _check_stop_token_ids(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids has {len(self.stop_token_ids)} ids, more than {MAX_STOP_TOKEN_IDS}: give at most "
                f"{MAX_STOP_TOKEN_IDS} (each is looked up for every new token)"
            )
        if bad := [t for t in self.stop_token_ids if not (is_int(t) and t >= 0)]:
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {bad[:5]!r}")
