"""The CUDA path's choices, checked on a CPU (tests/test_gpu.py and scripts/gpu_check.sh run them on a GPU): the
KV-cache budget's warm-up goes through a whole step at its largest (the prefill, the logits of max_num_seqs rows,
a top-k/top-p sample) and the graph pool's estimate is a forward of the largest bucket's rows; the torch backend
is refused in CUDA graphs past a safe width; dtype "auto" is float32 on a CPU and 16-bit on CUDA."""

from types import SimpleNamespace

import pytest
import torch

from minillm import LLM
from minillm.config import Config, ModelConfig, default_model_path, resolve_dtype
from minillm.engine.graphs import TORCH_GRAPH_GATHER_BYTES, why_eager
from minillm.engine.kv_budget import dummy_forward, warmup
from minillm.layers.sampler import Sampler


def test_warmup_runs_a_whole_step_at_its_largest(monkeypatch):
    llm = LLM(max_num_seqs=24, max_num_batched_tokens=96, max_model_len=64, num_kvcache_blocks=16)
    runner, seen = llm.model_runner, {}
    forward = type(runner.model).forward

    def spy_forward(model, input_ids, positions, intermediate=None):
        seen.setdefault("forwards", []).append(len(input_ids))
        return forward(model, input_ids, positions, intermediate)

    def spy_sampler(sampler, logits, md):
        seen["logits"], seen["truncated"] = tuple(logits.shape), md.truncated_rows.tolist()
        return Sampler.forward(sampler, logits, md)

    monkeypatch.setattr(type(runner.model), "forward", spy_forward)
    monkeypatch.setattr(Sampler, "__call__", spy_sampler)
    warmup(runner, llm.config)
    assert seen["forwards"] == [64]  # one sequence of max_model_len (the largest prompt that fits 96 tokens)
    assert seen["logits"] == (24, runner.model.config.vocab_size)
    assert seen["truncated"] == list(range(24))  # every row takes the sort of top-k/top-p
    hidden = dummy_forward(runner, 16, 1)
    assert hidden.shape == (16, runner.model.config.hidden_size) and seen["forwards"][-1] == 16
    assert torch.isfinite(hidden).all()


def cuda_runner(backend: str, **config):
    """What why_eager reads of a runner on CUDA, without a GPU."""
    model = SimpleNamespace(config=ModelConfig.from_pretrained(default_model_path()))
    return SimpleNamespace(
        device=torch.device("cuda"),
        platform=SimpleNamespace(attention_backend=SimpleNamespace(name=backend), replays_decode=True),
        model=model,
        group=None,
        pp=None,
        block_size=16,
        dtype=torch.bfloat16,
    ), Config(**config)


def test_torch_backend_graphs_are_refused_past_a_safe_width():
    c = ModelConfig.from_pretrained(default_model_path())
    per_row = 2 * c.num_key_value_heads * c.head_dim * 2  # a position's key and value in bf16
    fits = TORCH_GRAPH_GATHER_BYTES // (256 * per_row) // 16 * 16  # positions that 256 rows may copy
    runner, config = cuda_runner("torch", max_model_len=fits)
    assert why_eager(runner, config) is None
    runner, config = cuda_runner("torch", max_model_len=fits + 16)
    assert "would copy 1.0 GiB of keys and values per layer (256 rows" in why_eager(runner, config)
    runner, config = cuda_runner("torch", max_model_len=fits + 16, enforce_eager=False)
    with pytest.raises(ValueError, match="use attention_backend='triton'"):
        why_eager(runner, config)
    runner, config = cuda_runner("triton", max_model_len=40960, enforce_eager=False)  # reads the blocks in place
    assert why_eager(runner, config) is None


@pytest.mark.parametrize(
    "device, checkpoint, expected",
    [
        ("cpu", "bfloat16", "float32"),
        ("cpu", None, "float32"),
        ("cuda", "float32", "bfloat16"),
        ("cuda", None, "bfloat16"),
        ("cuda", "float16", "float16"),
        ("cuda:1", "bfloat16", "bfloat16"),
    ],
)
def test_dtype_auto_is_float32_on_a_cpu_and_16_bit_on_cuda(device, checkpoint, expected):
    assert resolve_dtype("auto", device, checkpoint) == expected
    assert resolve_dtype("float32", device, checkpoint) == "float32"


def test_an_engine_resolves_auto_and_refuses_an_unknown_dtype():
    assert Config().dtype == "auto"
    llm = LLM(num_kvcache_blocks=16)
    assert llm.config.dtype == "float32" and llm.model_runner.model.lm_head.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of float32, bfloat16, float16, got 'fp8'"):
        LLM(num_kvcache_blocks=16, dtype="fp8")
