"""The GPU check, as one prepared run (scripts/gpu_check.sh calls it): every GPU path minillm has, each against its
reference, with the figures written to one JSON that notebook 11's section "What a GPU changes" reads.

    python scripts/gpu_check.py                     # on a CUDA machine: notebooks/data/gpu_check.json
    python scripts/gpu_check.py --device cpu --smoke --output /tmp/check.json   # the script itself, on a CPU

Checks (each one is recorded with its status and time; one that fails does not stop the others):
  tests          the tests marked gpu (tests/test_gpu.py, tests/test_kernels_gpu.py)
  dtypes         float32 and bfloat16 (dtype="auto") on the default model: throughput, greedy agreement
  graphs         CUDA graphs on and off: token-identical in float32
  backends       the Triton kernels against the torch reference backend: token-identical in float32
  long_context   a 32k max_model_len: a 30k-token prompt prefilled in chunks, then one sharing a 28k cached prefix,
                 each within a memory bound, token-identical to one unchunked, uncached prefill; the torch backend's
                 graphs refused at that width
  quantization   int8 weights and a Q4_1 GGUF through the Triton kernel against torch ops, the int8 KV cache, the
                 Triton quantized-matmul tests compiled
  kv_budget      the KV cache sized from gpu_memory_utilization holds under the largest steps and sampling
  speculative    n-gram and draft-model speculation: greedy tokens identical to plain decoding, seeded sampling
                 reproducible (its draws on the GPU's generator), the acceptance; the draft model's weights and KV
                 cache inside gpu_memory_utilization
  tensor_parallel  TP=2 over NCCL against one GPU (two GPUs or more)
  bench          the ladder and the roofline on the real model (SmolLM2-135M-Instruct), or the default model
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault(
    "TRITON_INTERPRET", "0"
)  # compiled Triton kernels on CUDA (read when minillm.kernels.triton loads)
from minillm import LLM, SamplingParams  # noqa: E402
from minillm.bench.models import save_random_qwen3  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def prompts(n: int, lo: int, hi: int, vocab: int = 1000, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, vocab, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def greedy(llm, batch, max_tokens=32) -> tuple[list[list[int]], float]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate(batch, params, use_tqdm=False)
    return [o.token_ids for o in out], time.perf_counter() - start


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How far two runs' greedy tokens agree: identical requests, and the mean length of the common prefix."""
    common = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), min(len(s), len(t))) for s, t in zip(a, b)]
    return {
        "identical": sum(s == t for s, t in zip(a, b)) / len(a),
        "mean_common_prefix": sum(common) / len(a),
        "tokens_per_request": len(a[0]),
    }


def engine(args, model=None, **options):
    if args.device == "cuda":
        options.setdefault("gpu_memory_utilization", 0.3)
    else:
        options.setdefault("num_kvcache_blocks", 512)
    return LLM(model, device=args.device, **options)


def check_tests(args) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = run.stdout.strip().splitlines()
    if run.returncode not in (0, 5):  # 5: nothing collected
        raise AssertionError("\n".join(lines[-30:]))
    return {"summary": lines[-1] if lines else ""}


def check_dtypes(args) -> dict:
    batch = prompts(args.n, 16, 128)
    result, tokens = {}, []
    for dtype in ("float32", "auto"):
        llm = engine(args, dtype=dtype)
        out, seconds = greedy(llm, batch)
        tokens.append(out)
        result[dtype] = {"dtype": llm.config.dtype, "seconds": seconds, "tokens_per_second": args.n * 32 / seconds}
        del llm
    return result | {"agreement": agreement(*tokens)}


def check_graphs(args) -> dict:
    batch = prompts(args.n, 16, 128, seed=1)
    eager, s_eager = greedy(engine(args, dtype="float32", enforce_eager=True), batch)
    llm = engine(args, dtype="float32", enforce_eager=False)
    graphs, s_graphs = greedy(llm, batch)
    assert graphs == eager, f"CUDA graphs changed greedy tokens: {agreement(eager, graphs)}"
    return {
        "graph_mode": llm.model_runner.graph_mode,
        "seconds_eager": s_eager,
        "seconds_graphs": s_graphs,
        "speedup": s_eager / s_graphs,
    }


def check_backends(args) -> dict:
    batch = prompts(args.n, 16, 128, seed=2)
    fast = "triton" if args.device == "cuda" else "cpu"
    ref, s_ref = greedy(engine(args, dtype="float32", attention_backend="torch", enforce_eager=True), batch)
    out, s_out = greedy(engine(args, dtype="float32", attention_backend=fast, enforce_eager=True), batch)
    assert out == ref, f"the {fast} backend changed greedy tokens: {agreement(ref, out)}"
    return {"backend": fast, "seconds_torch": s_ref, f"seconds_{fast}": s_out, "speedup": s_ref / s_out}


