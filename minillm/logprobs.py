"""Log-probabilities as the engine returns them (vLLM's vllm/logprobs.py): for each token, a mapping from token id to
a `Logprob`, holding the chosen token and the `logprobs` likeliest alternatives (chapter 16)."""

from dataclasses import dataclass


@dataclass
class Logprob:
    """One token's log-probability under the model (log_softmax of its raw logits, as vLLM's default
    logprobs_mode: before temperature, penalties or top-k/top-p, after a grammar's mask), its rank among the
    vocabulary (1 = the likeliest) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# one mapping per generated token (SampleLogprobs) or per prompt token, the first of which has none (PromptLogprobs)
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]
