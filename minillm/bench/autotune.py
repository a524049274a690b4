"""python -m minillm.bench autotune: the server configuration with the highest goodput under a latency goal, as vLLM's
benchmarks/auto_tune searches for one.

Each trial is one `python -m minillm.bench serve --launch minillm` run with the trial's engine flags: a server on a
free 127.0.0.1 port, warmed up, sent the same requests at the same arrival times as every other trial, stopped. It
measures goodput (vLLM's: requests/s that met every SLO of --goodput) at that one offered load, and the SLO
attainment (the share of the requests that met them all); a configuration meets the goal when its attainment
reaches --slo-attainment. The best is the one that meets the goal with the highest goodput; trial 0 is always the
server's defaults, so that the gain over them is measured. optuna's TPE, seeded by --seed, picks the configurations
(max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold, block size, scheduling policy, replicas).

Why goodput at one load rather than vLLM's "highest request rate that meets the goal": vLLM's auto_tune runs each
configuration at rate inf, then at lower whole rates until p99 E2EL meets its bound, several runs a configuration.
Goodput at a fixed load weighs the same trade in one run (a configuration that would need a lower rate loses the
requests that miss their SLOs), so the time goes to more configurations. Set the load at or past the defaults'
capacity (the default, --request-rate inf, sends everything at once), or every configuration meets it and they tie.

Output: a table of the trials, the best configuration as a ready `python -m minillm.serve` command line and as the
`bench serve` run that measures it again, a JSON record (results/bench/autotune-<...>.json) and a PNG beside it:
every trial's request throughput against its p99 latencies, the throughput/latency frontier drawn. Ctrl-C after
the first trial ends the search there and reports the trials run.

python -m minillm.bench autotune --goodput ttft:2000 tpot:50 --trials 12
python -m minillm.bench autotune --goodput e2el:4000 --slo-attainment 0.99  # vLLM auto_tune's goal: p99 E2EL
python -m minillm.bench autotune --goodput ttft:1000 --dataset shared-prefix --request-rate 8 --max-num-seqs 16,64,256
python -m minillm.bench autotune --goodput ttft:1000 --data-parallel-size 1,2 --budget-s 1800  # replicas too
"""

import argparse
import time
from pathlib import Path

import optuna

from minillm.bench import serve, servers
from minillm.bench.arguments import command_line, positive_int, value_list
from minillm.bench.autotune_report import plot_frontier, trial_table
from minillm.bench.autotune_search import SEARCH_DEFAULTS, best_trial, changed, search, search_space, slo_attainment
from minillm.bench.models import checkpoint
from minillm.bench.report import git_state, machine, versions, write_json
from minillm.bench.serve import Requests
from minillm.bench.serve_arguments import (
    TUNABLE_FLAGS,
    add_engine_arguments,
    add_request_arguments,
    check_requests,
    slo,
)


def attainment(text: str) -> float:
    try:
        if 0 < float(text) <= 1:
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a share of the requests in (0, 1], e.g. 0.9, got {text!r}")


def seconds(text: str) -> float:
    try:
        if float(text) > 0:
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench autotune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shared = add_request_arguments(p, sweep=False)
    g = p.add_argument_group("the goal")
    shared.append(
        g.add_argument(
            "--goodput",
            type=slo,
            nargs="+",
            required=True,
            metavar="KEY:MS",
            help="the SLOs a request must meet to count, e.g. ttft:500 tpot:50 (KEY: ttft, tpot or e2el)",
        )
    )
    g.add_argument(
        "--slo-attainment",
        type=attainment,
        default=0.9,
        metavar="SHARE",
        help="a configuration meets the goal when this share of the requests met every SLO (default 0.9; 0.99 with "
        "e2el alone is vLLM auto_tune's p99 end-to-end goal)",
    )
    s = p.add_argument_group(
        "the search (optuna's TPE, seeded by --seed): comma-separated values per engine flag (vLLM's names), the "
        "server's default always among them"
    )
    for dest, flag in TUNABLE_FLAGS.items():
        s.add_argument(
            "--" + dest.replace("_", "-"),
            type=value_list(flag.parse),
            default=SEARCH_DEFAULTS[dest],
            metavar="LIST",
            help=f"{flag.help}; default {','.join(map(str, SEARCH_DEFAULTS[dest]))} (the server's {flag.default})",
        )
    s.add_argument(
        "--trials", type=positive_int, default=12, metavar="N", help="runs in all, trial 0 the defaults (default 12)"
    )
    s.add_argument(
        "--budget-s",
        type=seconds,
        metavar="S",
        help="start no trial that would end past S seconds, judged by the longest so far (default: no limit)",
    )
    shared += add_engine_arguments(p.add_argument_group("engine flags every trial gets"))
    o = p.add_argument_group("output")
    o.add_argument("--result-json", type=Path, metavar="PATH", help="default: results/bench/autotune-<...>.json")
    o.add_argument("--plot", type=Path, metavar="PATH", help="the frontier's PNG (default: beside the record)")
    args = check_requests(p, p.parse_args(argv))
    args.serve_argv = ["--launch", "minillm", *command_line(shared, args)]  # what every trial runs, flags aside
    return args


