"""Soak test: thousands of random requests through one LLM, with aborts and interrupts mixed in.

    .venv/bin/python scripts/soak.py --requests 3000

Each round sends a random batch (random lengths, shared prefixes, sampling settings, priorities) and ends it one
of three ways: run to completion, a stream broken off early (its requests aborted), or a KeyboardInterrupt
raised inside a random step (the step rolled back, the call's requests aborted). After every round the engine
must have every KV block free and nothing queued. The report says how many requests completed, were aborted
or interrupted, and the resident memory and free blocks at the start and the end.
"""

import argparse
import random
import resource
import time

import torch

from minillm import LLM, SamplingParams


def rss_mib() -> float:
    """Resident memory of this process now, from /proc (MiB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def random_batch(rng: random.Random, vocab: int, prefix: list[int]) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts, params = [], []
    for _ in range(rng.randint(1, 24)):
        own = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 120))]
        prompts.append(prefix + own if rng.random() < 0.3 else own)
        params.append(
            SamplingParams(
                temperature=rng.choice([0, 0.7, 1.0]),
                top_k=rng.choice([0, 20]),
                top_p=rng.choice([1.0, 0.9]),
                max_tokens=rng.randint(1, 80),
                seed=rng.choice([None, rng.randrange(1000)]),
                ignore_eos=rng.random() < 0.5,
            )
        )
    return prompts, params


def interrupt_at(llm: LLM, step: int):
    """Make the engine's step number `step` (counting from 1) raise KeyboardInterrupt; returns the undo."""
    real, calls = llm.model_runner.run, [0]

    def run(*args, **kwargs):
        calls[0] += 1
        if calls[0] == step:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    llm.model_runner.run = run
    return lambda: vars(llm.model_runner).pop("run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-kvcache-blocks", type=int, default=96, help="small, so that requests get preempted")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    llm = LLM(num_kvcache_blocks=args.num_kvcache_blocks, max_num_seqs=16, max_num_batched_tokens=256)
    total = llm.block_manager.num_free_blocks
    prefix = [rng.randrange(3, llm.vocab_size) for _ in range(48)]
    counts = dict(completed=0, aborted=0, interrupted=0)
    llm.generate(*random_batch(rng, llm.vocab_size, prefix), use_tqdm=False)  # warm-up: first-use allocations
    start_rss, start = rss_mib(), time.perf_counter()
    sent = 0
    while sent < args.requests:
        prompts, params = random_batch(rng, llm.vocab_size, prefix)
        sent += len(prompts)
        how = rng.choices(["complete", "break", "interrupt"], weights=[6, 2, 2])[0]
        if how == "complete":
            outputs = llm.generate(prompts, params, use_tqdm=False)
            assert all(len(o.token_ids) >= 1 for o in outputs)
            counts["completed"] += len(outputs)
        elif how == "break":
            stream, stop_after = llm.stream(prompts, params), rng.randint(1, 20)
            for i, _ in enumerate(stream):
                if i == stop_after:
                    break
            stream.close()
            counts["aborted"] += len(prompts)
        else:
            undo = interrupt_at(llm, rng.randint(1, 10))
            try:
                llm.generate(prompts, params, use_tqdm=False)
                counts["completed"] += len(prompts)  # finished before the chosen step came
            except KeyboardInterrupt:
                counts["interrupted"] += len(prompts)
            finally:
                undo()
        assert llm.is_finished(), "a request was left queued"
        assert llm.block_manager.num_free_blocks == total, "a KV block leaked"
        if sent // 500 != (sent - len(prompts)) // 500:
            print(f"{sent} requests, {rss_mib():.0f} MiB, {time.perf_counter() - start:.0f} s", flush=True)
    end_rss = rss_mib()
    print(
        f"requests sent {sent}: completed {counts['completed']}, aborted by a broken stream {counts['aborted']}, "
        f"interrupted {counts['interrupted']} (accounted for: {sum(counts.values()) == sent})"
    )
    print(
        f"resident memory {start_rss:.0f} MiB at start, {end_rss:.0f} MiB at the end "
        f"({(end_rss - start_rss) / start_rss:+.1%}); free KV blocks {total} of {total} at start, "
        f"{llm.block_manager.num_free_blocks} of {total} at the end; {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
