"""minillm.kernels.triton compiled on CUDA: each kernel equals its torch reference (bf16 and fp32) and is timed against
it at a realistic size (median times written to results/gpu/kernel_times.json and printed); the engine on the
Triton backend, eager and with CUDA graphs, gives the naive loop's greedy tokens. scripts/gpu_check.sh runs
these with TRITON_INTERPRET=0, as the exercise tests otherwise switch the interpreter on for the session."""

import json
from pathlib import Path

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.kernels import triton as kernels
from minillm.layers.attention import paged_attention as ref
from minillm.layers.rms_norm import add_rms_norm, rms_norm
from minillm.models import build_model
from minillm.naive import generate_naive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        kernels.INTERPRET,
        reason="TRITON_INTERPRET=1 makes every kernel run in the interpreter: scripts/gpu_check.sh sets it to 0",
    ),
]
TIMES = Path(__file__).parents[1] / "results" / "gpu" / "kernel_times.json"


def median_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def record(name: str, triton_ms: float, torch_ms: float) -> None:
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[name] = {
        "triton_ms": round(triton_ms, 4),
        "torch_ms": round(torch_ms, 4),
        "speedup": round(torch_ms / triton_ms, 2),
        "device": torch.cuda.get_device_name(),
    }
    TIMES.write_text(json.dumps(times, indent=1) + "\n")
    print(f"{name}: triton {triton_ms:.4f} ms, torch {torch_ms:.4f} ms ({torch_ms / triton_ms:.2f}x)")


def decode_case(dtype, seqs=64, heads=32, kv_heads=8, head_dim=128, block_size=16, max_len=1024):
    g = torch.Generator(device="cuda").manual_seed(0)
    lens = torch.randint(1, max_len + 1, (seqs,), generator=g, device="cuda")
    width = -(-max_len // block_size)
    num_blocks = seqs * width + 1
    tables = torch.randperm(num_blocks - 1, generator=g, device="cuda")[: seqs * width].view(seqs, width)
    cache = lambda: torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g, device="cuda", dtype=dtype)
    q = torch.randn(seqs, heads, head_dim, generator=g, device="cuda", dtype=dtype)
    return q, cache(), cache(), tables, lens


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_paged_decode_attention_equals_torch_and_is_timed(dtype, tol):
    q, k_cache, v_cache, tables, lens = decode_case(dtype)
    scale = q.shape[-1] ** -0.5
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    torch.testing.assert_close(
        out, ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale), atol=tol, rtol=tol
    )
    record(
        f"paged_decode_attention 64 seqs x <=1024 keys, 32/8 heads, {dtype}",
        median_ms(lambda: kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)),
        median_ms(lambda: ref.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)),
    )


def test_store_kvcache_equals_torch_and_is_timed():
    k_cache, v_cache = torch.randn(2, 4097, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(4096 * 16, device="cuda")[:256]
    slots[::7] = -1
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    ref.store_kvcache(k, v, expected_k, expected_v, slots)
    kernels.store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    record(
        "store_kvcache 256 tokens, 8x128, bf16",
        median_ms(lambda: kernels.store_kvcache(k, v, k_cache, v_cache, slots)),
        median_ms(lambda: ref.store_kvcache(k, v, k_cache, v_cache, slots)),
    )


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_rms_norms_equal_torch_and_are_timed(dtype, tol):
    x, residual = torch.randn(2, 4096, 4096, device="cuda", dtype=dtype)
    weight = torch.randn(4096, device="cuda", dtype=dtype)
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6), atol=tol, rtol=tol)
    normed, new_residual = kernels.add_rms_norm(x, residual, weight, 1e-6)
    expected_normed, expected_residual = add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(new_residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(normed, expected_normed, atol=tol, rtol=tol)
    record(
        f"rms_norm 4096x4096 {dtype}",
        median_ms(lambda: kernels.rms_norm(x, weight, 1e-6)),
        median_ms(lambda: rms_norm(x, weight, 1e-6)),
    )
    record(
        f"add_rms_norm 4096x4096 {dtype}",
        median_ms(lambda: kernels.add_rms_norm(x, residual, weight, 1e-6)),
        median_ms(lambda: add_rms_norm(x, residual, weight, 1e-6)),
    )


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "cuda-graphs"])
def test_engine_on_the_triton_backend_equals_naive(tiny_checkpoint, enforce_eager):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 17, 9, 30, 5)]
    params = [SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(5)]
    llm = LLM(
        tiny_checkpoint,
        device="cuda",
        gpu_memory_utilization=0.5,
        max_num_seqs=8,
        attention_backend="triton",
        enforce_eager=enforce_eager,
    )
    assert llm.model_runner.platform.attention_backend.name == "triton"
    outputs = llm.generate(prompts, params, use_tqdm=False)
    cpu = build_model(tiny_checkpoint)
    assert [o.token_ids for o in outputs] == [
        list(generate_naive(cpu, p, sp.max_tokens)) for p, sp in zip(prompts, params)
    ]
