"""python -m minillm.bench spec: speculative decoding against the same engine without it, by batch size.

Each --speculative setting runs the same greedy requests as the plain engine, at each batch size (max_num_seqs =
the batch, that many requests or --min-prompts, all queued at once), and must give the same tokens. Reported: output
tokens/s of each (prefills included) and the speedup; the mean TPOT (time per output token after the first, the
decode rate a request sees) and its speedup; the drafts' acceptance rate and the mean tokens a verify run yields;
and the batch size from which speculation stops paying (measured: the first batch where its speedup falls below
1 - NOISE; a speedup within NOISE of 1 is break-even, as run-to-run noise on a shared CPU is about that large).

Workloads: stories (story openings; the default model), rewrite (a chat asking to repeat a story word for word:
lookup finds long matches; for a chat model such as SmolLM2), random (random token ids, ignore_eos: lookup finds
next to nothing, the cost of drafts that fail).

python -m minillm.bench spec --model HuggingFaceTB/SmolLM2-135M-Instruct --workload rewrite --speculative ngram:4,3
python -m minillm.bench spec --workload stories --speculative draft:4 --batch-sizes 1,4,16,64 --plot spec.png
"""

import argparse
import random
import time
from pathlib import Path

from minillm import LLM, SamplingParams
from minillm.bench.arguments import positive_int
from minillm.bench.models import special_token_ids
from minillm.bench.report import figure, git_state, machine, save, versions, write_json
from minillm.bench.workloads import token_pool
from minillm.config import default_model_path, draft_model_path
from minillm.data import generate_corpus, heldout_openings

REWRITE = "Repeat the following story exactly, word for word:\n\n"
NOISE = 0.05  # a speedup within 5% of 1 is break-even, not a gain or a loss


def speculative(text: str) -> tuple[str, dict]:
    """--speculative's ngram:K,N[,M] (K drafts, lookup of N down to M tokens; M defaults to N, as in vLLM) or
    draft:K[,DIR] (K drafts of a draft model; default: the default model's shipped draft)."""
    method, _, rest = text.partition(":")
    parts = rest.split(",") if rest else []
    try:
        if method == "ngram" and len(parts) in (2, 3):
            k, n, m = (int(x) for x in (*parts, parts[1])[:3])
            label = f"ngram k={k} n={n}" + (f"..{m}" if m != n else "")
            return label, {
                "method": "ngram",
                "num_speculative_tokens": k,
                "prompt_lookup_max": n,
                "prompt_lookup_min": m,
            }
        if method == "draft" and len(parts) in (1, 2):
            model = parts[1] if len(parts) == 2 else str(draft_model_path())
            return f"draft k={parts[0]}", {
                "method": "draft_model",
                "model": model,
                "num_speculative_tokens": int(parts[0]),
            }
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected ngram:K,N[,M] or draft:K[,DIR], got {text!r}")


def requests(workload: str, llm: LLM, num: int, output_len: int, seed: int) -> tuple[list[list[int]], SamplingParams]:
    """The workload's prompts (token ids) and their greedy sampling parameters."""
    if workload == "random":
        pool = token_pool(llm.vocab_size, special_token_ids(llm.model_path))
        rng = random.Random(seed)
        return [rng.choices(pool, k=64) for _ in range(num)], SamplingParams(
            temperature=0, max_tokens=output_len, ignore_eos=True
        )
    if workload == "stories":
        prompts = [llm.tokenizer.encode(text) for text in heldout_openings(num, seed=seed + 1)]
    else:
        stories = generate_corpus(num, seed + 1)
        prompts = [llm.encode_chat([{"role": "user", "content": REWRITE + story}])[0] for story in stories]
    return prompts, SamplingParams(temperature=0, max_tokens=output_len)


