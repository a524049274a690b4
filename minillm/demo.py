"""`make demo`: the embedded default model tells a few stories, streamed token by token."""
import time

import torch

from minillm import default_model_path
from minillm.models import build_model
from minillm.naive import generate_naive
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer

OPENINGS = [
    "Once upon a time, there was a little fox named Pip.",
    "One sunny morning, Mia went to the park.",
    "Tom had a red ball.",
]


def main() -> None:
    path = default_model_path()
    if not (path / "config.json").exists():
        raise SystemExit(f"The default model is missing from {path}; build it with "
                         "`python scripts/build_default_model.py`.")
    tokenizer, model = Tokenizer(path), build_model(path)
    print(f"minillm demo: default model from {path} (naive generator: the whole sequence recomputed per token)\n")
    for i, opening in enumerate(OPENINGS):
        prompt = tokenizer.encode(opening)
        detok = IncrementalDetokenizer(tokenizer, prompt)
        print(opening, end="", flush=True)
        start, n = time.perf_counter(), 0
        for n, token in enumerate(generate_naive(model, prompt, 200, temperature=0.8, top_p=0.95, seed=i,
                                                 eos_token_ids=[tokenizer.eos_token_id]), 1):
            print(detok.add(token), end="", flush=True)
        print(f"\n  [{n} tokens, {n / (time.perf_counter() - start):.1f} tokens/s]\n")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
