"""The CUDA path: the same greedy tokens as the CPU in float32, with the KV cache sized from free device memory;
bfloat16 by default; prefill over a long cached prefix without the scores in memory."""

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.models import build_model
from minillm.naive import generate_naive

pytestmark = pytest.mark.gpu


def test_cuda_engine_matches_cpu_naive(tiny_checkpoint):
    prompts = [[3, 4, 5, 6], list(range(40, 90)), [7] * 9]
    cpu = build_model(tiny_checkpoint)
    expected = [list(generate_naive(cpu, p, 16)) for p in prompts]
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5, dtype="float32")
    assert llm.model_runner.num_kvcache_blocks > 1000
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected


def test_cuda_seeded_sampling_is_reproducible(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5, dtype="float32")
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    first = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].token_ids
    crowd = llm.generate([[9, 9, 9], [1, 2, 3]], [SamplingParams(max_tokens=5), params], use_tqdm=False)
    assert crowd[1].token_ids == first
    other = llm.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=16, seed=4), use_tqdm=False)
    assert other[0].token_ids != first, "another seed draws other tokens (16 draws from a random model's vocabulary)"


def test_dtype_auto_is_bfloat16_on_cuda(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5)
    assert llm.config.dtype == "bfloat16" and llm.model_runner.kv_cache.dtype == torch.bfloat16
    out = llm.generate([[3, 4, 5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_of_a_4k_chunk_over_32k_keys_never_holds_the_scores(dtype):
    """32 heads sharing 8 KV heads: the scores would be 32 x 4096 x 32768 numbers (8.6 GB in bf16)."""
    from minillm.layers.attention.paged_attention import prefill_attention

    q = torch.randn(4096, 32, 128, dtype=dtype, device="cuda")
    k, v = (torch.randn(32768, 8, 128, dtype=dtype, device="cuda") for _ in range(2))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = prefill_attention(q, k, v, [0, 4096], [0, 32768], 128**-0.5)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < 2**30, f"prefill over a prefix allocated {extra / 2**30:.1f} GiB"
    tail = torch.nn.functional.scaled_dot_product_attention(  # the last 64 queries against a dense reference
        q[None, -64:].transpose(1, 2).float(),
        k[None].transpose(1, 2).float(),
        v[None].transpose(1, 2).float(),
        attn_mask=torch.ones(64, 32768, dtype=torch.bool, device="cuda").tril(32768 - 64),
        enable_gqa=True,
    )[0].transpose(0, 1)
    torch.testing.assert_close(out[-64:].float(), tail, atol=2e-2 if dtype == torch.bfloat16 else 1e-4, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {"enforce_eager": True, "compile_layers": False},
        {"enforce_eager": False, "compile_layers": False},
        {"enforce_eager": False, "compile_layers": True},
    ],
)
def test_cuda_graphs_and_compiled_layers_equal_naive_across_buckets(tiny_checkpoint, options):
    """Nine requests ending one after another: decode batches 9 to 1 (8 a bucket, 5-7 padded to 8, 3 to 4)
    replayed from CUDA graphs, with and without the layers compiled, give the naive loop's greedy tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 17, 5, 12, 30, 7, 21, 3)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(9)]
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5, max_num_seqs=16, dtype="float32", **options)
    mode = llm.model_runner.graph_mode
    assert mode.startswith("eager" if options["enforce_eager"] else "CUDA graphs in buckets [1, 2, 4, 8, 16]")
    outputs = llm.generate(prompts, params, use_tqdm=False)
    cpu = build_model(tiny_checkpoint)
    assert [o.token_ids for o in outputs] == [
        list(generate_naive(cpu, p, sp.max_tokens)) for p, sp in zip(prompts, params)
    ]
