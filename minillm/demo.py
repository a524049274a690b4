"""`make demo`: the embedded default model tells stories, a batch at a time, through the full engine."""
import time

from minillm import LLM, SamplingParams, default_model_path

OPENINGS = [
    "Once upon a time, there was a little fox named Pip.",
    "One sunny morning, Mia went to the park.",
    "Tom had a red ball.",
    "In a small village, there lived a kind old owl.",
    "Lily and her dog Max walked to the lake.",
    "One day, a little bird could not find its nest.",
    "Ben wanted to build a big sand castle.",
    "The rain fell all day, and Sam was sad.",
]


def main() -> None:
    print(f"minillm demo: the default model from {default_model_path()}\n")
    llm = LLM()
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=200, seed=0)
    start = time.perf_counter()
    outputs = llm.generate(OPENINGS, params)
    elapsed = time.perf_counter() - start
    for opening, out in zip(OPENINGS, outputs):
        print(f"\n--- {opening}{out.text}\n    [{len(out.token_ids)} tokens, finished by {out.finish_reason}]")
    generated = sum(len(out.token_ids) for out in outputs)
    ttft = sum(out.first_token_time - out.arrival_time for out in outputs) / len(outputs)
    print(f"\n{len(outputs)} stories, {generated} tokens in {elapsed:.2f} s: {generated / elapsed:.0f} output tokens/s "
          f"(mean time to first token {ttft * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
