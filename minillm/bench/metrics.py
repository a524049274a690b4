"""Metrics with vLLM's names: throughput from token counts and wall time, latency from request timestamps.

TTFT (time to first token) = first_token_time - arrival_time: queueing plus prefill.
TPOT (time per output token) = (finish_time - first_token_time) / (n_out - 1): the decode pace a request sees.
E2EL (end-to-end latency) = finish_time - arrival_time: what a user waits for the whole answer.
"""

import numpy as np

from minillm.bench.workloads import Workload


def throughput(workload: Workload, elapsed: float) -> dict:
    """Requests/s, output tokens/s and total (prompt + output) tokens/s of a run that took elapsed seconds."""
    return dict(
        elapsed_time=elapsed,
        num_requests=len(workload),
        num_input_tokens=workload.num_input_tokens,
        num_output_tokens=workload.num_output_tokens,
        requests_per_second=len(workload) / elapsed,
        output_tokens_per_second=workload.num_output_tokens / elapsed,
        total_tokens_per_second=(workload.num_input_tokens + workload.num_output_tokens) / elapsed,
    )


def latency(times: list[tuple[float, float, float]], output_lens: list[int]) -> dict:
    """Mean, median and p99 of TTFT, TPOT and E2EL in milliseconds, from (arrival, first token, finish) per
    request. Requests of one output token have no TPOT."""
    ttft = [first - arrival for arrival, first, _ in times]
    tpot = [(finish - first) / (n - 1) for (_, first, finish), n in zip(times, output_lens) if n > 1]
    e2el = [finish - arrival for arrival, _, finish in times]
    return summary("ttft", ttft) | summary("tpot", tpot) | summary("e2el", e2el)


def summary(name: str, seconds: list[float]) -> dict:
    """mean_/median_/p99_<name>_ms; None when there is nothing to measure."""
    ms = np.array(seconds) * 1000
    stats = {"mean": np.mean, "median": np.median, "p99": lambda a: np.percentile(a, 99)}
    return {f"{stat}_{name}_ms": float(f(ms)) if len(ms) else None for stat, f in stats.items()}
