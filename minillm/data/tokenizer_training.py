"""Train the default model's tokenizer: byte-level BPE on the story corpus, with the `tokenizers` library.

Byte-level means the base alphabet is the 256 bytes, so any text can be encoded; BPE then learns
merges of frequent pairs until every common word is one token. The tokenizer puts <bos> in front of
every encoded text (the model was trained on "<bos> story <eos>"), and generation stops at <eos>.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2


def train_tokenizer(texts: list[str], vocab_size: int = 4096, multiple_of: int = 64) -> Tokenizer:
    """BPE with at most `vocab_size` tokens, trimmed to a multiple of `multiple_of` (so that a tensor-parallel
    split of the embedding is even). A corpus of a few hundred words runs out of merges before 4096: the
    trainer stops early, and we retrain to the largest multiple below where it stopped."""

    def train(size: int) -> Tokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(texts, trainer)
        return tok

    tok = train(vocab_size)
    if tok.get_vocab_size() % multiple_of:
        tok = train(tok.get_vocab_size() // multiple_of * multiple_of)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json, the files `transformers.AutoTokenizer` reads."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(str(out_dir))
