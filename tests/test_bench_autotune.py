"""python -m minillm.bench autotune: the search space, the score of a trial, the pick of the best, the frontier, the
search loop (on a made-up measurement), and a tiny real search whose best configuration, run again as a plain
`bench serve`, meets its goal with no server left behind."""

import argparse
import math
import sys

import pytest
from test_bench_serve import servers_alive  # tests/ is on sys.path

from minillm.bench import autotune, main, servers
from minillm.bench import serve as bench_serve
from minillm.bench.arguments import one_of, positive_int, value_list
from minillm.bench.autotune_search import (
    best_trial,
    changed,
    pareto_front,
    search,
    search_space,
    slo_attainment,
)
from minillm.bench.serve_arguments import TUNABLE_FLAGS

DEFAULTS = {dest: flag.default for dest, flag in TUNABLE_FLAGS.items()}


def test_a_search_list_is_read_checked_and_keeps_the_servers_default():
    assert value_list(positive_int)("32, 8,32") == [32, 8]
    assert value_list(one_of(["fcfs", "priority"]))("priority") == ["priority"]
    for parse, text in [(positive_int, "8,0"), (positive_int, ","), (one_of(["fcfs"]), "lifo")]:
        with pytest.raises(argparse.ArgumentTypeError):
            value_list(parse)(text)
    space = search_space({"max_num_seqs": [8, 32], "block_size": [32, 16], "scheduling_policy": ["fcfs"]})
    assert space == {"max_num_seqs": [256, 8, 32], "block_size": [16, 32], "scheduling_policy": ["fcfs"]}
    assert changed(DEFAULTS) == {} and changed(DEFAULTS | {"block_size": 32}) == {"block_size": 32}
    args = autotune.parse_args(["--goodput", "ttft:500", "--max-num-seqs", "4,8", "--data-parallel-size", "1,2"])
    assert (args.max_num_seqs, args.data_parallel_size, args.block_size) == ([4, 8], [1, 2], [8, 16, 32])
    for wrong in (["--goodput", "ttft:500", "--slo-attainment", "1.5"], ["--goodput", "ttft:500", "--block-size", "0"]):
        with pytest.raises(SystemExit):
            autotune.parse_args(wrong)
    with pytest.raises(SystemExit):
        autotune.parse_args([])  # the goal is required


def test_every_trial_is_the_bench_serve_run_of_the_same_workload():
    argv = ["--goodput", "ttft:500", "e2el:3000", "--dataset", "mixed", "--input-range", "4:9", "--num-prompts", "5"]
    argv += ["--request-rate", "2.5", "--seed", "3", "--max-concurrency", "2", "--enforce-eager", "--trials", "4"]
    args = autotune.parse_args(argv)
    assert args.serve_argv[:2] == ["--launch", "minillm"] and "--trials" not in args.serve_argv
    trial = bench_serve.parse_args([*args.serve_argv, "--max-num-seqs", "8"])
    for dest in ("dataset", "input_range", "output_range", "num_prompts", "request_rates", "seed", "burstiness"):
        assert getattr(trial, dest) == getattr(args, dest), dest
    assert (trial.max_concurrency, trial.enforce_eager, trial.goodput) == (2, True, [("ttft", 500), ("e2el", 3000)])
    assert (trial.max_num_seqs, trial.block_size, trial.data_parallel_size) == (8, None, None)  # the server's own
    assert servers.engine_flags(dict(max_num_seqs=8, enforce_eager=True, x=False)) == [
        "--max-num-seqs",
        "8",
        "--enforce-eager",
    ]


def scored(number: int, goodput: float, throughput: float, share: float, target: float = 0.9) -> dict:
    result = dict(request_goodput=goodput, elapsed_time=2.0, requests_per_second=throughput)
    return dict(number=number, goodput=goodput, result=result, slo_attainment=share, meets_goal=share >= target)


def test_the_best_trial_meets_the_goal_with_the_highest_goodput():
    assert slo_attainment(dict(request_goodput=3.0, elapsed_time=2.0), 8) == 0.75 and slo_attainment(None, 8) == 0
    trials = [scored(0, 4.0, 4.0, 1.0), scored(1, 9.0, 12.0, 0.75), scored(2, 6.0, 6.5, 0.92), scored(3, 6.0, 7.0, 0.9)]
    assert best_trial(trials) == 3  # 1 has more goodput but misses the goal; 3 ties 2 and serves more
    assert best_trial([scored(0, 5.0, 5.0, 1.0), scored(1, 5.0, 5.0, 1.0)]) == 0  # a tie goes to the defaults
    assert best_trial([scored(0, 1.0, 9.0, 0.2)]) is None


