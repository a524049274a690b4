"""SamplingParams: how one request picks its tokens and when it stops."""

import math
from dataclasses import dataclass
from functools import cached_property

import torch

# temperatures in (0, _MAX_TEMP) are raised to it: logits / 1e-5 overflows to inf and the softmax gives NaN
# (vLLM's name and value; 0 itself stays greedy)
_MAX_TEMP = 1e-2
_LONG_INFO = torch.iinfo(torch.long)  # a seed seeds a torch.Generator: it must fit an int64 (vLLM's bound)
# the engine looks each new token up in stop_token_ids: a bound keeps that check, and the request, small
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGPROBS = 20  # the most top alternatives a token's logprobs may list (vLLM's max_logprobs default)


def is_number(value) -> bool:
    """A finite int or float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value) -> bool:
    """An int and not a bool (True is an int to Python, never a token count or a seed to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What the output must match (vLLM's StructuredOutputsParams): exactly one of a JSON schema (a dict or its
    JSON text), any JSON object (json_object=True), a regular expression, one of a list of strings, or an EBNF
    grammar (GBNF, as llama.cpp and xgrammar write it). The engine masks every token that would leave the
    grammar (chapter 16)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self):
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(
                    f"structured_outputs.choice must be a non-empty list of non-empty strings, got {self.choice!r}"
                )
        kinds = [
            k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)
        ]
        if len(kinds) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json (a JSON schema), json_object, regex, choice or grammar, "
                f"got {kinds or 'none'}"
            )
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(
                f"structured_outputs.json must be a JSON schema (a dict or its JSON text), got {self.json!r}"
            )
        for k in ("regex", "grammar"):
            if getattr(self, k) is not None and not (isinstance(getattr(self, k), str) and getattr(self, k)):
                raise ValueError(f"structured_outputs.{k} must be a non-empty string, got {getattr(self, k)!r}")

    @property
    def kind(self) -> str:
        return next(
            k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)
        )


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
    # chapter 16: the rest of vLLM's sampling API
    n: int = 1  # answers to the prompt, sampled in parallel: they share the prompt's KV blocks
    logprobs: int | None = None  # per new token: its log-probability and those of the `logprobs` likeliest
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest
    presence_penalty: float = 0.0  # minus this from the logit of every token already generated
    frequency_penalty: float = 0.0  # minus this times how often the token was generated
    repetition_penalty: float = 1.0  # divide (multiply, if negative) the logit of a token in prompt or output
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    min_tokens: int = 0  # no EOS or stop token before this many new tokens
    bad_words: tuple[str, ...] = ()  # words never generated (the front end turns them into token ids)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()  # ... these, which the engine core bans
    structured_outputs: StructuredOutputsParams | None = None

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
        self._check_chapter_16()

    def _check_chapter_16(self):
        if not (is_int(self.n) and 1 <= self.n <= 128):
            raise ValueError(f"n must be an integer from 1 to 128 (the answers to sample), got {self.n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (is_int(value) and 0 <= value <= MAX_LOGPROBS):
                raise ValueError(
                    f"{name} must be an integer from 0 to {MAX_LOGPROBS} (the top alternatives to list) or None, "
                    f"got {value!r}"
                )
        if not (is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (is_number(getattr(self, name)) and -2 <= getattr(self, name) <= 2):
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {getattr(self, name)!r}")
        if not (is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= 100):
            raise ValueError(f"repetition_penalty must be in (0, 100] (1 = off), got {self.repetition_penalty!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must map token ids to biases, got {self.logit_bias!r}")
            bias = {}
            for token, value in self.logit_bias.items():
                token = int(token) if isinstance(token, str) and token.isdigit() else token
                if not (is_int(token) and token >= 0 and is_number(value) and -100 <= value <= 100):
                    raise ValueError(
                        f"logit_bias maps token ids (integers >= 0) to biases in [-100, 100], got {token!r}: {value!r}"
                    )
                bias[token] = float(value)
            object.__setattr__(self, "logit_bias", bias or None)
        if not (is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens):
            raise ValueError(
                f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        if not all(isinstance(w, str) and w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words must be a list of non-empty strings, got {list(self.bad_words)!r}")
        object.__setattr__(self, "bad_words_token_ids", tuple(tuple(ids) for ids in self.bad_words_token_ids))
        if isinstance(self.structured_outputs, dict):
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams(**self.structured_outputs))
        if not isinstance(self.structured_outputs, (StructuredOutputsParams, type(None))):
            raise ValueError(
                f"structured_outputs must be a StructuredOutputsParams, got {type(self.structured_outputs).__name__}"
            )

    @cached_property  # asked for every request at every step
    def needs_penalties(self) -> bool:
        """Does the sampler change this request's logits before sampling (chapter 16's logits processors)?"""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.min_tokens
            or self.bad_words_token_ids
        )

    def _check_stop_token_ids(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids has {len(self.stop_token_ids)} ids, more than {MAX_STOP_TOKEN_IDS}: give at most "
                f"{MAX_STOP_TOKEN_IDS} (each is looked up for every new token)"
            )
        if bad := [t for t in self.stop_token_ids if not (is_int(t) and t >= 0)]:
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {bad[:5]!r}")