def run(model: str, batch: int, spec: dict | None, workload: str, args) -> dict:
    """One engine at one batch size over the workload: output tokens/s, its tokens, its drafts' statistics."""
    llm = LLM(model, max_num_seqs=batch, speculative_config=spec, enforce_eager=False if args.compiled else None)
    prompts, params = requests(workload, llm, max(batch, args.min_prompts), args.output_len, args.seed)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm up
    for runner in (llm.model_runner, getattr(llm.drafter, "runner", None)) if args.compiled else ():
        if runner is not None:  # every bucket this engine can use, compiled before the timing
            runner.graphs.capture()
    best = None
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        best = (seconds, outputs) if best is None or seconds < best[0] else best
    best, outputs = best  # tokens/s and TPOT both of the fastest run, so that they describe the same run
    num_tokens = sum(len(o.token_ids) for o in outputs)
    stats = llm.spec_stats
    # TPOT: a request's time per output token after its first (as vLLM reports it), weighted by its tokens
    tpot = sum(o.finish_time - o.first_token_time for o in outputs) / max(1, num_tokens - len(outputs))
    return dict(
        output_tokens_per_second=num_tokens / best,
        tpot_ms=tpot * 1000,
        seconds=best,
        num_requests=len(prompts),
        output_tokens=num_tokens,
        acceptance_rate=stats.acceptance_rate,
        mean_acceptance_length=stats.mean_acceptance_length,
        token_ids=[o.token_ids for o in outputs],
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minillm.bench spec", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", metavar="DIR|ID", help="default: the embedded default model")
    p.add_argument("--workload", choices=["stories", "rewrite", "random"], default="stories")
    p.add_argument(
        "--speculative", type=speculative, action="append", metavar="SPEC", help="ngram:K,N[,M] or draft:K[,DIR]"
    )
    p.add_argument("--batch-sizes", type=lambda t: [positive_int(x) for x in t.split(",")], default=[1, 4, 16, 64])
    p.add_argument("--min-prompts", type=positive_int, default=4, help="requests per batch size, at least (default 4)")
    p.add_argument("--output-len", type=positive_int, default=128, help="max_tokens of each request (default 128)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs per measurement; the fastest counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compiled",
        action="store_true",
        help="enforce_eager=False for every engine: decode and verify steps compiled per batch-size bucket",
    )
    p.add_argument("--output-json", type=Path, metavar="PATH")
    p.add_argument("--plot", type=Path, metavar="PATH", help="a PNG: speedup against batch size")
    args = p.parse_args(argv)
    args.speculative = args.speculative or [speculative("ngram:4,3")]
    return args


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    model = args.model or str(default_model_path())
    results, stops = {}, {}
    for batch in args.batch_sizes:
        base = run(model, batch, None, args.workload, args)
        results.setdefault("plain", {})[batch] = base
        print(f"batch {batch:>3}: plain {base['output_tokens_per_second']:8.1f} tok/s, TPOT {base['tpot_ms']:.1f} ms")
        for label, spec in args.speculative:
            r = run(model, batch, spec, args.workload, args)
            if r["token_ids"] != base["token_ids"]:
                raise AssertionError(f"{label} at batch {batch} gave other tokens than the plain engine (greedy)")
            r["speedup"] = r["output_tokens_per_second"] / base["output_tokens_per_second"]
            r["tpot_speedup"] = base["tpot_ms"] / r["tpot_ms"]
            results.setdefault(label, {})[batch] = r
            if r["speedup"] < 1 - NOISE:
                stops.setdefault(label, batch)
            print(
                f"batch {batch:>3}: {label:<14} {r['output_tokens_per_second']:8.1f} tok/s  {r['speedup']:.2f}x, "
                f"TPOT {r['tpot_ms']:.1f} ms ({r['tpot_speedup']:.2f}x)  acceptance {r['acceptance_rate'] or 0:.0%}, "
                f"{r['mean_acceptance_length'] or 1:.2f} tokens per verify"
            )
    for runs in results.values():
        for r in runs.values():
            del r["token_ids"]
    for label, _ in args.speculative:
        if label in stops:
            print(f"{label}: stops paying from batch {stops[label]}")
        else:
            print(
                f"{label}: never below {1 - NOISE:.2f}x up to batch {max(args.batch_sizes)} (within {NOISE:.0%} of 1: break-even)"
            )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = dict(
        created=stamp,
        machine=machine("cpu"),
        versions=versions(),
        **git_state(),
        config={k: v for k, v in vars(args).items() if k != "speculative"} | {"speculative": dict(args.speculative)},
        model=model,
        results=results,
        stops_paying_at=stops,
    )
    path = args.output_json or Path("results/bench") / f"spec-{args.workload}-{Path(model).name}-{stamp}.json"
    write_json(record, path)
    print(f"record: {path}")
    if args.plot:
        plot_speedup(results, f"speculative decoding, {args.workload}, {Path(model).name}", args.plot)
        print(f"plot: {args.plot}")
    return record


def plot_speedup(results: dict, title: str, path: Path) -> None:
    """Speedup over the plain engine against batch size, one line per speculative setting."""
    fig, axes = figure(6, 3.6)
    ax = axes[0][0]
    for label, runs in results.items():
        if label != "plain":
            ax.plot(list(runs), [r["speedup"] for r in runs.values()], marker="o", label=label)
    ax.axhline(1, color="grey", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    batches = sorted({b for runs in results.values() for b in runs})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set(xlabel="batch size (requests decoding together)", ylabel="speedup over no speculation")
    ax.legend()
    save(fig, title, path)
