"""python -m minillm.bench quant: what fewer bytes per weight buy (batch-1 decode) and cost (quality), side by side.

Each --variants entry is one engine on the same model: fp32 (the checkpoint's floats), int8 (quantized at load),
gguf (the model's own GGUF file in its blocks, for a checkpoint that came as one, such as SmolLM2), or q8_0, q4_0,
q4_1 (a GGUF of that type written from the checkpoint, then run in its blocks). For each: the bytes a decode step
reads per weight, batch-1 decode tokens/s (decode steps compiled; --eager: op by op), held-out perplexity, and its
agreement with fp32 (the same next token, teacher-forced; the same greedy output, generated). With --peer
llama-cpp, llama.cpp runs on each variant's GGUF (gguf: the same file; int8: Q8_0; fp32: F32) with the same
threads. Every engine takes its turn on each prompt before the next prompt (the variants and llama.cpp
alternate), so a machine whose load changes disturbs all alike; ratios are of the medians.

python -m minillm.bench quant --random-size 100m --variants fp32,int8,q8_0,q4_1 --peer llama-cpp
python -m minillm.bench quant --model HuggingFaceTB/SmolLM2-135M-Instruct --variants fp32,int8,gguf --peer llama-cpp
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from minillm import LLM
from minillm.bench import llamacpp, workloads
from minillm.bench.arguments import names_from, positive_int
from minillm.bench.gguf_export import export
from minillm.bench.models import RANDOM_SIZES, checkpoint, num_parameters, read_config, special_token_ids, weight_bytes
from minillm.bench.quality import eval_tokens, quality
from minillm.bench.report import figure, git_state, machine, save, versions, write_json
from minillm.models.hub import gguf_source
from minillm.tokenizer import Tokenizer

VARIANTS = ("fp32", "int8", "gguf", "q8_0", "q4_0", "q4_1")
GGUF_CACHE = Path("results/gguf")


def engine(path: Path, variant: str, eager: bool) -> tuple[LLM, Path | None]:
    """The variant's engine and the GGUF file llama.cpp runs against it."""
    options = dict(
        enforce_eager=eager, skip_tokenizer_init=True
    )  # token ids only: the checkpoint's tokenizer makes them
    if variant in ("fp32", "int8"):
        try:
            peer = export(path, GGUF_CACHE, "q8_0" if variant == "int8" else "f32")
        except ValueError as e:  # bench.gguf_export writes Qwen3 checkpoints only
            print(f"{variant}: no GGUF for llama.cpp ({e})")
            peer = None
        return LLM(path, quantization=None if variant == "fp32" else "int8", **options), peer
    file = gguf_source(path) if variant == "gguf" else export(path, GGUF_CACHE, variant)
    if file is None:
        raise SystemExit(f"error: --variants gguf: {path} was not converted from a GGUF file (use q8_0, q4_0, q4_1)")
    return LLM(file, **options), file


def text_prompts(path: Path, n: int, length: int, seed: int) -> list[list[int]]:
    """n prompts of `length` tokens: consecutive pieces of the evaluation text where the model has a tokenizer
    (real text, so greedy tokens can be compared: random ids make near-ties of the next token), else random ids."""
    if not (path / "tokenizer.json").is_file():
        pool = workloads.token_pool(read_config(path)["vocab_size"], special_token_ids(path))
        return workloads.fixed(n, length, 1, pool, seed).prompts
    ids = eval_tokens(Tokenizer(path), path, max_tokens=n * length)
    if len(ids) < n * length:
        raise SystemExit(f"error: the evaluation text has {len(ids)} tokens, fewer than {n} prompts of {length}")
    return [ids[i * length : (i + 1) * length] for i in range(n)]


def decode(engines: dict, prompts: list[list[int]], output_len: int) -> dict:
    """Batch-1 decode tokens/s of every variant (and of llama.cpp on its GGUF where one is given), the engines taking
    turns prompt by prompt; medians over the prompts after the first (a warm-up). Both engines' greedy tokens."""
    runs = llamacpp.run_in_turns(engines, prompts, output_len, torch.get_num_threads())
    out = {}
    for variant, run in runs.items():
        r = dict(minillm=statistics.median(run["minillm"]["decode_tps"][1:]), minillm_tps=run["minillm"]["decode_tps"])
        if "llama_cpp" in run:
            same = sum(a == b for a, b in zip(run["minillm"]["token_ids"], run["llama_cpp"]["token_ids"]))
            r |= dict(
                llama_cpp=statistics.median(run["llama_cpp"]["decode_tps"][1:]),
                llama_cpp_tps=run["llama_cpp"]["decode_tps"],
                same_tokens_as_llama_cpp=same / len(prompts),
            )
        out[variant] = r
    return out


