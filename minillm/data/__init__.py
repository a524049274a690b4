"""The synthetic story corpus the default model is trained on, and the checker that judges text against it.

generate_corpus(n, seed)   -> n short children's stories (a seed fixes them all)
is_valid_sentence(s)       -> can the story grammar produce this sentence?
sentence_validity(text)    -> (valid sentences, all sentences)
"""

from minillm.data.checker import is_valid_sentence, keeps_its_cast, sentence_validity, split_sentences
from minillm.data.stories import HELDOUT_SEED, TRAIN_SEED, generate_corpus, generate_story, heldout_openings, make_cast

__all__ = [
    "generate_story",
    "generate_corpus",
    "heldout_openings",
    "make_cast",
    "split_sentences",
    "is_valid_sentence",
    "sentence_validity",
    "keeps_its_cast",
    "TRAIN_SEED",
    "HELDOUT_SEED",
]
