"""The command line of `python -m minillm.bench serve`, in the pieces `python -m minillm.bench autotune` shares: the
requests and their arrivals, the SLOs of goodput, the engine flags every server gets, and the ones a run may tune."""

import argparse
import math
from typing import Callable, NamedTuple

from minillm.bench.arguments import add_length_arguments, non_negative_int, one_of, positive_int, rate_list
from minillm.config import Config
from minillm.entrypoints import ENFORCE_EAGER_HELP

DATASETS = {"random": "fixed", "mixed": "mixed", "shared-prefix": "shared-prefix"}  # -> make_workload's kinds
SLO_METRICS = ("ttft", "tpot", "e2el")
SCHEDULING_POLICIES = ("fcfs", "priority")


def slo(text: str) -> tuple[str, float]:
    """--goodput's KEY:MS, e.g. ttft:500."""
    key, _, ms = text.partition(":")
    try:
        if key in SLO_METRICS and float(ms) > 0:
            return key, float(ms)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected {'|'.join(SLO_METRICS)}:MS with MS > 0, got {text!r}")


class Flag(NamedTuple):
    """An engine flag a run may set: its argparse type, the server's default (minillm's Config), its metavar, help."""

    parse: Callable
    default: int | str
    metavar: str
    help: str


# the engine flags `bench serve` passes on when given and `bench autotune` searches (argparse dests, vLLM's names)
TUNABLE_FLAGS = {
    "max_num_seqs": Flag(positive_int, Config.max_num_seqs, "N", "sequences in one batch"),
    "max_num_batched_tokens": Flag(
        positive_int, Config.max_num_batched_tokens, "N", "tokens in one step; longer prompts are prefilled in chunks"
    ),
    "long_prefill_token_threshold": Flag(
        non_negative_int,
        Config.long_prefill_token_threshold,
        "N",
        "at most this many tokens of one prompt a step (0: no cap)",
    ),
    "block_size": Flag(positive_int, Config.kvcache_block_size, "N", "tokens per KV-cache block, a power of two"),
    "scheduling_policy": Flag(
        one_of(SCHEDULING_POLICIES),
        Config.scheduling_policy,
        "fcfs|priority",
        "the waiting queue's order (this bench's requests all have the same priority)",
    ),
    "data_parallel_size": Flag(positive_int, 1, "N", "engine-core processes (replicas) behind the one server"),
}


def add_request_arguments(p: argparse.ArgumentParser, sweep: bool) -> list[argparse.Action]:
    """The requests and their arrivals, as `bench serve` and `bench autotune` take them: the model (its vocabulary
    gives the prompts' ids), the dataset and its lengths, the rate (sweep: or a list of rates), the burstiness and
    the concurrency. The options added (their actions)."""
    n = dict(type=positive_int, metavar="N")
    model = p.add_argument(
        "--model",
        metavar="DIR|ID",
        help="the checkpoint served (its vocabulary gives the prompts' ids); default: the embedded default model",
    )
    w = p.add_argument_group("workload (random token ids, ignore_eos: every request generates exactly its length)")
    workload = [
        w.add_argument(
            "--dataset",
            choices=list(DATASETS),
            default="random",
            help="random: --input-len/--output-len tokens; mixed: lengths drawn from --input-range/--output-range; "
            "shared-prefix: --prefix-len common tokens + --suffix-len own ones",
        ),
        w.add_argument("--num-prompts", **n, default=64),
        *add_length_arguments(w),
    ]
    a = p.add_argument_group("arrivals")
    rates = a.add_mutually_exclusive_group() if sweep else a
    arrivals = [
        rates.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    ]
    if sweep:
        rates.add_argument(
            "--request-rates", type=rate_list, metavar="LIST", help="a sweep, e.g. 1,2,4,inf: one run each"
        )
    arrivals += [
        a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier"),
        a.add_argument("--max-concurrency", **n, help="at most N requests in flight (default: no limit)"),
    ]
    return [model, *workload, *arrivals]


def add_engine_arguments(group) -> list[argparse.Action]:
    """The engine flags every launched server gets as given (the options added): the context, the KV cache's
    memory, eager steps."""
    n = dict(type=positive_int, metavar="N")
    return [
        group.add_argument("--max-model-len", **n, help="default: the model's max_position_embeddings"),
        group.add_argument(
            "--kv-cache-memory-bytes",
            **n,
            default=Config.kvcache_memory_bytes,
            help=f"the KV cache's memory (default {Config.kvcache_memory_bytes >> 20} MiB)",
        ),
        group.add_argument("--enforce-eager", action="store_true", help=f"minillm: {ENFORCE_EAGER_HELP}"),
    ]


def check_requests(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """add_request_arguments' values checked; the rates to run (request_rates) and make_workload's kind set."""
    if args.request_rate <= 0 or args.burstiness <= 0:
        p.error("--request-rate and --burstiness must be > 0")
    args.request_rates = getattr(args, "request_rates", None) or [args.request_rate]
    args.workload = DATASETS[args.dataset]
    return args
