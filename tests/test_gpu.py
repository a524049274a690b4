"""The CUDA path: the same greedy tokens as the CPU, with the KV cache sized from free device memory."""
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
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5)
    assert llm.model_runner.num_kvcache_blocks > 1000
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected


def test_cuda_seeded_sampling_is_reproducible(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    first = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].token_ids
    crowd = llm.generate([[9, 9, 9], [1, 2, 3]], [SamplingParams(max_tokens=5), params], use_tqdm=False)
    assert crowd[1].token_ids == first
    assert torch.cuda.is_available()


@pytest.mark.parametrize("options", [{"enforce_eager": True, "compile_layers": False},
                                     {"enforce_eager": False, "compile_layers": False},
                                     {"enforce_eager": False, "compile_layers": True}])
def test_cuda_graphs_and_compiled_layers_equal_naive_across_buckets(tiny_checkpoint, options):
    """Nine requests ending one after another: decode batches 9 to 1 (8 a bucket, 5-7 padded to 8, 3 to 4)
    replayed from CUDA graphs, with and without the layers compiled, give the naive loop's greedy tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 17, 5, 12, 30, 7, 21, 3)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(9)]
    llm = LLM(tiny_checkpoint, device="cuda", gpu_memory_utilization=0.5, max_num_seqs=16, **options)
    mode = llm.model_runner.graph_mode
    assert mode.startswith("eager" if options["enforce_eager"] else "CUDA graphs in buckets [1, 2, 4, 8, 16]")
    outputs = llm.generate(prompts, params, use_tqdm=False)
    cpu = build_model(tiny_checkpoint)
    assert [o.token_ids for o in outputs] == [list(generate_naive(cpu, p, sp.max_tokens)) for p, sp in
                                              zip(prompts, params)]
