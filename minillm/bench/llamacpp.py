"""llama.cpp as a peer: batch-1 greedy decode and prompt (prefill) tokens/s, against minillm on the same weights.

llama.cpp (through llama-cpp-python) runs an fp32 GGUF written from the very checkpoint minillm loads
(minillm.bench.gguf_export), with its KV cache in F32 (its default is F16), so both engines compute the same
function and their greedy tokens are compared as a check. Both run one request at a time on the same
prompts, with the same number of threads (llama.cpp's n_threads = n_threads_batch = torch's):

- prompt tokens/s: the prompt's length over the time of its forward pass (and picking the first token);
- decode tokens/s: one token per forward pass of one new token (llama_cpp.Llama.eval), then its argmax.

Each prompt is a different one (minillm's prefix cache never hits), the first is a warm-up; the figures are
medians over the rest. The engines alternate prompt by prompt, so a shared machine's changing load falls on
both. llama-cpp-python is an optional extra: `pip install -e '.[peers]'` builds llama.cpp
from source (about 10 minutes).
"""

import statistics
import time
from pathlib import Path

import numpy as np
import torch

from minillm import LLM, SamplingParams
from minillm.bench.breakdown import StepBreakdown

INSTALL = "pip install -e '.[peers]' (builds llama.cpp from source, about 10 minutes)"
CACHE_DIR = Path("results/gguf")  # one fp32 GGUF per checkpoint, named by its hash


