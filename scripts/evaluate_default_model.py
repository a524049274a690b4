#!/usr/bin/env python
"""Measure a story model the way the model card does: sentence validity and the share of stories that keep their cast.

python scripts/evaluate_default_model.py                  # the shipped default model
python scripts/evaluate_default_model.py --model DIR --show 3
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import minillm  # noqa: E402
from minillm.data.checker import is_valid_sentence, split_sentences  # noqa: E402
from minillm.data.quality import evaluate_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--model", type=Path, default=minillm.default_model_path())
    p.add_argument("--n", type=int, default=200, help="stories to sample")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--greedy", type=int, default=20, help="openings to continue greedily")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p of the stories whose cast is checked")
    p.add_argument("--show", type=int, default=2, help="sampled stories to print")
    args = p.parse_args()
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True).eval()
    q = evaluate_model(model, tok, args.n, args.temperature, args.seed, args.greedy, args.top_p)
    for prompt, text in list(zip(q["prompts"], q["sampled"]))[: args.show]:
        print(f"[{prompt}]{text}\n")
    for kind in ("sampled", "greedy"):
        bad = [s for t in q[kind] for s in split_sentences(t) if not is_valid_sentence(s)]
        if bad:
            print(f"some rejected {kind} sentences:", *bad[:10], sep="\n  ")
    print(f"sampled (T={args.temperature}): {q['valid']}/{q['total']} sentences valid = {100 * q['validity']:.1f}%")
    print(f"greedy: {q['greedy_valid']}/{q['greedy_total']} sentences valid = {100 * q['greedy_validity']:.1f}%")
    drifted = [p + t for p, t, k in zip(q["prompts"], q["nucleus"], q["kept"]) if not k]
    if drifted:
        print("a story that loses its cast:", drifted[0], sep="\n  ")
    print(
        f"cast kept (T={args.temperature}, top-p {args.top_p}): {sum(q['kept'])}/{len(q['kept'])} stories = "
        f"{100 * q['cast_kept']:.1f}% (without top-p: {100 * q['cast_kept_unfiltered']:.1f}%)"
    )


if __name__ == "__main__":
    main()