def test_the_frontier_is_the_points_no_other_beats_on_latency_and_throughput():
    points = [(100, 5.0), (50, 3.0), (200, 9.0), (150, 4.0), (50, 2.0), (300, 9.0)]
    assert pareto_front(points) == [1, 0, 2]
    assert pareto_front([(10, 1.0)]) == [0] and pareto_front([]) == []


def test_search_runs_the_defaults_first_then_distinct_configurations_the_same_for_a_seed():
    space = search_space({"max_num_seqs": [8, 32, 64], "block_size": [8, 32], "scheduling_policy": ["fcfs"]})

    def run(number, params):  # a made-up measurement: smaller batches and blocks serve better here
        goodput = 100 / params["max_num_seqs"] + 8 / params["block_size"]
        return dict(number=number, params=params, goodput=goodput, slo_attainment=1.0, meets_goal=goodput > 1)

    first = search(space, run, trials=6, budget_s=None, seed=7)
    assert first[0]["params"] == {"max_num_seqs": 256, "block_size": 16, "scheduling_policy": "fcfs"}
    assert [t["number"] for t in first] == list(range(6))
    assert len({tuple(t["params"].values()) for t in first}) == 6
    assert [t["params"] for t in search(space, run, trials=6, budget_s=None, seed=7)] == [t["params"] for t in first]
    assert len(search(space, run, trials=50, budget_s=None, seed=1)) == 12  # all of the space, each once
    assert len(search(space, run, trials=50, budget_s=1e-9, seed=1)) == 1  # the budget: trial 0 only

    def interrupted(number, params):
        if number == 2:
            raise KeyboardInterrupt
        return run(number, params)

    assert len(search(space, interrupted, trials=6, budget_s=None, seed=7)) == 2  # Ctrl-C: the trials so far


def test_a_configuration_whose_server_fails_is_a_trial_that_missed_the_goal(monkeypatch, tmp_path):
    failing = [sys.executable, "-c", "import sys; print('kvcache_block_size must be a power of two'); sys.exit(1)"]
    monkeypatch.setattr(servers, "command", lambda *args: failing)
    record = main(
        ["autotune", "--goodput", "ttft:1000", "--num-prompts", "2", "--input-len", "4", "--output-len", "2"]
        + ["--trials", "1", "--result-json", str(tmp_path / "r.json")]
    )
    (trial,) = record["trials"]
    assert (trial["goodput"], trial["meets_goal"], trial["result"]) == (0.0, False, None)
    assert "power of two" in trial["failed"] and record["best"] is None and record["bench_serve_command"] is None
    assert not (tmp_path / "r.png").exists() and not servers_alive()


@pytest.mark.slow
def test_a_tiny_search_finds_a_configuration_that_meets_its_goal_again(tmp_path, capsys):
    """Two trials on the default model (the defaults, then one other), eight short requests at once, a generous goal;
    then the best, run as the plain `bench serve` command the search printed, meets it too."""
    workload = ["--num-prompts", "8", "--input-len", "16", "--output-len", "8", "--enforce-eager", "--seed", "1"]
    record = main(
        ["autotune", "--goodput", "ttft:20000", "tpot:2000", *workload, "--trials", "2", "--max-num-seqs", "4"]
        + ["--max-num-batched-tokens", "64", "--long-prefill-token-threshold", "0", "--block-size", "16"]
        + ["--result-json", str(tmp_path / "at.json"), "--budget-s", "300"]
    )
    out = capsys.readouterr().out
    trials = record["trials"]
    assert len(trials) == 2 and trials[0]["flags"] == [] and trials[1]["flags"]
    assert all(t["result"]["completed"] == 8 and t["meets_goal"] for t in trials)
    assert record["search_space"]["max_num_seqs"] == [256, 4] and record["goal"]["slo_attainment"] == 0.9
    assert record["machine"]["cpu"] and record["versions"]["optuna"] and "git_commit" in record
    best = trials[record["best"]]
    assert best["command"][:3] == ["python", "-m", "minillm.serve"] and "--enforce-eager" in best["command"]
    assert record["best_over_defaults"] == pytest.approx(best["goodput"] / trials[0]["goodput"])
    assert "serve it:      python -m minillm.serve" in out and "trial 0 the server's defaults" in out
    assert (tmp_path / "at.png").stat().st_size > 10_000
    assert record["bench_serve_command"][:4] == ["python", "-m", "minillm.bench", "serve"]

    again = main([*record["bench_serve_command"][3:], "--result-json", str(tmp_path / "again.json")])
    (r,) = again["servers"]["minillm"]["results"]
    assert slo_attainment(r, 8) >= 0.9 and r["completed"] == 8 and not math.isnan(r["p99_ttft_ms"])
    flags = best["command"][3:]  # the server ran again with exactly the configuration the search measured
    assert again["servers"]["minillm"]["command"][-len(flags) :] == flags
    assert not servers_alive()