def unavailable() -> str | None:
    """Why llama.cpp cannot run here (llama-cpp-python or gguf missing), or None when it can."""
    missing = []
    for module, package in (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")):
        try:
            __import__(module)
        except ImportError as e:  # also a llama-cpp-python whose shared library failed to load
            missing.append(f"{package} ({e})")
    return f"not installed: {', '.join(missing)}; {INSTALL}" if missing else None


def load(gguf_path: Path, n_ctx: int, threads: int):
    """A llama.cpp context on the GGUF: F32 KV cache, a prompt of up to n_ctx tokens in one batch, `threads`
    threads for prompts and single tokens alike."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )


def generate(llm, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """Greedy tokens for prompt on a fresh context, the prompt's seconds (its eval and the first argmax) and
    the decode's seconds (the other max_tokens - 1 single-token evals and argmaxes)."""
    import llama_cpp

    def argmax() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return int(logits.argmax())

    llm.reset()  # n_tokens = 0: the next eval drops the whole KV cache
    start = time.perf_counter()
    llm.eval(prompt)
    tokens = [argmax()]
    prefilled = time.perf_counter()
    while len(tokens) < max_tokens:
        llm.eval(tokens[-1:])
        tokens.append(argmax())
    return tokens, prefilled - start, time.perf_counter() - prefilled


def minillm_generate(llm: LLM, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """minillm's greedy tokens for prompt, its prefill steps' seconds and its decode steps' seconds (from the
    step breakdown: the same parts of the work as generate() times for llama.cpp)."""
    with StepBreakdown(llm) as breakdown:
        out = llm.generate(
            [prompt], [SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)], use_tqdm=False
        )[0]
    steps = breakdown.summary()
    seconds = [
        steps[k]["mean_step_ms"] * steps[k]["num_steps"] / 1000 if k in steps else 0.0 for k in ("prefill", "decode")
    ]
    return out.token_ids, *seconds


def run_in_turns(engines: dict, prompts: list[list[int]], output_len: int, threads: int) -> dict:
    """engines: name -> (a minillm LLM, the GGUF llama.cpp runs beside it or None). Each prompt goes through every
    engine in turn, llama.cpp after its minillm, then the next prompt: the engines take turns, so a machine whose
    load changes during the run disturbs all alike. Per name, "minillm" and (with a GGUF) "llama_cpp": tokens, and
    prompt and decode tokens/s per prompt."""
    n_ctx = max(len(p) for p in prompts) + output_len
    peers = {name: load(gguf, n_ctx, threads) for name, (_, gguf) in engines.items() if gguf is not None}
    runs = {name: {"minillm": []} | ({"llama_cpp": []} if name in peers else {}) for name in engines}
    try:
        for prompt in prompts:
            for name, (llm, _) in engines.items():
                runs[name]["minillm"].append(minillm_generate(llm, prompt, output_len))
                if name in peers:
                    runs[name]["llama_cpp"].append(generate(peers[name], prompt, output_len))
    finally:
        for peer in peers.values():
            peer.close()
    return {
        name: {
            engine: dict(
                token_ids=[r[0] for r in rs],
                prompt_tps=[len(p) / r[1] for p, r in zip(prompts, rs)],
                decode_tps=[(output_len - 1) / r[2] if r[2] else 0.0 for r in rs],
            )
            for engine, rs in by_engine.items()
        }
        for name, by_engine in runs.items()
    }


def peer_gguf(path: Path, engine_options: dict, cache_dir: Path) -> tuple[Path, str]:
    """The GGUF llama.cpp runs against minillm's engine options, and what it holds: minillm's own file when it
    runs a GGUF's blocks (quantization="gguf"), Q8_0 written from the checkpoint against minillm's int8, else
    fp32 written from the checkpoint."""
    from minillm.bench.gguf_export import export
    from minillm.models.hub import gguf_source

    quantization = engine_options.get("quantization")
    if quantization == "gguf":
        return gguf_source(path), "the same GGUF file"
    outtype = "q8_0" if quantization == "int8" else "f32"
    return export(path, cache_dir, outtype), f"{outtype} GGUF of the same checkpoint"


def compare(
    path: Path,
    llm: LLM,
    prompts: list[list[int]],
    output_len: int,
    engine_options: dict | None = None,
    cache_dir: Path | None = None,
) -> dict:
    """llama.cpp against minillm at batch 1 on prompts (the first a warm-up): medians of prompt and decode
    tokens/s, how many greedy outputs agree, minillm's ratios; a GGUF written here is cached in cache_dir (default
    results/gguf). {"llama_cpp": {"unavailable": why}} when llama-cpp-python is not installed."""
    if why := unavailable():
        print(f"llama.cpp peer skipped: {why}")
        return dict(llama_cpp=dict(unavailable=why))
    threads = torch.get_num_threads()
    gguf_path, weights = peer_gguf(path, engine_options or {}, cache_dir or CACHE_DIR)
    runs = run_in_turns({"": (llm, gguf_path)}, prompts, output_len, threads)[""]
    out = {}
    for name, run in runs.items():
        out[name] = dict(
            prompt_tokens_per_second=statistics.median(run["prompt_tps"][1:] or run["prompt_tps"]),
            decode_tokens_per_second=statistics.median(run["decode_tps"][1:] or run["decode_tps"]),
            prompt_tps=run["prompt_tps"],
            decode_tps=run["decode_tps"],
        )
    ours, theirs = out["minillm"], out["llama_cpp"]
    same = sum(a == b for a, b in zip(runs["minillm"]["token_ids"], runs["llama_cpp"]["token_ids"]))
    theirs |= dict(
        gguf=str(gguf_path),
        weights=weights,
        threads=threads,
        kv_cache="f32",
        same_tokens_as_minillm=same / len(prompts),
    )
    speedup = {k: ours[f"{k}_tokens_per_second"] / theirs[f"{k}_tokens_per_second"] for k in ("prompt", "decode")}
    print(
        f"batch 1, {len(prompts[0])}-token prompts, {output_len} tokens, {threads} threads, median of "
        f"{max(len(prompts) - 1, 1)}:\n"
        f"  minillm:   prompt {ours['prompt_tokens_per_second']:.1f} tok/s, decode {ours['decode_tokens_per_second']:.1f} tok/s\n"
        f"  llama.cpp: prompt {theirs['prompt_tokens_per_second']:.1f} tok/s, decode "
        f"{theirs['decode_tokens_per_second']:.1f} tok/s ({weights}, F32 KV cache); same greedy tokens on "
        f"{same} of {len(prompts)} prompts\n"
        f"  minillm / llama.cpp: prompt {speedup['prompt']:.2f}x, decode {speedup['decode']:.2f}x"
    )
    return dict(llama_cpp=dict(results=out, minillm_speedup=speedup))
