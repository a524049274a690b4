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
