"""`make demo`: the embedded default model tells stories, a batch at a time, through the full engine; then a
short speedup ladder (python -m minillm.bench --ladder) leaves its plot and JSON record under results/."""

import time
from pathlib import Path

from minillm import LLM, SamplingParams, default_model_path
from minillm.bench import main as bench
from minillm.data import heldout_openings

# a few short requests: every rung of the ladder, compile included, in about a minute on a small CPU
LADDER = [
    "--ladder",
    "--workload",
    "mixed",
    "--num-prompts",
    "8",
    "--input-range",
    "16:64",
    "--output-range",
    "8:64",
    "--ladder-slow-prompts",
    "2",
]


def demo_requests(n: int = 8) -> tuple[list[str], list[SamplingParams]]:
    """The demo's stories: `n` beginnings the model never saw in training, each sampled as stories usually are."""
    openings = heldout_openings(n)
    return openings, [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=300, seed=i) for i in range(n)]


def main() -> None:
    print(f"minillm demo: the default model from {default_model_path()}\n")
    llm = LLM()
    openings, params = demo_requests()
    start = time.perf_counter()
    outputs = llm.generate(openings, params)
    elapsed = time.perf_counter() - start
    for opening, out in zip(openings, outputs):
        print(f"\n--- {opening}{out.text}\n    [{len(out.token_ids)} tokens, finished by {out.finish_reason}]")
    generated = sum(len(out.token_ids) for out in outputs)
    ttft = sum(out.first_token_time - out.arrival_time for out in outputs) / len(outputs)
    print(
        f"\n{len(outputs)} stories, {generated} tokens in {elapsed:.2f} s: {generated / elapsed:.0f} output tokens/s "
        f"(mean time to first token {ttft * 1000:.0f} ms)"
    )
    print(
        "\nThe speedup ladder, each technique of the course added in turn (a tiny workload; for a real one: "
        "make bench BENCH_ARGS=--ladder)\n"
    )
    bench([*LADDER, "--output-json", str(Path("results/ladder.json")), "--plot", str(Path("results/ladder.png"))])


if __name__ == "__main__":
    main()
