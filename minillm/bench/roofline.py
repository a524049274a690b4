"""The roofline: how close decoding comes to what the machine can do, measured on the machine itself.

A decode step at batch 1 reads every weight (and the request's KV cache) once for one token: it is bound by
memory bandwidth, so its ceiling is bandwidth / bytes per token. At batch B the same weights serve B tokens,
and the step becomes bound by matmul FLOP/s (2 FLOPs per parameter per token). The tool measures both ceilings
here: streaming an array far larger than the last-level cache, and a large fp32 matmul.
"""

import time

import torch
import torch.nn.functional as F

from minillm.bench import llamacpp, workloads
from minillm.bench.backends import Models, run_minillm
from minillm.bench.models import num_parameters
from minillm.bench.models import weight_bytes as model_weight_bytes
from minillm.config import PACKED_PREFETCH, Config, ModelConfig, resolve_dtype
from minillm.engine.kv_cache import kv_cache_bytes_per_token
from minillm.kernels.cpu import cpu_kernels, linear_cpu, linear_packed
from minillm.kernels.packing import empty_packed, pack_weight
from minillm.utils.autotune import cpu_model, last_level_cache_bytes

MATVEC_METHODS = {"torch_matvec_gb_s": "F.linear matrix-vector", "matvec_gb_s": "packed matrix-vector"}


def describe(bandwidth: dict) -> str:
    """memory_bandwidth's result in one line: each method's GB/s and the array's size."""
    matvec = "".join(f", {bandwidth[key]:.1f} GB/s {name}" for key, name in MATVEC_METHODS.items() if key in bandwidth)
    return (
        f"{bandwidth['read_gb_s']:.1f} GB/s sum, {bandwidth['copy_gb_s']:.1f} GB/s copy{matvec} "
        f"({bandwidth['array_bytes'] / 2**30:.2f} GiB array)"
    )


