"""python -m minillm.bench serve: online serving over HTTP, as `vllm bench serve` measures it.

Requests (random token ids, greedy, ignore_eos: each generates exactly its output length) are streamed from
/v1/completions at arrival times drawn at --request-rate (gamma gaps of shape --burstiness; 1 is Poisson), against
a running OpenAI-compatible server (--base-url) or against servers this command starts and stops itself
(--launch minillm,vllm: each in turn, on the same prompts and arrival times, with the same engine flags).
Reported as vLLM reports it: requests/s, goodput, output and total tokens/s, and TTFT, TPOT, ITL and E2EL.

python -m minillm.bench serve --launch minillm,vllm --model HuggingFaceTB/SmolLM2-135M-Instruct --request-rate 4
python -m minillm.bench serve --launch minillm --request-rates 1,2,4,8,inf --plot sweep.png  # past capacity
python -m minillm.bench serve --base-url http://127.0.0.1:8000 --num-prompts 32 --goodput ttft:500 tpot:50
"""

import argparse
import asyncio
import time
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

from minillm.bench import servers, vllm_peer, workloads
from minillm.bench.arguments import WARMUP_OUTPUT_LEN, WARMUP_PROMPTS, make_workload, names_from
from minillm.bench.endpoint_request_func import RequestFuncOutput, send_all, served_model
from minillm.bench.metrics import latency, summary, throughput
from minillm.bench.models import checkpoint, read_config, special_token_ids
from minillm.bench.report import git_state, machine, versions, write_json
from minillm.bench.serve_arguments import (
    TUNABLE_FLAGS,
    add_engine_arguments,
    add_request_arguments,
    check_requests,
    slo,
)
from minillm.bench.serve_report import plot_distributions, plot_sweep, rate_label, result_table
from minillm.bench.serving import poisson_arrivals
from minillm.bench.workloads import Workload
from minillm.config import Config


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", metavar="URL", help="an OpenAI-compatible server already running")
    target.add_argument(
        "--launch",
        type=names_from(servers.SERVERS, "server"),
        metavar="LIST",
        help="start each server of the list in turn (minillm, vllm) on a free 127.0.0.1 port, then stop it",
    )
    p.add_argument("--endpoint", choices=["completions"], default="completions", help="/v1/completions, token ids")
    add_request_arguments(p, sweep=True)
    p.add_argument("--goodput", type=slo, nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    e = p.add_argument_group(
        "engine flags for --launch, the same for every server (vLLM's names; default: minillm's, whose "
        "--max-num-seqs and --max-num-batched-tokens vLLM gets too)"
    )
    add_engine_arguments(e)
    for dest, flag in TUNABLE_FLAGS.items():
        e.add_argument(
            "--" + dest.replace("_", "-"),
            type=flag.parse,
            metavar=flag.metavar,
            help=f"{flag.help}; default {flag.default}",
        )
    e.add_argument("--vllm-venv", type=Path, metavar="DIR", help="default: $MINILLM_VLLM_VENV, else .venv-vllm")
    o = p.add_argument_group("output")
    o.add_argument("--result-json", type=Path, metavar="PATH", help="default: results/bench/serve-<...>.json")
    o.add_argument("--plot", type=Path, metavar="PATH", help="PNG: latency CDFs, or latency against rate (sweep)")
    return check_requests(p, p.parse_args(argv))


def tpot(out: RequestFuncOutput) -> float:
    """A request's time per output token after the first (vLLM's; 0 for a single token)."""
    return (out.latency - out.ttft) / (out.output_tokens - 1) if out.output_tokens > 1 else 0.0


def good(out: RequestFuncOutput, slos: dict[str, float]) -> bool:
    """vLLM's goodput rule: a successful request counts if it meets every SLO given (in ms)."""
    seconds = dict(ttft=out.ttft, tpot=tpot(out), e2el=out.latency)
    return out.success and all(seconds[key] * 1000 <= ms for key, ms in slos.items())


def result(workload: Workload, outputs: list[RequestFuncOutput], duration: float, slos: dict | None) -> dict:
    """One run's numbers over its successful requests (throughput over the whole duration, latencies in ms as
    minillm.bench.metrics names them, goodput when SLOs are given) and the per-request data the plots read."""
    ok = [i for i, out in enumerate(outputs) if out.success]
    done = [outputs[i] for i in ok]
    lens = [out.output_tokens for out in done]
    served = Workload([workload.prompts[i] for i in ok], lens)
    times = [(out.start, out.start + out.ttft, out.start + out.latency) for out in done]
    return dict(
        completed=len(done),
        failed=len(outputs) - len(done),
        **throughput(served, duration),
        request_goodput=sum(good(out, slos) for out in outputs) / duration if slos else None,
        **latency(times, lens),
        **summary("itl", [gap for out in done for gap in out.itl]),
        ttfts=[out.ttft if out.success else None for out in outputs],
        itls=[out.itl for out in outputs],
        e2els=[out.latency if out.success else None for out in outputs],
        output_lens=[out.output_tokens for out in outputs],
        errors=[out.error for out in outputs],
    )


class Requests(NamedTuple):
    """What a run sends: each rate's requests (the same lengths, other prompts, so that no rate is served from an
    earlier one's cache), their arrival times, and the warm-up's requests (other prompts again, short outputs)."""

    rounds: list[Workload]
    arrivals: list[list[float]]
    warmup: Workload


def requests(args, path: Path) -> Requests:
    """The requests of add_request_arguments' options, on the vocabulary of the checkpoint at `path`."""
    pool = workloads.token_pool(read_config(path)["vocab_size"], special_token_ids(path))
    rounds = [make_workload(args, pool, args.seed, args.num_prompts, r) for r in range(len(args.request_rates))]
    arrivals = [poisson_arrivals(args.num_prompts, rate, args.seed, args.burstiness) for rate in args.request_rates]
    warmup = make_workload(args, pool, args.seed + 1, WARMUP_PROMPTS)
    warmup.output_lens = [min(n, WARMUP_OUTPUT_LEN) for n in warmup.output_lens]
    return Requests(rounds, arrivals, warmup)


def engine_settings(args, path: Path, load: Requests) -> dict:
    """The flags a launched server gets (vLLM's dest names): the context (default: the model's), the KV cache's
    memory, --enforce-eager, minillm's batch limits (vLLM's own defaults differ: like for like) and every other
    flag of TUNABLE_FLAGS given. SystemExit when a request does not fit the context."""
    given = {dest: getattr(args, dest) for dest in TUNABLE_FLAGS if getattr(args, dest) is not None}
    engine = dict(
        max_model_len=args.max_model_len or read_config(path).get("max_position_embeddings", 2048),
        max_num_seqs=Config.max_num_seqs,
        max_num_batched_tokens=Config.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        enforce_eager=args.enforce_eager,
    )
    if max(w.max_len for w in load.rounds) > engine["max_model_len"]:
        raise SystemExit(f"error: a request does not fit max_model_len {engine['max_model_len']}: shorten it")
    return engine | given


def run_server(base_url: str, rounds: list[Workload], arrivals: list[list[float]], warmup: Workload, args) -> list:
    """Warm the server up (untimed), then one run per rate: a result each."""
    model = served_model(base_url)
    asyncio.run(send_all(base_url, model, warmup.prompts, warmup.output_lens, [0.0] * len(warmup)))
    results = []
    for rate, workload, times in zip(args.request_rates, rounds, arrivals):
        outputs, duration = asyncio.run(
            send_all(base_url, model, workload.prompts, workload.output_lens, times, args.max_concurrency)
        )
        r = dict(request_rate=rate, **result(workload, outputs, duration, dict(args.goodput or [])))
        results.append(r)
        errors = next((f"; first error: {e}" for e in r["errors"] if e), "")
        print(
            f"  at {rate_label(rate)} req/s: {r['completed']} of {len(workload)} requests in {duration:.1f} s{errors}"
        )
    return results


def measure(name: str, args, path: Path, engine: dict, load: Requests, venv: Path | None = None) -> dict:
    """One server's runs: `name` launched with `engine`'s flags (--launch; else the server at --base-url), warmed
    up, then a run per rate. {"base_url", "command", "startup_seconds", "results"}, or {"failed": why} when it did
    not start or stopped answering: the other servers' results stand."""
    start = (
        servers.launch(
            name, args.model, path, engine, max(256, args.num_prompts), vllm_peer.default_threads(args), venv
        )
        if args.launch
        else nullcontext(dict(base_url=args.base_url.rstrip("/")))
    )
    try:
        with start as server:
            return dict(server, results=run_server(server["base_url"], *load, args))
    except RuntimeError as e:
        print(f"{name} failed: {e}")
        return dict(failed=str(e))


def main(argv: list[str]) -> dict:
    """Run the benchmark; print the result block, write the JSON record (and the plot); return the record."""
    args = parse_args(argv)
    with checkpoint(args.model, None, args.seed) as (path, model_name):
        load = requests(args, path)
        engine = engine_settings(args, path, load)
        venv, record = vllm_peer.venv_dir(args.vllm_venv), {}
        for name in args.launch or ["server"]:
            if name == "vllm" and (why := vllm_peer.unavailable(venv)):
                print(f"vllm skipped: {why}")
                record[name] = dict(unavailable=why)
                continue
            print(
                f"{name}: {args.num_prompts} requests per rate, rates {', '.join(map(rate_label, args.request_rates))}"
            )
            record[name] = measure(name, args, path, engine, load, venv)
    return report(args, record, engine, model_name)


def report(args, record: dict, engine: dict, model_name: str) -> dict:
    measured = {name: r["results"] for name, r in record.items() if "results" in r}
    if not measured:
        why = "; ".join(f"{name}: {r.get('failed') or r.get('unavailable')}" for name, r in record.items())
        raise SystemExit(f"error: no server was measured: {why}")
    title = f"{args.dataset} {args.num_prompts} requests, model {model_name}, burstiness {args.burstiness:g}"
    for i, rate in enumerate(args.request_rates):
        print("\n" + result_table(f"request rate {rate_label(rate)} req/s", {n: r[i] for n, r in measured.items()}))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    full = dict(
        created=stamp,
        machine=machine(),
        versions=versions(),
        **git_state(),
        config=vars(args) | {"engine": engine},
        model=model_name,
        request_rates=args.request_rates,
        servers=record,
    )
    path = args.result_json or Path("results/bench") / f"serve-{args.dataset}-{model_name}-{stamp}.json"
    write_json(full, path)
    print(f"\nrecord: {path}")
    if args.plot:
        if len(args.request_rates) > 1:
            plot_sweep(args.request_rates, measured, f"online serving against request rate: {title}", args.plot)
        else:
            rate = rate_label(args.request_rates[0])
            results = {n: r[0] for n, r in measured.items()}
            plot_distributions(results, f"online serving at {rate} req/s: {title}", args.plot)
        print(f"plot: {args.plot}")
    return full
