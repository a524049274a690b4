"""The quality meter: does a sentence belong to the story grammar?

A sentence is valid when some template, compiled to a regex, matches all of it and the matched words
agree (pronouns with names, "a"/"an"). This is exact: the checker accepts
precisely the sentences the generator can write, so the share of a model's sentences it accepts
measures how well the model learned the language.
"""

import re
from functools import lru_cache

from minillm.data.grammar import ROLES, agrees, compile_template
from minillm.data.templates import all_templates

# A sentence ends at . ! or ? (and a closing quote right after it) when what follows is the start of a
# new sentence - a capital letter or an opening quote - or the end of the text. So the "?" in
# "Can I help?" asked Ben. does not end the sentence: a lowercase word follows.
_END = re.compile(r'[.!?]"?(?=\s+["A-Z]|\s*$)')


def split_sentences(text: str) -> list[str]:
    """Cut a text into sentences; a trailing piece with no end mark (a cut-off sentence) is kept too."""
    sentences, start = [], 0
    for m in _END.finditer(text):
        sentences.append(text[start : m.end()].strip())
        start = m.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


@lru_cache(maxsize=1)
def _patterns() -> dict[str, list[re.Pattern]]:
    """Compiled templates, indexed by their first character so that a sentence tries few of them."""
    by_first: dict[str, list[re.Pattern]] = {}
    for t in all_templates():
        p = compile_template(t)
        firsts = {t[0]} if t[0] != "{" else {chr(c) for c in range(ord("A"), ord("Z") + 1)}
        for c in firsts:
            by_first.setdefault(c, []).append(p)
    return by_first


def is_valid_sentence(sentence: str) -> bool:
    """True when the grammar can produce `sentence` (surrounding whitespace ignored)."""
    sentence = sentence.strip()
    if not sentence:
        return False
    for p in _patterns().get(sentence[0], []):
        m = p.fullmatch(sentence)
        if m and agrees(m.groupdict()):
            return True
    return False


def sentence_validity(text: str) -> tuple[int, int]:
    """(valid sentences, all sentences) in a text."""
    sentences = split_sentences(text)
    return sum(map(is_valid_sentence, sentences)), len(sentences)


def keeps_its_cast(story: str) -> bool:
    """A story-level check the sentence checker cannot make: one hero and at most one friend, by name,
    from start to end (a model that forgets who its story is about still writes valid sentences)."""
    words = set(re.findall(r"[A-Z][a-z]+", story))
    return len(words & set(ROLES["hero"].values)) <= 1 and len(words & set(ROLES["friend"].values)) <= 1
