"""The story corpus (minillm.data): a seeded generator and an exact checker that agree with each other."""

import random

import pytest

from minillm.data import (
    generate_corpus,
    generate_story,
    heldout_openings,
    is_valid_sentence,
    keeps_its_cast,
    make_cast,
    sentence_validity,
    split_sentences,
)
from minillm.data.grammar import fill
from minillm.data.templates import all_templates
from minillm.data.tokenizer_training import train_tokenizer


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(1500, seed=7)


@pytest.fixture(scope="module")
def sentences(corpus):
    return [s for story in corpus for s in split_sentences(story)]


def test_generator_is_seeded():
    assert generate_corpus(30, seed=3) == generate_corpus(30, seed=3)
    assert generate_corpus(30, seed=3) != generate_corpus(30, seed=4)
    assert generate_story(random.Random(5)) == generate_story(random.Random(5))


def test_stories_are_varied_and_story_sized(corpus):
    assert len(set(corpus)) == len(corpus)
    words = {w.strip('.,!?"\'') for story in corpus for w in story.split()}
    assert 300 <= len(words) <= 1000, len(words)
    n_sentences = [len(split_sentences(s)) for s in corpus]
    assert 8 <= min(n_sentences) and max(n_sentences) <= 30
    assert sum('"' in s for s in corpus) > 0.9 * len(corpus)  # dialogue is common


def test_every_generated_sentence_is_valid(sentences):
    bad = [s for s in sentences if not is_valid_sentence(s)]
    assert not bad, bad[:5]


def test_stories_keep_their_cast(corpus):
    assert all(keeps_its_cast(story) for story in corpus)
    assert not keeps_its_cast("Mia went to the park. Kate came by. Ella smiled.")  # two heroes
    assert not keeps_its_cast("Mia went to the park. Kate came by. Amy smiled.")  # two friends


def test_every_template_fills_to_one_valid_sentence():
    rng = random.Random(0)
    for template in all_templates():
        for _ in range(5):
            sentence = fill(template, make_cast(rng), rng)
            assert split_sentences(sentence) == [sentence], template
            assert is_valid_sentence(sentence), (template, sentence)


def test_split_sentences_handles_dialogue():
    text = (
        '"Can I help you?" asked Ben. Mia said nothing. "Thank you, Ben!" said Mia. '
        'It was the best day ever. "I did it!" shouted Tom. The end. Then she'
    )
    assert split_sentences(text) == [
        '"Can I help you?" asked Ben.',
        "Mia said nothing.",
        '"Thank you, Ben!" said Mia.',
        "It was the best day ever.",
        '"I did it!" shouted Tom.',
        "The end.",
        "Then she",
    ]
    assert split_sentences("  ") == []


@pytest.mark.parametrize(
    "sentence, valid",
    [
        ("Mia felt very sad.", True),
        ("Mia felt very sad", False),  # no end mark
        ("Mia felt very.", False),  # a word missing
        ("Mia felt very zebra.", False),  # a word from outside the vocabulary
        ("Mia very felt sad.", False),  # two words swapped
        ("Suddenly, Mia could not find her red ball.", True),
        ("Suddenly, Mia could not find his red ball.", False),  # her/his must agree with the name
        ("Suddenly, Tom could not find his red ball.", True),
        ("She had an orange kite that could fly very high.", True),
        ("He had a red ball that he loved very much.", True),
        ("He had a red ball that she loved very much.", False),  # one hero, one gender
        ("Then Tom, a shy girl, came to see Mia.", False),  # Tom is a hero's name, not a friend's
        ("She had a orange kite that could fly very high.", False),  # a/an
        ("Once upon a time, there was a shy girl named Tom.", False),  # a girl is not called Tom
        ("Once upon a time, there was a shy fox named Tom.", True),
        ("From that day on, Mia and Kate were best friends.", True),
        ("From that day on, Mia and Mia were best friends.", False),  # heroes and friends have their own names
        ("From that day on, Kate and Mia were best friends.", False),  # ... so a swap of roles shows
        ('"What is wrong, Mia?" asked Kate.', True),
        ('"What is wrong, Mia?" asked Mia.', False),
        ("Then Tina, a little boy, came to see Mia.", False),  # Tina is a girl
        ('"Thank you, Kate!" said Mia.', True),
        ('"Thank you, Kate!" said Mia', False),
        ("", False),
    ],
)
def test_checker_examples(sentence, valid):
    assert is_valid_sentence(sentence) == valid


def _corruptions(sentence: str, rng: random.Random) -> list[str]:
    words = sentence.split()
    i = rng.randrange(len(words) - 1)
    swapped = words[:i] + [words[i + 1], words[i]] + words[i + 2 :]
    j = rng.randrange(len(words))
    foreign = words[:j] + ["zebra"] + words[j + 1 :]
    k = rng.randrange(1, len(words))
    return [" ".join(swapped), " ".join(foreign), " ".join(words[:k])]


def test_checker_rejects_corrupted_sentences(sentences):
    rng = random.Random(1)
    multiword = [s for s in sentences[:3000] if len(s.split()) >= 3]
    corrupted = [c for s in multiword for c in _corruptions(s, rng) if c != s and c not in sentences]
    accepted = [c for c in corrupted if is_valid_sentence(c)]
    assert len(corrupted) > 5000
    assert not accepted, accepted[:5]


def test_sentence_validity_counts():
    assert sentence_validity("Mia felt very sad. Mia felt very zebra. The end.") == (2, 3)
    assert sentence_validity("") == (0, 0)


def test_heldout_openings_are_valid_story_starts():
    openings = heldout_openings(50)
    assert len(openings) == 50 and openings == heldout_openings(50)
    assert all(sentence_validity(o) == (2, 2) for o in openings)


def test_tokenizer_round_trips_text():
    stories = generate_corpus(200, seed=11)
    tok = train_tokenizer(stories, vocab_size=4096)
    assert tok.get_vocab_size() % 64 == 0 and tok.get_vocab_size() < 4096
    assert [tok.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>")] == [0, 1, 2]
    for text in stories[:20] + ['Zebra Ωmega, "unseen" words!\nA new line.']:
        enc = tok.encode(text)
        assert enc.ids[0] == 1  # <bos> is added
        assert tok.decode(enc.ids) == text
    assert len(tok.encode(stories[0]).ids) < len(stories[0]) / 3  # words are whole tokens
    assert train_tokenizer(stories).to_str() == tok.to_str()  # deterministic
