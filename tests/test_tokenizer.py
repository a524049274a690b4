"""The tokenizer wrapper agrees with transformers, and streaming text never breaks a character."""

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minillm.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Once upon a time, a small fox lived in the forest.",
    "Élodie mangea une crème brûlée à côté de la fenêtre.",
    "小狐狸在森林里找到了一个红色的球。",
    "The cat saw the moon 🌙 and smiled 😀🦊 at the stars ✨.",
    "Ünïcödé mixes: naïve café, 東京, 🏳️‍🌈 and plain ASCII.",
]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A small byte-level BPE trained on the texts above, so multi-byte characters span several tokens."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|bos|>", "<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    hf.train_from_iterator(TEXTS * 3, trainer)
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(
        tokenizer_object=hf, bos_token="<|bos|>", eos_token="<|eos|>", chat_template=TEMPLATE
    ).save_pretrained(path)
    return path


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenization_equals_full_decode(tok_dir, text):
    tok = Tokenizer(tok_dir)
    ids = tok.encode(text, add_special_tokens=False)
    for split in (0, 1, len(ids) // 2):  # stream after prompts of several lengths
        detok = IncrementalDetokenizer(tok, ids[:split])
        deltas = [detok.add(t) for t in ids[split:]]
        assert "".join(deltas) == tok.decode(ids)[len(tok.decode(ids[:split])) :]
        assert not any("\ufffd" in d for d in deltas)


def test_a_character_split_across_tokens_is_held_back(tok_dir):
    tok = Tokenizer(tok_dir)
    ids = tok.encode("🦊", add_special_tokens=False)
    assert len(ids) > 1, "the emoji should need several byte tokens"
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(t) for t in ids] == [""] * (len(ids) - 1) + ["🦊"]


def test_encode_decode_and_specials_match_transformers(tok_dir):
    ours, theirs = Tokenizer(tok_dir), AutoTokenizer.from_pretrained(tok_dir)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text)
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text), skip_special_tokens=True)
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)


def test_chat_template_matches_transformers(tok_dir):
    messages = [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once..."},
        {"role": "user", "content": "Another!"},
    ]
    expected = AutoTokenizer.from_pretrained(tok_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert Tokenizer(tok_dir).apply_chat_template(messages) == expected


def test_no_chat_template_is_a_clear_error(tok_dir, tmp_path):
    for name in ("tokenizer.json",):
        (tmp_path / name).write_bytes((tok_dir / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>"}))
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "hi"}])
