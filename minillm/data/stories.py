"""Generate stories: pick a cast and a plot, then walk the plot's beats, filling one template per beat.

Everything is driven by one `random.Random`, so a seed fixes the whole corpus. The training corpus and
the held-out stories come from different seeds.
"""

import random

from minillm.data.grammar import ROLES, fill
from minillm.data.lexicon import KINDS
from minillm.data.templates import PLOTS

TRAIN_SEED = 1234
HELDOUT_SEED = 98765


def make_cast(rng: random.Random) -> dict[str, str]:
    """Who and what one story is about: each role and each of its attributes.

    e.g. {"hero": "Mia", "hero.his": "her", "hero.kind": "fox", "thing": "red ball", "thing.a": "a red ball", ...}"""
    cast: dict[str, str] = {}
    for role, rt in ROLES.items():
        value = cast[role] = rng.choice(rt.values)
        for attr, agree in rt.attrs.items():
            words = sorted(agree(value))
            if attr == "kind":  # half the characters are children, half are animals
                human = [k for k in words if KINDS[k] is not None]
                words = human if rng.random() < 0.5 else [k for k in words if KINDS[k] is None]
            cast[f"{role}.{attr}"] = rng.choice(words)
    return cast


def generate_story(rng: random.Random) -> str:
    """One story, a single paragraph of about fifteen sentences."""
    cast = make_cast(rng)
    plot = PLOTS[rng.choice(sorted(PLOTS))]
    sentences: list[str] = []
    for b in plot:
        if rng.random() >= b.p:
            continue
        for template in rng.sample(b.templates, rng.randint(1, min(b.most, len(b.templates)))):
            sentences.append(fill(template, cast, rng))
    return " ".join(sentences)


def generate_corpus(n: int, seed: int = TRAIN_SEED) -> list[str]:
    """`n` stories from one seed: the same seed always gives the same list."""
    rng = random.Random(seed)
    return [generate_story(rng) for _ in range(n)]


def heldout_openings(n: int, seed: int = HELDOUT_SEED, sentences: int = 2) -> list[str]:
    """Prompts for evaluation: the first `sentences` sentences of `n` stories the model never trained on."""
    from minillm.data.checker import split_sentences

    return [" ".join(split_sentences(s)[:sentences]) for s in generate_corpus(n, seed)]