def best_seconds(fn, repeats: int, device: str = "cpu") -> float:
    """The fastest of `repeats` timed calls, after one untimed call: the least disturbed by other work. On CUDA each
    call is waited for (kernels run asynchronously)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def memory_bandwidth(nbytes: int | None = None, repeats: int = 5, device: str = "cpu") -> dict:
    """GB/s streaming an fp32 array of nbytes on `device` (default: 1 GiB or four times the last-level cache, the
    larger, so that no method reads from the cache), best of several: read by a sum, copied (read + write), and on a
    CPU read as a matrix by a matrix-vector product, torch's (F.linear) and, where built, the CPU backend's packed
    kernel with each of its prefetches (a packed weight in 2 MiB pages, as the engine's are). Which method is
    fastest differs between CPUs; the fastest, gb_s, is the ceiling decode is measured against."""
    on_cpu = torch.device(device).type == "cpu"
    nbytes = nbytes or max(2**30, 4 * last_level_cache_bytes() if on_cpu else 0)
    a = torch.ones(nbytes // 4, device=device)
    b = torch.empty_like(a)
    result = dict(
        array_bytes=nbytes,
        read_gb_s=nbytes / best_seconds(a.sum, repeats, device) / 1e9,
        copy_gb_s=2 * nbytes / best_seconds(lambda: b.copy_(a), repeats, device) / 1e9,
    )
    if on_cpu:
        del b
        out = nbytes // 4 // 4096
        w, x = a[: out * 4096].view(out, 4096), torch.ones(1, 4096)
        result["torch_matvec_gb_s"] = w.nbytes / best_seconds(lambda: F.linear(x, w), repeats) / 1e9
    if on_cpu and cpu_kernels():
        del a, w
        packed = empty_packed(out, 4096).fill_(1.0)
        result["matvec_gb_s"] = max(
            packed.nbytes / best_seconds(lambda: linear_packed(x, packed, out_features=out, prefetch=p), repeats) / 1e9
            for p in PACKED_PREFETCH.values()
        )
    return result | dict(gb_s=max(v for name, v in result.items() if name.endswith("_gb_s")))


@torch.inference_mode()
def matmul_flops(n: int = 2048, repeats: int = 5, device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """FLOP/s of an n×n by n×n matmul (2n³ FLOPs) in `dtype` on `device`, best of several: torch.mm (BLAS, or
    cuBLAS on the tensor cores in bfloat16) and, on a CPU where it is built, the CPU backend's matmul on a packed
    weight. The faster of them, flops, is the ceiling batched decode is measured against."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty_like(a)
    result = dict(n=n, mm_flops=2 * n**3 / best_seconds(lambda: torch.mm(a, b, out=c), repeats, device))
    if a.is_cpu and dtype == torch.float32 and cpu_kernels():
        w = b.T.contiguous()  # a @ b is linear(a, bᵀ)
        packed = pack_weight(w)
        result["packed_flops"] = 2 * n**3 / best_seconds(lambda: linear_cpu(a, w, None, packed), repeats)
    return result | dict(flops=max(v for name, v in result.items() if name.endswith("_flops")))


def decode_rate(models: Models, batch: int, pool: list[int], args) -> dict:
    """Decode tokens/s of the engine in its fastest configuration (decode steps compiled; the warm-up compiles
    the bucket) at a batch of `batch` equal requests: sequences decoded per second in its decode steps (prefill
    steps left out), from the step breakdown. With --repeats N, the fastest of N runs on other prompts, as the
    ceilings are the best of several."""
    warmup = workloads.fixed(batch, args.input_len, 4, pool, args.seed + 1)
    runs = []
    for r in range(getattr(args, "repeats", 1)):
        workload = workloads.fixed(batch, args.input_len, args.output_len, pool, workloads.round_seed(args.seed, r))
        decode = run_minillm(models, workload, warmup, args, models.compiled_engine).info["breakdown"]["decode"]
        runs.append(
            dict(
                batch_size=batch,
                decode_step_ms=decode["mean_step_ms"],
                tokens_per_second=decode["mean_batch_size"] / decode["mean_step_ms"] * 1000,
            )
        )
    best = max(runs, key=lambda run: run["tokens_per_second"])
    return best | (dict(rounds_tokens_per_second=[run["tokens_per_second"] for run in runs]) if len(runs) > 1 else {})


def run(path, engine_options: dict, pool: list[int], args) -> dict:
    """Both ceilings, then batch-1 decode against bandwidth and batch --roofline-batch decode against FLOP/s."""
    config = ModelConfig.from_pretrained(path)
    dtype = getattr(torch, resolve_dtype(engine_options.get("dtype", Config.dtype), args.device, config.dtype))
    cuda = torch.device(args.device).type == "cuda"
    before = memory_bandwidth(args.roofline_bytes, device=args.device)
    matmul = matmul_flops(8192 if cuda else 2048, device=args.device, dtype=dtype)
    packed = f", {matmul['packed_flops'] / 1e9:.1f} packed" if "packed_flops" in matmul else ""
    print(
        f"memory bandwidth: {describe(before)}; {str(dtype)[6:]} matmul: {matmul['mm_flops'] / 1e9:.1f} GFLOP/s "
        f"torch.mm{packed}"
    )
    params = num_parameters(path)
    models = Models(path, engine_options)
    choices = getattr(models.compiled_engine.model_runner.platform.linear_method, "choices", None)
    if choices is not None:  # the kernels the engine chose for this CPU, and what it measured
        print(f"linear kernels on {cpu_model()}:\n{choices.summary()}")
    weight_bytes = model_weight_bytes(models.compiled_engine.model_runner.model)  # as stored: quantized or not
    # batch 1: each token reads every weight and its request's KV cache, on average half-way through the output
    kv_bytes = (args.input_len + args.output_len / 2) * kv_cache_bytes_per_token(config, dtype)
    one = decode_rate(models, 1, pool, args)
    after = memory_bandwidth(args.roofline_bytes, device=args.device)  # a shared machine's bandwidth moves
    bandwidth = {key: max(value, after[key]) for key, value in before.items()} | dict(
        before_gb_s=before["gb_s"], after_gb_s=after["gb_s"]
    )
    print(f"memory bandwidth again, after batch-1 decode: {describe(after)}; the best of both counts")
    if max(before["gb_s"], after["gb_s"]) > 1.15 * min(before["gb_s"], after["gb_s"]):
        print(
            "  (the bandwidth changed by more than 15% during the run: another load shares this machine's memory, "
            "and the fractions below are uncertain: run it again and compare)"
        )
    one |= dict(
        weight_bytes_per_token=weight_bytes,
        kv_bytes_per_token=kv_bytes,
        achieved_gb_s=(weight_bytes + kv_bytes) * one["tokens_per_second"] / 1e9,
    )
    one["fraction_of_bandwidth"] = one["achieved_gb_s"] / bandwidth["gb_s"]
    many = decode_rate(models, args.roofline_batch, pool, args)
    many |= dict(flops_per_token=2 * params, flops=2 * params * many["tokens_per_second"])
    many["fraction_of_matmul_flops"] = many["flops"] / matmul["flops"]
    best_of = f", the fastest of {args.repeats} runs each" if getattr(args, "repeats", 1) > 1 else ""
    print(
        f"decode steps compiled per bucket{best_of}\n"
        f"batch-1 decode: {one['tokens_per_second']:.1f} tok/s x {(weight_bytes + kv_bytes) / 1e6:.1f} MB/token "
        f"({weight_bytes / params:.2f} bytes per weight) "
        f"= {one['achieved_gb_s']:.1f} GB/s, {one['fraction_of_bandwidth']:.0%} of the measured bandwidth\n"
        f"batch-{args.roofline_batch} decode: {many['tokens_per_second']:.1f} tok/s x 2 x {params / 1e6:.1f}M "
        f"parameters = {many['flops'] / 1e9:.1f} GFLOP/s, {many['fraction_of_matmul_flops']:.0%} of the matmul's"
    )
    record = dict(
        roofline=dict(memory_bandwidth=bandwidth, matmul=matmul, num_parameters=params, batch_1=one, batched=many)
        | (dict(kernel_choices=choices.made) if choices is not None else {})
    )
    if getattr(args, "peer", None) == "llama-cpp":  # a warm-up prompt, then 5: medians of 5
        prompts = workloads.fixed(6, args.input_len, args.output_len, pool, args.seed + 2).prompts
        record |= llamacpp.compare(path, models.compiled_engine, prompts, args.output_len, engine_options)
    return record