def peak_bytes(run) -> int | None:
    """Bytes allocated at the peak of run beyond what was allocated before (CUDA only)."""
    if not torch.cuda.is_available():
        run()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def check_long_context(args) -> dict:
    max_len = 2048 if args.smoke else 32768
    prompt_len, shared = max_len * 15 // 16, max_len * 7 // 8  # 30k and 28k tokens at 32k
    with tempfile.TemporaryDirectory() as tmp:
        save_random_qwen3("25m", Path(tmp), max_position_embeddings=max_len)
        first = prompts(1, prompt_len, prompt_len, vocab=16384, seed=3)[0]
        second = first[:shared] + prompts(1, prompt_len - shared, prompt_len - shared, vocab=16384, seed=4)[0]
        result = {"max_model_len": max_len, "prompt_tokens": prompt_len, "shared_prefix_tokens": shared}
        for dtype in ("float32", "bfloat16"):
            llm = engine(
                args, tmp, dtype=dtype, max_model_len=max_len, max_num_batched_tokens=4096, skip_tokenizer_init=True
            )
            outs = {}
            result[dtype] = {
                "chunked_prefill_peak_bytes": peak_bytes(lambda: outs.update(a=greedy(llm, [first], 16)[0])),
                "cached_prefix_peak_bytes": peak_bytes(
                    lambda: outs.update(
                        b=llm.generate(
                            [second], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False
                        )[0]
                    )
                ),
            }
            result[dtype]["cached_tokens"] = outs["b"].num_cached_tokens
            assert outs["b"].num_cached_tokens >= shared // 16 * 16 - 16, "the shared prefix was not found in the cache"
            if dtype == "float32":
                whole = engine(
                    args,
                    tmp,
                    dtype=dtype,
                    max_model_len=max_len,
                    max_num_batched_tokens=max_len,
                    enable_prefix_caching=False,
                    skip_tokenizer_init=True,
                )
                expected = greedy(whole, [first, second], 16)[0]
                assert [outs["a"][0], outs["b"].token_ids] == expected, "chunks or the cached prefix changed tokens"
                del whole
            for what in ("chunked_prefill_peak_bytes", "cached_prefix_peak_bytes"):
                peak = result[dtype][what]
                assert peak is None or peak < 4 * 2**30, f"{what}: {peak / 2**30:.1f} GiB"
            del llm
        if args.device == "cuda":
            llm = engine(args, tmp, attention_backend="torch", max_model_len=max_len, skip_tokenizer_init=True)
            result["torch_backend_graph_mode"] = llm.model_runner.graph_mode
    return result


def check_quantization(args) -> dict:
    """int8 weights and a Q4_1 GGUF through the Triton kernel against the same weights through torch ops
    (quant_linear_torch, native_kernels=False), and the int8 KV cache against the float one; the kernels' own
    tests compiled (tests/test_quant_triton.py with TRITON_INTERPRET=0)."""
    from minillm.bench.gguf_export import export
    from minillm.config import default_model_path

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_quant_triton.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode:
        raise AssertionError("\n".join(run.stdout.strip().splitlines()[-30:]))
    batch, result = prompts(args.n, 16, 128, seed=3), {"kernel_tests": run.stdout.strip().splitlines()[-1]}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, options in [
            ("int8", None, {"quantization": "int8"}),
            ("q4_1", export(default_model_path(), Path(tmp), "q4_1"), {}),
        ]:
            ref, s_ref = greedy(engine(args, model, dtype="float32", native_kernels=False, **options), batch)
            out, s_out = greedy(engine(args, model, dtype="float32", **options), batch)
            result[name] = {"seconds_torch": s_ref, "seconds_triton": s_out, "agreement": agreement(ref, out)}
    plain, _ = greedy(engine(args, dtype="float32"), batch)
    int8_kv, _ = greedy(engine(args, dtype="float32", kv_cache_dtype="int8"), batch)
    return result | {"kv_cache_int8": agreement(plain, int8_kv)}


def check_kv_budget(args) -> dict:
    if args.device != "cuda":
        return {"skipped": "the budget is measured on CUDA only"}
    utilization = 0.5
    llm = engine(args, gpu_memory_utilization=utilization, max_num_seqs=256)
    total = torch.cuda.get_device_properties(0).total_memory
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=64, seed=0)
    used = peak_bytes(lambda: llm.generate(prompts(512, 16, 384, seed=5), params, use_tqdm=False))  # + 64 <= 512
    held = torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_allocated() <= utilization * total, "the engine used more than its share"
    return {
        "num_kvcache_blocks": llm.model_runner.num_kvcache_blocks,
        "total_bytes": total,
        "allocated_bytes": held,
        "run_peak_above_allocated_bytes": used,
        "max_allocated_fraction": torch.cuda.max_memory_allocated() / total,
    }


