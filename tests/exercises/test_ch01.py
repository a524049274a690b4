"""Chapter 01 exercise 01.2: incremental detokenization.

A toy tokenizer makes both difficulties easy to see: ASCII words are single tokens with their leading space
(decoded alone, the first word of a window loses its space, as SentencePiece does), and every other
character is split into its UTF-8 bytes, one token each (a window that ends inside a character decodes
to "\ufffd"). Streaming through minillm's IncrementalDetokenizer with your function plugged in must give
the same text as decoding everything at once.

    python -m minillm.course grade 01
"""

import re

import pytest

from minillm.course import use_impl
from minillm.tokenizer import IncrementalDetokenizer

TEXTS = [
    "Once upon a time, a small fox lived in the forest.",
    "Élodie mangea une crème brûlée.",
    "The fox 🦊 saw the moon 🌙 and smiled.",
]


class ToyTokenizer:
    """Ids index a list of byte pieces; decode joins them, shows broken UTF-8 as "\ufffd", drops one leading space."""

    def __init__(self):
        self.pieces: list[bytes] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in re.findall(r"\s*\S+", text):
            for piece in [word.encode()] if word.isascii() else [bytes([b]) for b in word.encode()]:
                if piece not in self.pieces:
                    self.pieces.append(piece)
                ids.append(self.pieces.index(piece))
        return ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace").removeprefix(" ")


@pytest.mark.exercise("01.2")
def test_returns_the_new_text_and_moves_both_offsets(impl):
    tok = ToyTokenizer()
    ids = tok.encode("Once upon")
    assert impl.detokenize_incrementally(tok, ids, 0, 1) == (" upon", 1, 2)


@pytest.mark.exercise("01.2")
def test_a_character_split_across_tokens_is_held_back(impl):
    tok = ToyTokenizer()
    ids = tok.encode("a 🦊")  # "a", then " 🦊" as five byte tokens: the space and the fox's four bytes
    assert impl.detokenize_incrementally(tok, ids[:3], 0, 1) == ("", 0, 1)
    assert impl.detokenize_incrementally(tok, ids, 0, 1) == (" 🦊", 1, 6)


@pytest.mark.exercise("01.2")
@pytest.mark.parametrize("text", TEXTS, ids=["ascii", "accents", "emoji"])
def test_streaming_inside_minillm_equals_decoding_at_once(impl, text):
    tok = ToyTokenizer()
    ids = tok.encode(text)
    with use_impl(impl, "01.2"):
        for split in (0, len(tok.encode(text.split()[0]))):  # stream from the start, and after the first word
            detok = IncrementalDetokenizer(tok, ids[:split])
            deltas = [detok.add(t) for t in ids[split:]]
            assert not any("\ufffd" in d for d in deltas)
            assert tok.decode(ids[:split]) + "".join(deltas) == text
