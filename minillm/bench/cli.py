"""python -m minillm.bench: every backend on the same prompts and model, side by side in one process.

python -m minillm.bench --workload mixed --num-prompts 128
python -m minillm.bench --workload mixed --peer vllm  # and vLLM's CPU build (make peers-vllm) on the same weights
python -m minillm.bench --model HuggingFaceTB/SmolLM2-135M-Instruct --workload mixed  # a real checkpoint
python -m minillm.bench --random-size 100m --num-prompts 64 --backends minillm,hf-generate
python -m minillm.bench --ladder                      # naive loop -> ... -> compiled: the speedup ladder
python -m minillm.bench --serve-rates 2,4,8,16,inf    # Poisson arrivals: latency against request rate
python -m minillm.bench --roofline --random-size 100m # decode against measured bandwidth and FLOP/s
python -m minillm.bench --roofline --random-size 100m --peer llama-cpp  # and llama.cpp at batch 1
python -m minillm.bench --sizes tiny,25m,100m --backends minillm,hf-generate  # cost against size
python -m minillm.bench serve --launch minillm,vllm   # online over HTTP, both servers (python -m minillm.bench serve -h)
python -m minillm.bench spec --workload rewrite --model ID   # speculative decoding against none, by batch size
python -m minillm.bench quant --random-size 100m --peer llama-cpp  # fp32, int8, GGUF blocks: decode and quality
python -m minillm.bench autotune --goodput ttft:2000 tpot:50  # the server flags with the best goodput (autotune -h)
python -m minillm.bench structured --model ID             # guided JSON: valid share and throughput against unguided
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from minillm.bench import ladder, roofline, serving, vllm_peer, workloads
from minillm.bench.arguments import (
    WARMUP_OUTPUT_LEN,
    WARMUP_PROMPTS,
    add_length_arguments,
    make_workload,
    names_from,
    positive_int,
    rate_list,
)
from minillm.bench.backends import Models, Run, run_compiled, run_compiled_layers, run_eager, run_minillm, run_static
from minillm.bench.hf import AUTO_BATCH_SIZES, run_hf_generate, run_hf_generate_batch
from minillm.bench.memory import describe as describe_memory
from minillm.bench.metrics import latency, throughput
from minillm.bench.models import RANDOM_SIZES, checkpoint, num_parameters, read_config, special_token_ids
from minillm.bench.report import (
    breakdown_table,
    git_state,
    ladder_table,
    machine,
    plot,
    plot_ladder,
    plot_serving,
    plot_sizes,
    results_table,
    serving_table,
    versions,
    write_json,
)
from minillm.bench.workloads import Workload
from minillm.config import KV_CACHE_DTYPES, QUANTIZATION_METHODS, Config, ModelConfig, resolve_dtype
from minillm.engine.kv_cache import kv_cache_bytes_per_token

# name -> run(models, workload, warmup, args) -> Run; they run in this order, minillm first
BACKENDS = {
    "minillm": run_minillm,
    "minillm-compiled": run_compiled,
    "minillm-compiled-layers": run_compiled_layers,
    "minillm-eager": run_eager,
    "minillm-static": run_static,
    "hf-generate": run_hf_generate,
    "hf-generate-batch": run_hf_generate_batch,
}
PEERS = ["llama-cpp", "vllm"]  # --peer: other engines, outside this process's libraries
VARIANTS = ("minillm-compiled", "minillm-compiled-layers", "minillm-eager")  # the engine with other settings
DEFAULT_BACKENDS = [name for name in BACKENDS if name not in VARIANTS]


def hf_batch_size(text: str) -> str | int:
    return text if text == "auto" else positive_int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    n = dict(type=positive_int, metavar="N")
    p.add_argument(
        "--backends",
        type=names_from(BACKENDS, "backend"),
        metavar="LIST",
        default=DEFAULT_BACKENDS,
        help=f"comma-separated, from {', '.join(BACKENDS)} (default: all but the engine variants "
        f"{', '.join(VARIANTS)}: compiled decode steps per bucket and compiled layers, "
        "compiled layers only, all eager)",
    )
    w = p.add_argument_group("workload (random token ids, ignore_eos: every request generates exactly its length)")
    w.add_argument("--workload", choices=["fixed", "mixed", "shared-prefix"], default="fixed")
    w.add_argument("--num-prompts", **n, default=64)
    add_length_arguments(w)
    m = p.add_argument_group("model (default: the embedded default model)").add_mutually_exclusive_group()
    m.add_argument(
        "--model",
        metavar="DIR|ID",
        help="a Hugging Face checkpoint directory, a .gguf file, or a hub id minillm "
        "obtains offline (python -m minillm.models list), e.g. HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    m.add_argument("--random-size", choices=list(RANDOM_SIZES), help="a random-weight Qwen3, made for this run")
    e = p.add_argument_group("backends (engine options default to minillm's Config)")
    e.add_argument("--max-num-seqs", **n)
    e.add_argument("--max-num-batched-tokens", **n)
    e.add_argument("--kvcache-block-size", **n)
    e.add_argument("--static-batch-size", **n, help="minillm-static (default: max_num_seqs)")
    e.add_argument(
        "--quantization",
        choices=QUANTIZATION_METHODS,
        help="minillm's weights: int8 (quantized at load) or gguf (a .gguf --model, or a hub id that ships as one, "
        "in its blocks); default: the checkpoint's floats",
    )
    e.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, help="minillm's KV cache: auto (default) or int8")
    e.add_argument(
        "--hf-batch-size",
        type=hf_batch_size,
        metavar="N|auto",
        default="auto",
        help=f"hf-generate: N, or auto = the fastest of {', '.join(map(str, AUTO_BATCH_SIZES))} "
        "(capped at the number of prompts)",
    )
    e.add_argument(
        "--repeats",
        **n,
        default=1,
        help="the comparison (and --roofline's decode rates): every backend "
        "this many times, each round on other prompts of the same lengths; the fastest round counts "
        "(default 1)",
    )
    e.add_argument("--device", default="cpu", help="cpu or cuda, for every backend (default: cpu)")
    e.add_argument("--threads", **n, help="torch.set_num_threads for all backends (default: torch's)")
    modes = p.add_argument_group("other benchmarks than the side-by-side comparison (one at a time)")
    mode = modes.add_mutually_exclusive_group()
    mode.add_argument(
        "--ladder",
        action="store_true",
        help="the speedup ladder: the workload through each rung of "
        f"--rungs ({', '.join(r.name for r in ladder.RUNGS)})",
    )
    mode.add_argument(
        "--serve-rates",
        type=rate_list,
        metavar="LIST",
        help="online serving: Poisson arrivals at each rate (requests/s, inf = all at once), "
        "minillm against static batching",
    )
    mode.add_argument(
        "--roofline",
        action="store_true",
        help="batch-1 decode against the measured memory "
        "bandwidth, batched decode against the measured matmul FLOP/s (--input-len, --output-len)",
    )
    mode.add_argument(
        "--sizes",
        type=names_from(list(RANDOM_SIZES)),
        metavar="LIST",
        help="the comparison on each random model size, e.g. tiny,25m,100m: cost against size",
    )
    modes.add_argument(
        "--rungs",
        type=names_from([r.name for r in ladder.RUNGS]),
        metavar="LIST",
        help="--ladder: the rungs to run (default: all that run on --device)",
    )
    modes.add_argument(
        "--ladder-slow-prompts",
        **n,
        default=4,
        help="--ladder: the one-request-at-a-time rungs run only this many first requests (default 4)",
    )
    modes.add_argument("--roofline-batch", **n, default=64, help="--roofline: the batched decode's batch (default 64)")
    modes.add_argument(
        "--peer",
        choices=PEERS,
        help="llama-cpp, with --roofline: also llama.cpp (the peers extra) "
        "on the same weights, fp32 GGUF: batch-1 prompt and decode tokens/s against minillm's. vllm, "
        "with the comparison (or --sizes): also vLLM's CPU build on the same workload and weights, in "
        "a subprocess of its own environment (make peers-vllm; skipped when absent)",
    )
    modes.add_argument(
        "--vllm-venv",
        type=Path,
        metavar="DIR",
        help="--peer vllm: vLLM's virtual environment (default: $MINILLM_VLLM_VENV, else .venv-vllm in the repository)",
    )
    modes.add_argument(
        "--roofline-bytes",
        **n,
        help="--roofline: size of the array streamed to measure bandwidth (default 1 GiB or 4x the last-level "
        "cache, the larger)",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--output-json", type=Path, metavar="PATH", help="default: results/bench/<workload>-<model>-<timestamp>.json"
    )
    o.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="a PNG chart: output tokens/s per backend (or rung; or "
        "against size), latency against rate for --serve-rates; none for --roofline",
    )
    args = p.parse_args(argv)
    if args.rungs and not set(args.rungs) <= set(ladder.rungs_for(args.device)):
        p.error(
            f"--rungs: {', '.join(sorted(set(args.rungs) - set(ladder.rungs_for(args.device))))} runs on "
            "--device cuda only"
        )
    if args.peer == "llama-cpp" and not args.roofline:
        p.error("--peer llama-cpp runs with --roofline only")
    if args.peer == "vllm" and (args.roofline or args.ladder or args.serve_rates):
        p.error(
            "--peer vllm runs with the throughput comparison (or --sizes), not with --roofline, --ladder or "
            "--serve-rates"
        )
    if args.peer == "vllm" and args.device != "cpu":
        p.error("--peer vllm: vLLM's CPU build runs on --device cpu only")
    if args.vllm_venv and args.peer != "vllm":
        p.error("--vllm-venv goes with --peer vllm")
    args.rungs = args.rungs or ladder.rungs_for(args.device)
    return args


def describe(args) -> str:
    """The workload in a few words, for plot titles: its kind and prompt/output lengths."""
    if args.workload == "fixed":
        return f"fixed {args.input_len}/{args.output_len} tokens"
    if args.workload == "mixed":
        return "mixed {}-{}/{}-{} tokens".format(*args.input_range, *args.output_range)
    return f"shared-prefix {args.prefix_len}+{args.suffix_len}/{args.output_len} tokens"


def engine_options(args, path: Path, workload: Workload) -> dict:
    """LLM(...) options: the flags given; a KV cache with room for a full batch of the longest request, so that
    minillm never preempts and static batching can reserve its batches up front; token ids alone when the
    checkpoint has no tokenizer (a random model)."""
    options = {
        name: getattr(args, name)
        for name in ("max_num_seqs", "max_num_batched_tokens", "kvcache_block_size", "quantization", "kv_cache_dtype")
        if getattr(args, name) is not None
    } | {"device": args.device}
    block_size = options.get("kvcache_block_size", Config.kvcache_block_size)
    batch = max(options.get("max_num_seqs", Config.max_num_seqs), args.static_batch_size or 0)
    config = ModelConfig.from_pretrained(path)
    dtype = getattr(torch, resolve_dtype(Config.dtype, args.device, config.dtype))
    need = batch * math.ceil(workload.max_len / block_size) * block_size * kv_cache_bytes_per_token(config, dtype)
    options["kvcache_memory_bytes"] = max(Config.kvcache_memory_bytes, need)
    if not (path / "tokenizer.json").is_file():
        options["skip_tokenizer_init"] = True
    return options


def check_token_counts(backend: str, token_ids: list[list[int]], output_lens: list[int]) -> None:
    for i, (tokens, n) in enumerate(zip(token_ids, output_lens, strict=True)):
        if len(tokens) != n:
            raise RuntimeError(
                f"{backend} generated {len(tokens)} tokens for request {i}, which asked for {n}: "
                "its throughput would be miscounted"
            )


def summarize(runs: dict[str, list[Run]], workload: Workload) -> tuple[dict, dict]:
    """Per backend, from its fastest round: throughput, latency where recorded, the run's facts; the share of
    requests (over all rounds) whose tokens equal minillm's in the same round (a greedy check), and each
    round's throughput when there were several. And minillm's output tokens/s over each peer's."""
    results = {}
    for name, rounds in runs.items():
        best = min(rounds, key=lambda run: run.elapsed)
        results[name] = throughput(workload, best.elapsed)
        if best.times:
            results[name] |= latency(best.times, workload.output_lens)
        if "minillm" in runs and name != "minillm":
            same = sum(
                a == b for run, ours in zip(rounds, runs["minillm"]) for a, b in zip(run.token_ids, ours.token_ids)
            )
            results[name]["same_tokens_as_minillm"] = same / (len(workload) * len(rounds))
        if len(rounds) > 1:
            results[name]["rounds_output_tokens_per_second"] = [workload.num_output_tokens / r.elapsed for r in rounds]
        results[name] |= {k: v for k, v in best.info.items() if k != "breakdown"}
        if "tried" in rounds[0].info:  # hf-generate's batch-size sweep runs in the first round only
            results[name]["tried"] = rounds[0].info["tried"]
    if "minillm" not in results:
        return results, {}
    ours = results["minillm"]["output_tokens_per_second"]
    return results, {name: ours / r["output_tokens_per_second"] for name, r in results.items() if name != "minillm"}


