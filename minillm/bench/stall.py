"""The stall probe (chapter 06): requests are decoding when a long prompt arrives. How long does each running
request then wait between two of its tokens? With separate steps the prompt's prefill chunks are steps in which
no running request gets a token; with mixed steps every step carries their decode tokens too."""

import random
import time
from statistics import median

from minillm.bench.workloads import token_pool
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams


def stall_probe(
    llm: LLMEngine,
    num_running: int = 32,
    prompt_len: int = 900,
    running_len: int = 32,
    max_tokens: int = 256,
    seed: int = 0,
) -> dict:
    """Start num_running requests (random prompts of running_len tokens, greedy, no EOS, max_tokens each: few
    enough that the cache admits the long prompt beside them), let them decode, then add one prompt of prompt_len
    tokens and step until its first token and a few steps more. Returns each step
    (seconds, tokens, how many running requests got a token), the step at which the prompt arrived, and per
    running request its gaps between tokens from just before the arrival to the end."""
    rng, pool = random.Random(seed), token_pool(llm.vocab_size, set(llm.scheduler.eos_token_ids))
    prompt = lambda n: [rng.choice(pool) for _ in range(n)]
    decoding = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    running = [llm.add_request(prompt(running_len), decoding) for _ in range(num_running)]
    steps, token_times = [], {seq.seq_id: [] for seq in running}

    def step() -> None:
        start = time.perf_counter()
        updated, num_tokens = llm.step()
        now = time.perf_counter()
        got = [seq for seq in updated if seq.seq_id in token_times]
        for seq in got:
            token_times[seq.seq_id].append(now)
        steps.append(dict(seconds=now - start, tokens=num_tokens, running_with_token=len(got)))

    while any(seq.first_token_time is None for seq in running):
        step()
    for _ in range(4):
        step()
    arrival = len(steps)
    window = {i: len(t) - 1 for i, t in token_times.items()}  # from each request's last token before the arrival
    arriving = llm.add_request(prompt(prompt_len), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while not arriving.is_finished:
        step()
    for _ in range(4):
        step()
    if any(seq.is_finished for seq in running):
        raise ValueError(f"a running request finished during the probe: raise max_tokens (now {max_tokens})")
    for seq in running:
        llm.abort_request(seq)
    gaps = {i: [b - a for a, b in zip(t[window[i] :], t[window[i] + 1 :])] for i, t in token_times.items()}
    return dict(steps=steps, arrival=arrival, gaps=gaps)


def summarize(probe: dict) -> dict:
    """The probe's verdicts: steps after the arrival in which no running request got a token, and over the
    running requests the worst ratio of a request's longest gap to its median gap."""
    after = probe["steps"][probe["arrival"] :]
    ratios = [max(g) / median(g) for g in probe["gaps"].values()]
    return dict(
        steps_without_token=sum(s["running_with_token"] == 0 for s in after),
        steps_until_first_token=len(after) - 4,
        worst_gap_over_median=max(ratios),
        median_gap_ms=1000 * median(x for g in probe["gaps"].values() for x in g),
        worst_gap_ms=1000 * max(max(g) for g in probe["gaps"].values()),
    )
