"""Speculative decoding (chapter 13): cheap guesses of a sequence's next tokens (drafts), verified by the model in
one forward over all of them. At small batch a decode step is bound by reading the weights, so scoring k + 1 tokens
costs about what scoring one does; every draft the model agrees with is a token gained.

As in vLLM V1, the model runner owns the proposer (its `drafter`) and calls it right after sampling, with what it
needs as plain values (`DraftInput`); the drafts it returns go to the scheduler, which verifies them in the next
step. Nothing here imports the engine."""

from collections.abc import Callable

from minillm.config import Config, SpeculativeConfig
from minillm.spec_decode.inputs import DraftInput, draft_inputs

__all__ = ["DraftInput", "draft_inputs", "make_proposer"]


def make_proposer(config: Config, vocab_size: int, load_runner: Callable):
    """The proposer config.speculative_config asks for, or None. load_runner(config, path) builds a model runner for
    a draft model (the engine's ModelRunner, injected), without a KV cache yet: the target sizes both caches."""
    if config.speculative_config is None:
        return None
    spec = SpeculativeConfig.from_dict(config.speculative_config)
    if spec.method == "ngram":
        from minillm.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min)
    from minillm.spec_decode.draft_model import DraftModelProposer, draft_config

    return DraftModelProposer(spec.num_speculative_tokens, load_runner(*draft_config(spec, config, vocab_size)))
