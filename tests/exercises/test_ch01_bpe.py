"""Chapter 01 exercise 01.1: BPE encoding of one word, given the learned merges.

First small hand-made merge tables, each aimed at one rule: merges apply lowest rank first (not left to
right), a merged piece can be merged again, a repeated pair merges from the left without overlapping, and
characters no merge mentions stay as they are. Then the oracle: on minillm's shipped tokenizer, your
function applied to each word that the `tokenizers` library's own pre-tokenizer produces, with the merges
read from tokenizer.json, must give exactly the ids of `Tokenizer.encode`, on stories and on text the
corpus never saw (accents, emoji, digits, runs of spaces).

    python -m minillm.course grade 01
"""

import pytest

from minillm import default_model_path
from minillm.data import generate_corpus
from minillm.tokenizer import Tokenizer, load_bpe_ranks

THE = {("h", "e"): 0, ("Ġ", "t"): 1, ("Ġt", "he"): 2}


@pytest.mark.exercise("01.1")
def test_merges_build_up_a_word(impl):
    assert impl.bpe_encode_word("Ġthe", THE) == ["Ġthe"]
    assert impl.bpe_encode_word("the", THE) == ["t", "he"]  # ("t", "he") is not a merge: only ("Ġt", "he") is


@pytest.mark.exercise("01.1")
def test_no_merges_leaves_single_characters(impl):
    assert impl.bpe_encode_word("Ġfox", {}) == ["Ġ", "f", "o", "x"]
    assert impl.bpe_encode_word("a", THE) == ["a"]
    assert impl.bpe_encode_word("ðŁ¦Ĭ", THE) == ["ð", "Ł", "¦", "Ĭ"]  # the fox emoji's 4 bytes, no merge for them


@pytest.mark.exercise("01.1")
def test_the_lowest_rank_merges_first_wherever_it_is(impl):
    ranks = {("b", "c"): 0, ("a", "b"): 1}
    assert impl.bpe_encode_word("abc", ranks) == ["a", "bc"]  # left to right would give ["ab", "c"]
    ranks = {("c", "d"): 0, ("a", "b"): 1, ("ab", "cd"): 2, ("b", "c"): 3}
    assert impl.bpe_encode_word("abcd", ranks) == ["abcd"]  # ("b", "c") never gets its turn


@pytest.mark.exercise("01.1")
def test_a_repeated_pair_merges_from_the_left_without_overlap(impl):
    assert impl.bpe_encode_word("aaa", {("a", "a"): 0}) == ["aa", "a"]
    assert impl.bpe_encode_word("aaaaa", {("a", "a"): 0}) == ["aa", "aa", "a"]
    assert impl.bpe_encode_word("aaaa", {("a", "a"): 0, ("aa", "aa"): 1}) == ["aaaa"]


@pytest.mark.exercise("01.1")
def test_the_input_ranks_are_not_changed(impl):
    ranks = dict(THE)
    impl.bpe_encode_word("Ġthe", ranks)
    assert ranks == THE


UNSEEN = [
    "Zoë ate a crème brûlée under the 🌙 with her 🦊.",
    "It's 10:45!!  Then   three spaces\n\nand a\ttab.",
    "Ünïcödé wörds ünd Ελληνικά, 日本語 too.",
]


@pytest.fixture(scope="module")
def shipped():
    path = default_model_path()
    return Tokenizer(path), load_bpe_ranks(path)


@pytest.mark.exercise("01.1")
@pytest.mark.parametrize("kind", ["stories", "unseen text"])
def test_same_ids_as_the_shipped_tokenizer(impl, shipped, kind):
    tok, ranks = shipped
    vocab = tok.hf.get_vocab()
    texts = generate_corpus(20, seed=7) if kind == "stories" else UNSEEN
    for text in texts:
        words = [w for w, _ in tok.hf.pre_tokenizer.pre_tokenize_str(text)]  # the library's own pre-tokenizer
        pieces = [p for w in words for p in impl.bpe_encode_word(w, ranks)]
        ids = [tok.bos_token_id] + [vocab.get(p, p) for p in pieces]  # encode puts <bos> in front
        assert ids == tok.encode(text), f"different tokens for {text[:60]!r}"