def serve_command(model: str | None, engine: dict) -> list[str]:
    """The server's command line with a trial's engine settings (no host, port or queue limit: ready to use)."""
    return ["python", "-m", "minillm.serve", *(["--model", model] if model else []), *servers.engine_flags(engine)]


def run_trial(number: int, params: dict, args, path: Path, load: Requests) -> dict:
    """One trial: `bench serve` with the flags of `params` that differ from the server's defaults, scored: its
    goodput, SLO attainment and whether it met the goal (a server that failed: none of its requests counted)."""
    flags = servers.engine_flags(changed(params))
    trial_args = serve.parse_args([*args.serve_argv, *flags])
    engine = serve.engine_settings(trial_args, path, load)
    print(f"\ntrial {number}: {' '.join(flags) or 'the defaults'}", flush=True)
    began = time.perf_counter()
    server = serve.measure("minillm", trial_args, path, engine, load)
    result = server["results"][0] if "results" in server else None
    share = slo_attainment(result, args.num_prompts)
    trial = dict(
        number=number,
        params=params,
        flags=flags,
        command=serve_command(args.model, engine),
        seconds=time.perf_counter() - began,
        startup_seconds=server.get("startup_seconds"),
        failed=server.get("failed"),
        goodput=result["request_goodput"] if result else 0.0,
        slo_attainment=share,
        meets_goal=share >= args.slo_attainment,
        result=result,
    )
    print(
        f"trial {number}: goodput {trial['goodput']:.2f} req/s, {share:.0%} of the requests met the SLOs: "
        + ("meets the goal" if trial["meets_goal"] else "misses the goal")
    )
    return trial


def main(argv: list[str]) -> dict:
    """Search; print the trials and the best configuration, write the JSON record and the plot; return the record."""
    args = parse_args(argv)
    space = search_space({dest: getattr(args, dest) for dest in TUNABLE_FLAGS})
    base = serve.parse_args(args.serve_argv)
    with checkpoint(args.model, None, args.seed) as (path, model_name):
        load = serve.requests(base, path)
        serve.engine_settings(base, path, load)  # the requests fit the context, checked before any server starts
        trials = search(
            space, lambda n, params: run_trial(n, params, args, path, load), args.trials, args.budget_s, args.seed
        )
    return report(args, space, trials, model_name)


def report(args, space: dict, trials: list[dict], model_name: str) -> dict:
    best = best_trial(trials)
    slos = dict(args.goodput)
    goal = " ".join(f"{k}:{ms:g}" for k, ms in slos.items()) + f" for {args.slo_attainment:.0%} of the requests"
    print("\n" + trial_table(trials, space, best))
    defaults = trials[0]["goodput"]
    gain = trials[best]["goodput"] / defaults if best is not None and defaults > 0 else None
    if best is None:
        print(
            f"\nno trial met the goal ({goal}): loosen --goodput or --slo-attainment, lower --request-rate or "
            "--num-prompts, or search other values"
        )
    else:
        b = trials[best]
        print(
            f"\nbest: trial {best}, goodput {b['goodput']:.2f} req/s against the defaults' {defaults:.2f}"
            + (f" ({gain:.2f}x)" if gain else "")
            + f", goal {goal}\nserve it:      {' '.join(b['command'])}"
            + f"\nmeasure again: python -m minillm.bench serve {' '.join([*args.serve_argv, *b['flags']])}"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = dict(
        created=stamp,
        machine=machine(),
        versions=versions() | {"optuna": optuna.__version__},
        **git_state(),
        config=vars(args),
        model=model_name,
        search_space=space,
        goal=dict(slos=slos, slo_attainment=args.slo_attainment),
        trials=trials,
        best=best,
        best_over_defaults=gain,
        bench_serve_command=None
        if best is None
        else ["python", "-m", "minillm.bench", "serve", *args.serve_argv, *trials[best]["flags"]],
    )
    path = args.result_json or Path("results/bench") / f"autotune-{args.dataset}-{model_name}-{stamp}.json"
    write_json(record, path)
    print(f"\nrecord: {path}")
    if any(t["result"] and t["result"]["completed"] for t in trials):
        plot = args.plot or path.with_suffix(".png")
        load = f"{args.dataset} {args.num_prompts} requests at {args.request_rate:g} req/s"
        plot_frontier(trials, slos, best, f"autotune: {load}, model {model_name}, goal {goal}", plot)
        print(f"plot: {plot}")
    return record
