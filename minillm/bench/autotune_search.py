"""The search of `python -m minillm.bench autotune`: which server configurations to run, which one won.

A configuration gives each of the server's TUNABLE_FLAGS one value. optuna's TPE sampler picks them: after trial 0,
always the server's defaults (so that the best is reported against them), half the trials (2 to 10) at random,
the rest near the configurations with the highest goodput so far among those that met the goal (optuna's
constrained TPE). The seed fixes the random ones; the later ones follow the measurements, so a rerun proposes them
again where it measures the same order. A configuration proposed again is not run again: its first result stands.
"""

import math
import time
from typing import Callable

import optuna

from minillm.bench.serve_arguments import TUNABLE_FLAGS

# the values tried per flag when the command line names none: batch limits around minillm's defaults (256 sequences,
# 4096 tokens a step), the prefill cap off or at two sizes, three block sizes; one policy (this bench's requests all
# have the same priority, so priority would order them as fcfs) and one replica (--data-parallel-size 1,2 adds a second)
SEARCH_DEFAULTS = dict(
    max_num_seqs=[8, 16, 32, 64, 128, 256],
    max_num_batched_tokens=[256, 512, 1024, 2048, 4096],
    long_prefill_token_threshold=[0, 32, 128],
    block_size=[8, 16, 32],
    scheduling_policy=["fcfs"],
    data_parallel_size=[1],
)
MAX_ASKS_PER_TRIAL = 20  # proposals of configurations already run, per new one, before the search gives up


def search_space(values: dict[str, list]) -> dict[str, list]:
    """Each flag's values to try, the server's default first (added where missing): trial 0 is a point of the
    search, so the sampler learns from it too."""
    return {dest: list(dict.fromkeys([TUNABLE_FLAGS[dest].default, *v])) for dest, v in values.items()}


def space_size(space: dict[str, list]) -> int:
    return math.prod(len(values) for values in space.values())


def changed(params: dict) -> dict:
    """The flags of a configuration that differ from the server's defaults (in TUNABLE_FLAGS' order): what its
    command line must say."""
    return {
        dest: params[dest] for dest, flag in TUNABLE_FLAGS.items() if params.get(dest, flag.default) != flag.default
    }


def slo_attainment(result: dict | None, num_requests: int) -> float:
    """The share of the requests sent that met every SLO (goodput x duration / requests); 0 for a failed trial."""
    if result is None:
        return 0.0
    return result["request_goodput"] * result["elapsed_time"] / num_requests


def best_trial(trials: list[dict]) -> int | None:
    """The number of the trial that met the goal with the highest goodput (ties: the higher request throughput,
    then the earlier trial, so the defaults win a tie); None when no trial met it."""
    met = [t for t in trials if t["meets_goal"]]
    if not met:
        return None
    return max(met, key=lambda t: (t["goodput"], t["result"]["requests_per_second"], -t["number"]))["number"]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """The indices of the (latency, throughput) points no other point beats on both (lower latency, higher
    throughput), by increasing latency: the throughput/latency frontier."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, highest = [], float("-inf")
    for i in order:
        if points[i][1] > highest:
            front.append(i)
            highest = points[i][1]
    return front


def search(
    space: dict[str, list], run: Callable[[int, dict], dict], trials: int, budget_s: float | None, seed: int
) -> list[dict]:
    """Up to `trials` configurations of `space`, each run once by run(number, params) -> a trial dict with "goodput",
    "slo_attainment" and "meets_goal"; trial 0 the defaults. A new trial starts only while the one that took longest so far still
    fits in budget_s (None: no limit); Ctrl-C during a trial after the first ends the search there. The trials
    run, in order."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, trials // 2)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({dest: TUNABLE_FLAGS[dest].default for dest in space})  # trial 0: the server's defaults
    distributions = {dest: optuna.distributions.CategoricalDistribution(values) for dest, values in space.items()}
    done, start, longest, asks = {}, time.perf_counter(), 0.0, 0
    while len(done) < min(trials, space_size(space)):
        if done and budget_s is not None and time.perf_counter() - start + longest > budget_s:
            print(f"the time budget ({budget_s:g} s) leaves no room for another trial: {len(done)} run")
            break
        if asks >= MAX_ASKS_PER_TRIAL * (len(done) + 1):
            print(f"the sampler keeps proposing configurations already run: {len(done)} run")
            break
        asks += 1
        proposal = study.ask(distributions)
        key = tuple(proposal.params[dest] for dest in space)
        if key not in done:
            began = time.perf_counter()
            try:
                done[key] = run(len(done), proposal.params)
            except KeyboardInterrupt:  # Ctrl-C: the trials run so far are the search's result
                if not done:
                    raise
                print(f"\ninterrupted: {len(done)} trials run")
                break
            longest = max(longest, time.perf_counter() - began)
        trial = done[key]  # the constraint: > 0 when the goal was missed, the more so the fewer requests met it
        proposal.set_constraint("goal", 0.0 if trial["meets_goal"] else 1.0 - trial["slo_attainment"])
        study.tell(proposal, trial["goodput"])
    return list(done.values())
