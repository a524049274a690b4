"""Sentence templates with slots, and the two things we do with them: fill them and recognise them.

A template is a sentence with slots in braces: "{hero} looked for {hero.his} {thing}." A slot is
  - a *role* (hero, friend, thing, ...): who or what the story is about; it keeps its value for the
    whole story, so "Mia" stays "Mia";
  - an *attribute* of a role (hero.his, thing.a): a word that must agree with the role ("her" for Mia,
    "an orange ball" for "orange ball");
  - a *category* from the lexicon (sad, spot, ...): any word of the list, picked anew each time.
Filling a template gives a sentence; compiling it gives a regex that recognises exactly the sentences
the template can produce (attribute agreement is checked after the match, see `agrees`).
"""

import re
from dataclasses import dataclass, field
from typing import Callable

from minillm.data.lexicon import (
    CATEGORIES,
    COLORS,
    CRITTERS,
    FLYERS,
    FRIEND_BOYS,
    FRIEND_GIRLS,
    FRUITS,
    GIRL_NAMES,
    HERO_BOYS,
    HERO_GIRLS,
    KINDS,
    PLACES,
    PRONOUNS,
    TOY_ADJECTIVES,
    TOYS,
    TREATS,
    article,
)


@dataclass(frozen=True)
class RoleType:
    """What a role may be (`values`) and, per attribute, which words agree with a given value."""

    values: list[str]
    attrs: dict[str, Callable[[str], set[str]]] = field(default_factory=dict)


def gender(name: str) -> str:
    return "f" if name in GIRL_NAMES else "m"


def _pronoun(attr: str) -> Callable[[str], set[str]]:
    return lambda name: {PRONOUNS[gender(name)][attr]}


def _noun(phrase: str) -> set[str]:  # "little teddy bear" -> "teddy bear" (adjectives are one word)
    return {phrase.split(" ", 1)[1]}


CHARACTER_ATTRS = {
    **{a: _pronoun(a) for a in PRONOUNS["f"]},
    "kind": lambda n: {k for k, g in KINDS.items() if g in (None, gender(n))},
    "trait": lambda n: set(CATEGORIES["trait"]),
}
HERO = RoleType(HERO_GIRLS + HERO_BOYS, CHARACTER_ATTRS)
FRIEND = RoleType(FRIEND_GIRLS + FRIEND_BOYS, CHARACTER_ATTRS)
THING = RoleType([f"{a} {t}" for a in TOY_ADJECTIVES for t in TOYS], {"noun": _noun, "a": lambda t: {article(t)}})
FLYER = RoleType([f"{c} {f}" for c in COLORS for f in FLYERS], {"noun": _noun, "a": lambda t: {article(t)}})
TREAT = RoleType(TREATS, {"a": lambda f: {article(f)}})
FRUIT = RoleType(FRUITS, {"a": lambda f: {article(f)}})
PLACE = RoleType(list(PLACES), {"at": lambda p: {f"{PLACES[p]} the {p}"}})
CRITTER = RoleType(list(CRITTERS), {"mom": lambda c: {CRITTERS[c]}, "a": lambda c: {article(c)}})

ROLES = {
    "hero": HERO,
    "friend": FRIEND,
    "thing": THING,
    "flyer": FLYER,
    "food": TREAT,
    "fruit": FRUIT,
    "place": PLACE,
    "critter": CRITTER,
}

SLOT = re.compile(r"\{([a-z0-9]+)(?:\.([A-Za-z]+))?\}")


def slot_words(role: str, attr: str | None) -> list[str]:
    """Every word (or phrase) a slot can hold, whatever the rest of the story is."""
    if role in CATEGORIES:
        return CATEGORIES[role]
    rt = ROLES[role]
    if attr is None:
        return rt.values
    return sorted({w for v in rt.values for w in rt.attrs[attr](v)})


def fill(template: str, cast: dict[str, str], rng) -> str:
    """The template with each slot replaced: roles and attributes from the story's `cast`, categories at random."""

    def pick(m: re.Match) -> str:
        key = m.group(0)[1:-1]
        return cast[key] if key in cast else rng.choice(CATEGORIES[m.group(1)])

    return SLOT.sub(pick, template)


def compile_template(template: str) -> re.Pattern:
    """A regex matching exactly the fillings of `template`; each slot is a named group (a.b -> a__b)."""
    parts, seen, pos = [], set(), 0
    for m in SLOT.finditer(template):
        parts.append(re.escape(template[pos : m.start()]))
        group = m.group(0)[1:-1].replace(".", "__")
        if group in seen:  # a slot used twice holds the same word twice
            parts.append(f"(?P={group})")
        else:
            seen.add(group)
            words = sorted(slot_words(m.group(1), m.group(2)), key=len, reverse=True)
            parts.append(f"(?P<{group}>{'|'.join(map(re.escape, words))})")
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts))


def agrees(groups: dict[str, str]) -> bool:
    """Whether the words a compiled template matched agree with each other ("her" with Mia, "an" with
    "orange ball"). All attributes of a role must fit one value of it: the value matched in the sentence,
    or, when the role itself is absent, at least one value ("She hugged his ball." fits no name)."""
    attrs: dict[str, list[tuple[str, str]]] = {}
    for key, word in groups.items():
        role, _, attr = key.partition("__")
        if attr:
            attrs.setdefault(role, []).append((attr, word))
    for role, pairs in attrs.items():
        rt = ROLES[role]
        candidates = [groups[role]] if role in groups else rt.values
        if not any(all(word in rt.attrs[attr](v) for attr, word in pairs) for v in candidates):
            return False
    return True