def compare(
    args, path: Path, engine_opts: dict, workload: Workload, warmup: Workload, repeats: list[Workload] = ()
) -> dict:
    """Every backend of --backends on the workload, then on each of `repeats` (the same lengths, other prompts:
    --repeats rounds, in alternating order so that a slow spell of the machine does not fall on one backend
    alone); each backend counts its fastest round. With --peer vllm, vLLM too, last in the first round: every
    round in one subprocess (one start-up), or skipped, with the reason, when its environment is absent. A peer
    that runs out of memory is left out, with the reason (failed_backends), rather than losing the others' results.
    Results, minillm's speedups, its step breakdown and the memory building its engine took; printed."""
    models = Models(path, engine_opts)
    names = [b for b in BACKENDS if b in args.backends]
    runs = {name: [] for name in names}
    peer = {}
    if getattr(args, "peer", None) == "vllm":
        venv = vllm_peer.venv_dir(getattr(args, "vllm_venv", None))
        if why := vllm_peer.unavailable(venv):
            print(f"vLLM peer skipped: {why}")
            peer["vllm"] = dict(unavailable=why)
        else:
            names.append("vllm")
            runs["vllm"] = []
    rounds = [workload, *repeats]
    failed = {}  # backend -> why it has no results
    for r, round_workload in enumerate(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            label = f" (round {r + 1} of {len(repeats) + 1})" if repeats else ""
            if name == "vllm":
                if r == 0:
                    run_vllm_peer(models, rounds, warmup, args, venv, runs, peer)
                continue
            round_args = args
            if r and name == "hf-generate":  # later rounds rerun the batch size the first round found fastest
                round_args = argparse.Namespace(**vars(args) | {"hf_batch_size": runs[name][0].info["batch_size"]})
            if name in failed:
                continue
            try:
                run = BACKENDS[name](models, round_workload, warmup, round_args)
            except MemoryError as e:  # a peer sizing its cache from the RAM left (transformers' continuous batching)
                if name.startswith("minillm"):
                    raise
                print(f"{name} failed, left out of the comparison: MemoryError: {e}")
                failed[name] = f"MemoryError: {e}"
                continue
            check_token_counts(name, run.token_ids, round_workload.output_lens)
            runs[name].append(run)
            print(f"{name}{label}: {workload.num_output_tokens / run.elapsed:.1f} output tokens/s")
    results, speedup = summarize({name: r for name, r in runs.items() if name not in failed}, workload)
    breakdown = min(runs["minillm"], key=lambda run: run.elapsed).info["breakdown"] if "minillm" in runs else None
    print("\n" + results_table(results, speedup) + ("\n(each backend's fastest of its rounds)" if repeats else ""))
    if len(results.get("hf-generate", {}).get("tried", [])) > 1:
        print(
            "hf-generate batch sizes: "
            + ", ".join(
                f"{t['batch_size']}: {t['output_tokens_per_second']:.1f} tok/s" for t in results["hf-generate"]["tried"]
            )
        )
    if "vllm" in results:
        v = results["vllm"]
        same = (
            f"; same greedy tokens as minillm on {v['same_tokens_as_minillm']:.0%} of the requests"
            if "same_tokens_as_minillm" in v
            else ""
        )
        ratio = f"; minillm / vLLM {speedup['vllm']:.2f}x" if "vllm" in speedup else ""
        print(
            f"vLLM {v['vllm_version']} (CPU build, {v['threads']} threads, start-up {v['startup_seconds']:.0f} s "
            f"not timed){same}{ratio}"
        )
    if breakdown:
        print("\nminillm step breakdown (share of step time)\n" + breakdown_table(breakdown))
    if models.memory:
        print("\n" + describe_memory(models.memory))
    return dict(
        results=results,
        minillm_speedup=speedup,
        breakdown=breakdown,
        memory=models.memory,
        **peer,
        **({"failed_backends": failed} if failed else {}),
    )


def run_vllm_peer(
    models: Models, rounds: list[Workload], warmup: Workload, args, venv: Path, runs: dict, peer: dict
) -> None:
    """vLLM on every round (one subprocess) into runs["vllm"]; on failure, the reason into peer["vllm"] and no
    vllm runs: the other backends' results stand."""
    try:
        vllm_runs = vllm_peer.run(models, rounds, warmup, vllm_peer.default_threads(args), venv)
        for run, round_workload in zip(vllm_runs, rounds):
            check_token_counts("vllm", run.token_ids, round_workload.output_lens)
    except (vllm_peer.PeerFailed, RuntimeError) as e:
        print(f"vLLM peer failed: {e}")
        peer["vllm"] = dict(failed=str(e))
        del runs["vllm"]
        return
    runs["vllm"] = vllm_runs
    for r, run in enumerate(vllm_runs):
        label = f" (round {r + 1} of {len(rounds)})" if len(rounds) > 1 else ""
        print(f"vllm{label}: {rounds[0].num_output_tokens / run.elapsed:.1f} output tokens/s")


def bench(args, random_size: str | None) -> dict:
    """One benchmark (the comparison, or the mode asked for) on one model: the model's facts, the workload's,
    the engine options, and what the benchmark measured."""
    with checkpoint(args.model, random_size, args.seed) as (path, model_name):
        config = read_config(path)
        pool = workloads.token_pool(config["vocab_size"], special_token_ids(path))
        kind = (
            "fixed" if args.roofline else args.workload
        )  # the roofline's requests: fixed, a batch of --roofline-batch
        workload = (
            workloads.fixed(args.roofline_batch, args.input_len, args.output_len, pool, args.seed)
            if args.roofline
            else make_workload(args, pool, args.seed, args.num_prompts)
        )
        warmup = make_workload(args, pool, args.seed + 1, WARMUP_PROMPTS)  # other prompts: no prefix-cache hits
        warmup.output_lens = [min(n, WARMUP_OUTPUT_LEN) for n in warmup.output_lens]
        max_len = config.get("max_position_embeddings", 2048)
        if workload.max_len > max_len:
            raise SystemExit(
                f"error: a request of {workload.max_len} tokens (prompt + output) does not fit the "
                f"model's {max_len} positions: shorten the workload's lengths"
            )
        model = dict(
            name=model_name,
            path=None if random_size else str(path),
            random_size=random_size,
            num_parameters=num_parameters(path),
            vocab_size=config["vocab_size"],
            max_position_embeddings=max_len,
        )
        print(
            f"model {model_name} ({model['num_parameters'] / 1e6:.1f}M parameters), {kind} workload: "
            f"{len(workload)} requests, {workload.num_input_tokens} prompt and {workload.num_output_tokens} "
            f"output tokens; {torch.get_num_threads()} torch threads"
        )
        engine_opts = engine_options(args, path, workload)
        if args.ladder:
            measured = ladder.run(path, engine_opts, workload, warmup, args)
            print("\n" + ladder_table(measured["ladder"]))
        elif args.serve_rates:
            measured = serving.run(path, engine_opts, workload, warmup, args)
            print("\n" + serving_table(measured["serving"]["results"]))
        elif args.roofline:
            measured = roofline.run(path, engine_opts, pool, args)
        else:
            repeats = [make_workload(args, pool, args.seed, args.num_prompts, r) for r in range(1, args.repeats)]
            measured = compare(args, path, engine_opts, workload, warmup, repeats)
    return dict(
        model=model,
        engine_options=engine_opts,
        workload=dict(
            name=kind,
            num_requests=len(workload),
            num_input_tokens=workload.num_input_tokens,
            num_output_tokens=workload.num_output_tokens,
        ),
        **measured,
    )


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print the tables, write the JSON record (and the plot); return the record.
    `serve ...` runs the online benchmark over HTTP instead (minillm.bench.serve), `spec ...` speculative decoding
    against the plain engine (minillm.bench.spec), `quant ...` quantized weights against fp32 (minillm.bench.quant),
    `autotune ...` searches the server's flags for the best goodput (minillm.bench.autotune), `structured ...` guided
    JSON against unguided (minillm.bench.structured)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from minillm.bench import serve

        return serve.main(argv[1:])
    if argv[:1] == ["spec"]:
        from minillm.bench import spec

        return spec.main(argv[1:])
    if argv[:1] == ["quant"]:
        from minillm.bench import quant

        return quant.main(argv[1:])
    if argv[:1] == ["autotune"]:
        from minillm.bench import autotune

        return autotune.main(argv[1:])
    if argv[:1] == ["structured"]:
        from minillm.bench import structured

        return structured.main(argv[1:])
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sizes:
        sizes = [dict(size=size, **bench(args, size)) for size in args.sizes]
        measured = dict(
            sizes=[
                dict(
                    size=s["size"],
                    num_parameters=s["model"]["num_parameters"],
                    results=s["results"],
                    minillm_speedup=s["minillm_speedup"],
                    breakdown=s["breakdown"],
                    memory=s["memory"],
                    engine_options=s["engine_options"],
                    **{k: s[k] for k in ("vllm",) if k in s},
                )
                for s in sizes
            ]
        )
        model_name = "random-" + "-".join(args.sizes)
        title = f"cost against size: {describe(args)} x {args.num_prompts} requests, random models"
        print(
            "\n"
            + "\n".join(
                f"{s['size']} ({s['num_parameters'] / 1e6:.1f}M): "
                + ", ".join(f"{name} {r['output_tokens_per_second']:.1f}" for name, r in s["results"].items())
                + " output tok/s"
                for s in measured["sizes"]
            )
        )
    else:
        measured = bench(args, args.random_size)
        model_name = measured["model"]["name"]
        title = f"{describe(args)} x {measured['workload']['num_requests']} requests, model {model_name}"
    mode = next((m for m in ("ladder", "roofline", "sizes") if getattr(args, m)), "serve" if args.serve_rates else None)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = dict(
        created=stamp,
        machine=machine(args.device),
        versions=versions(),
        **git_state(),
        config=vars(args) | {"engine_options": measured.pop("engine_options", None)},
        **measured,
    )
    json_path = args.output_json or Path("results/bench") / (
        "-".join([*([mode] if mode else []), args.workload, model_name, stamp]) + ".json"
    )
    write_json(record, json_path)
    print(f"\nrecord: {json_path}")
    if args.plot and not args.roofline:
        if args.ladder:
            plot_ladder(record["ladder"]["rungs"], f"speedup ladder: {title}", args.plot)
        elif args.serve_rates:
            plot_serving(
                args.serve_rates, record["serving"]["results"], f"online serving (Poisson arrivals): {title}", args.plot
            )
        elif args.sizes:
            plot_sizes(record["sizes"], title, args.plot)
        else:
            plot(record["results"], record["minillm_speedup"], title, args.plot)
        print(f"plot: {args.plot}")
    return record
