"""Online serving, in the style of vLLM's benchmark_serving: requests arrive over time, not all at once.

Arrivals are a Poisson process of a given rate (exponential gaps, seeded); each request's latency counts from
its arrival, so time spent waiting for a busy engine shows in TTFT. minillm adds every request whose arrival
has come before each step (continuous batching lets it join the running batch); static batching waits for
the batch in flight to finish, then takes up to --static-batch-size arrived requests. Both sleep when idle
until the next arrival. Sweeping the rate shows where each one's latency starts to climb.
"""

import math
import time

import numpy as np

from minillm.bench.backends import Models, Run, greedy, progress
from minillm.bench.metrics import latency, throughput
from minillm.bench.workloads import Workload
from minillm.engine.llm_engine import LLMEngine
from minillm.naive import generate_static


def poisson_arrivals(num_requests: int, rate: float, seed: int = 0, burstiness: float = 1.0) -> list[float]:
    """Arrival times in seconds from the start, `rate` requests per second on average (vLLM's request_rate);
    rate=inf sends everything at 0. The gaps are gamma-distributed with shape `burstiness` and mean 1/rate, as
    vLLM's --burstiness: 1 is an exponential (a Poisson process), below 1 burstier, above 1 more regular."""
    if math.isinf(rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).gamma(burstiness, 1 / (rate * burstiness), num_requests)
    return np.cumsum(gaps).tolist()


def wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.perf_counter()))


def serve_minillm(engine: LLMEngine, workload: Workload, arrivals: list[float], bar=None) -> Run:
    """Continuous batching: before each step, add the requests that have arrived."""
    params, seqs, start = greedy(workload.output_lens), [], time.perf_counter()
    while len(seqs) < len(workload) or not engine.is_finished():
        while len(seqs) < len(workload) and start + arrivals[len(seqs)] <= time.perf_counter():
            seq = engine.add_request(workload.prompts[len(seqs)], params[len(seqs)])
            seq.arrival_time = start + arrivals[len(seqs)]  # it may have waited for the last step to end
            seqs.append(seq)
        if engine.is_finished():
            wait_until(start + arrivals[len(seqs)])
            continue
        finished = sum(seq.is_finished for seq in engine.step()[0])
        if bar is not None:
            bar.update(finished)
    return Run(
        max(seq.finish_time for seq in seqs) - start,
        [seq.completion_token_ids for seq in seqs],
        [(seq.arrival_time, seq.first_token_time, seq.finish_time) for seq in seqs],
    )


def serve_static(engine: LLMEngine, workload: Workload, arrivals: list[float], batch_size: int, bar=None) -> Run:
    """Static batching: when the engine is free, run the arrived requests (up to batch_size) to completion."""
    params, seqs, start = greedy(workload.output_lens), [], time.perf_counter()
    while len(seqs) < len(workload):
        wait_until(start + arrivals[len(seqs)])
        i, now = len(seqs), time.perf_counter()
        j = i + 1
        while j < min(len(workload), i + batch_size) and start + arrivals[j] <= now:
            j += 1
        batch = generate_static(engine, workload.prompts[i:j], params[i:j], batch_size)
        for k, seq in enumerate(batch, i):
            seq.arrival_time = start + arrivals[k]
        seqs += batch
        if bar is not None:
            bar.update(len(batch))
    return Run(
        max(seq.finish_time for seq in seqs) - start,
        [seq.completion_token_ids for seq in seqs],
        [(seq.arrival_time, seq.first_token_time, seq.finish_time) for seq in seqs],
    )


def run(path, engine_options: dict, workload: Workload, warmup: Workload, args) -> dict:
    """Both backends at every rate of --serve-rates on the same prompts and arrivals; per backend, one result
    (throughput and latency) per rate. The engine runs without prefix caching: the sweep sends the same prompts
    at every rate, and a cache would serve later rates from earlier ones."""
    engine = Models(path, engine_options | {"enable_prefix_caching": False}).engine
    batch_size = args.static_batch_size or engine.config.max_num_seqs
    engine.generate(warmup.prompts, greedy(warmup.output_lens), use_tqdm=False)
    generate_static(engine, warmup.prompts, greedy(warmup.output_lens), batch_size)
    backends = {
        "minillm": lambda arrivals, bar: serve_minillm(engine, workload, arrivals, bar),
        "minillm-static": lambda arrivals, bar: serve_static(engine, workload, arrivals, batch_size, bar),
    }
    results = {name: [] for name in backends}
    for rate in args.serve_rates:
        arrivals = poisson_arrivals(len(workload), rate, args.seed)
        for name, serve in backends.items():
            with progress(len(workload), f"{name} at {rate} req/s", "req") as bar:
                r = serve(arrivals, bar)
            results[name].append(
                dict(request_rate=rate, **throughput(workload, r.elapsed), **latency(r.times, workload.output_lens))
            )
            print(f"{name} at {rate:g} req/s: median end-to-end latency {results[name][-1]['median_e2el_ms']:.0f} ms")
    return dict(serving=dict(request_rates=args.serve_rates, static_batch_size=batch_size, results=results))
