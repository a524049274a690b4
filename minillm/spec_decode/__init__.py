"""Speculative decoding (chapter 13): cheap guesses of a sequence's next tokens (drafts), verified by the model in
one forward over all of them. At small batch a decode step is bound by reading the weights, so scoring k + 1 tokens
costs about what scoring one does; every draft the model agrees with is a token gained."""

from minillm.config import SpeculativeConfig


def make_proposer(config, vocab_size: int, num_blocks: int):
    """The proposer config.speculative_config asks for (config: the engine's resolved Config), or None."""
    if config.speculative_config is None:
        return None
    spec = SpeculativeConfig.from_dict(config.speculative_config)
    if spec.method == "ngram":
        from minillm.spec_decode.ngram_proposer import NgramProposer

        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min)
    from minillm.spec_decode.draft_model import DraftModelProposer

    return DraftModelProposer(spec, config, vocab_size, num_blocks)