def check_speculative(args) -> dict:
    from minillm.config import draft_model_path

    batch = prompts(args.n, 16, 128, seed=7)
    batch = [p + p[: len(p) // 2] for p in batch]  # repeats: lookup finds drafts
    plain, _ = greedy(engine(args, dtype="float32"), batch)
    result, utilization = {}, 0.3
    specs = {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
        "draft_model": {"method": "draft_model", "model": str(draft_model_path()), "num_speculative_tokens": 4},
    }
    for name, spec in specs.items():
        gc.collect()  # the engines before this one: out of the peak measured next
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        llm = engine(args, dtype="float32", speculative_config=spec)
        tokens, seconds = greedy(llm, batch)
        assert tokens == plain, f"{name} speculation changed greedy tokens: {agreement(plain, tokens)}"
        params = [
            SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=32, seed=i) for i in range(len(batch))
        ]
        runs = [[o.token_ids for o in llm.generate(batch, params, use_tqdm=False)] for _ in range(2)]
        assert runs[0] == runs[1], f"{name}: seeded sampling with speculation is not reproducible"
        result[name] = {"seconds": seconds, "acceptance_rate": llm.spec_stats.acceptance_rate}
        if args.device == "cuda":
            total = torch.cuda.get_device_properties(0).total_memory
            peak = torch.cuda.max_memory_allocated() / total
            assert peak <= utilization, f"{name}: the engine took {peak:.0%} of the device, over {utilization:.0%}"
            result[name]["max_allocated_fraction"] = peak
        del llm
    return result


def check_tensor_parallel(args) -> dict:
    if args.device != "cuda" or torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} CUDA device(s): tensor parallelism needs two"}
    batch = prompts(args.n, 16, 128, seed=6)
    one, s_one = greedy(engine(args, dtype="float32"), batch)
    with engine(args, dtype="float32", tensor_parallel_size=2) as tp:
        two, s_two = greedy(tp, batch)
    assert two == one, f"TP=2 changed greedy tokens: {agreement(one, two)}"
    return {"seconds_tp1": s_one, "seconds_tp2": s_two}


def check_bench(args) -> dict:
    result, model = {}, ["--random-size", "tiny"] if args.smoke else ["--model", REAL_MODEL]
    if not args.smoke:
        try:
            from minillm.utils.loader import resolve_model_path

            resolve_model_path(REAL_MODEL)
        except Exception as e:  # the package that carries its weights is not installed here
            model, result["note"] = [], f"{REAL_MODEL} not available ({e}); the default model instead"
    result["model"] = model[-1] if model else "default"
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in [
            ("ladder", ["--ladder", "--num-prompts", str(4 * args.n), "--ladder-slow-prompts", "4"]),
            ("roofline", ["--roofline"]),
        ]:
            out = Path(tmp) / f"{name}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "minillm.bench",
                    "--device",
                    args.device,
                    *model,
                    *extra,
                    "--output-json",
                    str(out),
                ],
                cwd=ROOT,
                check=True,
                timeout=240,
                stdout=subprocess.DEVNULL,
            )
            result[name] = json.loads(out.read_text())
    return result


CHECKS = {
    "tests": check_tests,
    "dtypes": check_dtypes,
    "graphs": check_graphs,
    "backends": check_backends,
    "long_context": check_long_context,
    "quantization": check_quantization,
    "kv_budget": check_kv_budget,
    "speculative": check_speculative,
    "tensor_parallel": check_tensor_parallel,
    "bench": check_bench,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="small sizes, to try the script itself (on a CPU)")
    parser.add_argument("--checks", default=",".join(CHECKS), help="comma-separated, from " + ", ".join(CHECKS))
    parser.add_argument("--output", default=str(ROOT / "notebooks" / "data" / "gpu_check.json"))
    args = parser.parse_args()
    args.n = 8 if args.smoke else 64
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on a machine with an NVIDIA GPU (or --device cpu --smoke)")
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "gpus": torch.cuda.device_count(),
        "checks": {},
    }
    for name in args.checks.split(","):
        if name == "tests" and args.device != "cuda":
            continue
        start = time.perf_counter()
        try:
            result = CHECKS[name](args)
            result = {"status": "skipped" if "skipped" in result else "passed", **result}
        except Exception as e:
            result = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:4000]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        report["checks"][name] = result
        print(
            f"{name:16s} {result['status']:7s} {result['seconds']:6.1f} s  {result.get('error', '')[:200]}", flush=True
        )
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)  # after every check: a run cut short keeps some
        Path(args.output).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(r["status"] != "failed" for r in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