def measure(path: Path, args) -> dict:
    """Every variant on the same prompts, the engines alive together so that their decode runs take turns: bytes,
    decode rate(s), quality against the first variant (fp32 by default)."""
    prompts = text_prompts(path, args.prompts + 1, args.input_len, args.seed)
    # the evaluation text in the checkpoint's tokenizer (a GGUF written from it has none of its own)
    text = eval_tokens(Tokenizer(path), path) if (path / "tokenizer.json").is_file() else None
    params, peer_wanted = num_parameters(path), args.peer == "llama-cpp" and not llamacpp.unavailable()
    if args.peer and not peer_wanted:
        print(f"llama.cpp peer skipped: {llamacpp.unavailable()}")
    engines = {}
    for variant in args.variants:
        llm, peer = engine(path, variant, args.eager)
        if not args.eager:
            llm.model_runner.graphs.capture(max_batch=1)  # batch 1's compiled step, built before any clock
        engines[variant] = (llm, peer if peer_wanted else None)
    rates = decode(engines, prompts, args.output_len)
    reference = engines[args.variants[0]][0]
    results = {}
    for variant, (llm, _) in engines.items():
        r = dict(
            bytes_per_weight=weight_bytes(llm.model_runner.model) / params, decode_tokens_per_second=rates[variant]
        )
        if text is not None:
            r["quality"] = quality(llm, None if reference is llm else reference, text)
        r["speedup_over_" + args.variants[0]] = rates[variant]["minillm"] / rates[args.variants[0]]["minillm"]
        results[variant] = r
        line = f"{variant:>5}: {r['bytes_per_weight']:.2f} bytes/weight, decode {rates[variant]['minillm']:6.1f} tok/s"
        line += f" ({r['speedup_over_' + args.variants[0]]:.2f}x {args.variants[0]})"
        if "llama_cpp" in rates[variant]:
            d = rates[variant]
            line += f", llama.cpp {d['llama_cpp']:6.1f} ({d['minillm'] / d['llama_cpp']:.2f}x)"
        if "quality" in r:
            q = r["quality"]
            line += f", perplexity {q['perplexity']:.3f}"
            if "perplexity_change" in q:
                line += f" ({q['perplexity_change']:+.2%}), next-token agreement {q['greedy_agreement']:.1%}"
        print(line, flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench quant", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    m = p.add_mutually_exclusive_group()
    m.add_argument(
        "--model", metavar="DIR|ID|FILE", help="a checkpoint, a hub id or a .gguf file (default: the default model)"
    )
    m.add_argument("--random-size", choices=list(RANDOM_SIZES), help="a random-weight Qwen3, made for this run")
    p.add_argument(
        "--variants",
        type=names_from(VARIANTS, "variant"),
        default=["fp32", "int8", "q8_0", "q4_1"],
        help=f"comma-separated, from {', '.join(VARIANTS)}; the first is the reference (default fp32,int8,q8_0,q4_1)",
    )
    p.add_argument("--peer", choices=["llama-cpp"], help="llama.cpp on each variant's GGUF, alternating with minillm")
    p.add_argument("--prompts", type=positive_int, default=5, help="timed prompts, after one warm-up (default 5)")
    p.add_argument("--input-len", type=positive_int, default=32)
    p.add_argument("--output-len", type=positive_int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eager", action="store_true", help="decode op by op (default: decode steps compiled)")
    p.add_argument("--output-json", type=Path)
    p.add_argument("--plot", type=Path, help="a PNG: decode tokens/s and perplexity against bytes per weight")
    args = p.parse_args(argv)
    with checkpoint(args.model, args.random_size, args.seed) as (path, name):
        print(
            f"model {name} ({num_parameters(path) / 1e6:.1f}M parameters), batch-1 decode of {args.output_len} "
            f"tokens after {args.input_len}-token prompts, {torch.get_num_threads()} threads"
        )
        results = measure(path, args)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = dict(
        created=stamp,
        machine=machine("cpu"),
        versions=versions(),
        **git_state(),
        config=vars(args) | {"output_json": None, "plot": None},
        model=name,
        results=results,
    )
    out = args.output_json or Path("results/bench") / f"quant-{name}-{stamp}.json"
    write_json(record, out)
    print(f"record: {out}")
    if args.plot:
        plot(results, f"quantization, {name}, batch-1 decode", args.plot)
        print(f"plot: {args.plot}")
    return record


def plot(results: dict, title: str, path: Path) -> None:
    """Decode tokens/s (and llama.cpp's) and, where measured, perplexity, each against the bytes per weight, each
    point named (the names alternate above and below, in order of the bytes, as int8 and q8_0 lie close together).
    Points, not a line: the formats are separate choices, not a curve, and the axes leave room for the names."""
    results = dict(sorted(results.items(), key=lambda item: item[1]["bytes_per_weight"]))
    quality = all("quality" in r for r in results.values())
    fig, axes = figure(10 if quality else 5.5, 3.6, ncols=2 if quality else 1)
    x = [r["bytes_per_weight"] for r in results.values()]

    def points(ax, ys, ylabel, *style, **options):
        ax.plot(x, ys, *style, **options)
        for i, (name, xy) in enumerate(zip(results, zip(x, ys))):
            ax.annotate(name, xy, fontsize=8, xytext=(4, 6 if i % 2 else -12), textcoords="offset points")
        ax.set(xlabel="bytes per weight", ylabel=ylabel)
        ax.margins(x=0.1, y=0.15)
        ax.grid(alpha=0.3)

    tokens = [r["decode_tokens_per_second"] for r in results.values()]
    points(axes[0][0], [t["minillm"] for t in tokens], "batch-1 decode tokens/s", "o", label="minillm")
    peer = [(b, t["llama_cpp"]) for b, t in zip(x, tokens) if "llama_cpp" in t]  # variants with a GGUF for it
    if peer:
        axes[0][0].plot(*zip(*peer), "s", label="llama.cpp, the same GGUF")
    axes[0][0].legend(fontsize=8)
    if quality:
        perplexity = [r["quality"]["perplexity"] for r in results.values()]
        points(axes[0][1], perplexity, "held-out perplexity", "o", color="tab:red")
    save(fig, title, path)
