"""Every bad input of the README's table gets an error that names the parameter and its limit, before any
work starts, and leaves the engine as usable as a fresh one."""

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from minillm import LLM, SamplingParams, default_model_path

REFERENCE = ([5, 17, 3, 99, 42], SamplingParams(temperature=0, max_tokens=8))


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kvcache_blocks=16)


@pytest.fixture(scope="module")
def fresh_tokens():
    return LLM(num_kvcache_blocks=64).generate([REFERENCE[0]], REFERENCE[1], use_tqdm=False)[0].token_ids


# (what is wrong, the call, the error type, what the message must say: the parameter and the limit or fix)
REQUESTS = [
    ("empty prompt", lambda llm: llm.generate("", use_tqdm=False), ValueError, "the prompt is empty"),
    ("empty id list", lambda llm: llm.generate([[]], use_tqdm=False), ValueError, "the prompt is empty"),
    (
        "prompt as long as the context",
        lambda llm: llm.generate([[5] * 512], use_tqdm=False),
        ValueError,
        r"prompt \(512 tokens\).*exceeds max_model_len=512",
    ),
    (
        "prompt + max_tokens past the context",
        lambda llm: llm.generate([[5] * 10], SamplingParams(max_tokens=510), use_tqdm=False),
        ValueError,
        r"\+ max_tokens \(510\) = 520 exceeds max_model_len=512",
    ),
    (
        "token id outside the vocabulary",
        lambda llm: llm.generate([[5, 10**6]], use_tqdm=False),
        ValueError,
        r"unknown token ids \[1000000\]: ids must be integers in \[0, 1280\)",
    ),
    (
        "token id that is not an int",
        lambda llm: llm.generate([[5, 2.5]], use_tqdm=False),
        ValueError,
        r"unknown token ids \[2.5\]: ids must be integers",
    ),
    (
        "strings and ids mixed",
        lambda llm: llm.generate(["Once", [5, 6]], use_tqdm=False),
        ValueError,
        "the prompts mix strings and token id lists",
    ),
    (
        "a SamplingParams list of the wrong length",
        lambda llm: llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False),
        ValueError,
        "2 prompts but 3 sampling params",
    ),
    (
        "a request larger than the whole KV cache",
        lambda llm: llm.generate([[5] * 200], SamplingParams(max_tokens=100), use_tqdm=False),
        ValueError,
        r"KV cache \(16 blocks of 16 tokens\) cannot hold one request of 300 tokens \(19 blocks\)",
    ),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_a_bad_request_is_named_and_the_engine_stays_usable(llm, fresh_tokens, call, error, message):
    with pytest.raises(error, match=message):
        call(llm)
    assert llm.is_finished() and llm.block_manager.num_free_blocks == 16
    assert llm.generate([REFERENCE[0]], REFERENCE[1], use_tqdm=False)[0].token_ids == fresh_tokens


PARAMS = [
    ("max_tokens 0", dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    ("max_tokens negative", dict(max_tokens=-3), "max_tokens must be an integer >= 1, got -3"),
    ("temperature negative", dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    ("temperature NaN", dict(temperature=math.nan), "temperature must be a finite number >= 0.*nan"),
    ("temperature inf", dict(temperature=math.inf), "temperature must be a finite number >= 0.*inf"),
    ("top_p 0", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    ("top_p above 1", dict(top_p=1.5), r"top_p must be in \(0, 1\].*1.5"),
    ("top_k below -1", dict(top_k=-2), "top_k must be an integer >= -1"),
    ("top_k not an int", dict(top_k=2.5), "top_k must be an integer >= -1.*got 2.5"),
    ("max_tokens a bool", dict(max_tokens=True), "max_tokens must be an integer >= 1, got True"),
    ("seed not an int", dict(seed="7"), r"seed must be an integer in \[-9223372036854775808, 9223372036854775807\]"),
    ("seed past int64", dict(seed=2**63), r"seed must be .*\(an int64\) or None, got 9223372036854775808"),
    ("seed below int64", dict(seed=-(2**63) - 1), "seed must be .*got -9223372036854775809"),
    (
        "stop token id negative",
        dict(stop_token_ids=[5, -1]),
        r"stop_token_ids must be token ids \(integers >= 0\), got \[-1\]",
    ),
    (
        "too many stop token ids",
        dict(stop_token_ids=range(1025)),
        "stop_token_ids has 1025 ids, more than 1024: give at most 1024",
    ),
]


@pytest.mark.parametrize("kwargs, message", [r[1:] for r in PARAMS], ids=[r[0] for r in PARAMS])
def test_a_bad_sampling_parameter_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_temperature_bounds_as_vllms():
    """0 stays greedy; a positive temperature below 0.01 is raised to it (logits / 1e-5 overflow); the int64 seeds
    at both ends are taken; -1 as top_k means no limit (0)."""
    assert [SamplingParams(temperature=t).temperature for t in (0, 1e-9, 0.005, 0.01, 0.7)] == [
        0,
        0.01,
        0.01,
        0.01,
        0.7,
    ]
    assert [SamplingParams(seed=s).seed for s in (-(2**63), 2**63 - 1)] == [-(2**63), 2**63 - 1]
    assert SamplingParams(top_k=-1).top_k == 0


ENGINES = [
    (
        "KV budget smaller than one block",
        dict(kvcache_memory_bytes=1000),
        ValueError,
        r"no memory is left for the KV cache \(one block needs 32768 bytes\): raise kvcache_memory_bytes",
    ),
    (
        "block size not a power of two",
        dict(kvcache_block_size=12),
        ValueError,
        "kvcache_block_size must be a power of two",
    ),
    ("block size zero", dict(kvcache_block_size=0), ValueError, "kvcache_block_size must be a positive integer"),
    ("unknown engine option", dict(max_num_seq=4), TypeError, r"unknown engine option\(s\) \['max_num_seq'\]"),
    (
        "tensor_parallel_size not dividing the KV heads",
        dict(tensor_parallel_size=4),
        ValueError,
        r"tensor_parallel_size=4 does not divide the model's key/value heads \(2\): choose one of \[1, 2\]",
    ),
    (
        "tensor_parallel_size beyond the CPU cores",
        dict(tensor_parallel_size=2, cpu_count=1),
        ValueError,
        r"tensor_parallel_size=2 exceeds the 1 CPU cores of this machine: one rank per CPU core, so at most 1",
    ),
    (
        "tensor_parallel_size zero",
        dict(tensor_parallel_size=0),
        ValueError,
        "tensor_parallel_size must be a positive integer",
    ),
]


@pytest.mark.parametrize("options, error, message", [r[1:] for r in ENGINES], ids=[r[0] for r in ENGINES])
def test_a_bad_engine_option_is_named(monkeypatch, options, error, message):
    options = dict(options)
    if "cpu_count" in options:  # a machine with fewer cores than this one
        monkeypatch.setattr(os, "cpu_count", lambda n=options.pop("cpu_count"): n)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a worker process was started"))
    with pytest.raises(error, match=message):
        LLM(**options)


def broken_checkpoints(root: Path) -> dict[str, Path]:
    """Copies of the default model, each broken one way."""
    good = default_model_path()
    made = {}
    for name in (
        "no config",
        "no weights",
        "truncated weights",
        "corrupt weights",
        "unsupported architecture",
        "quantized weights",
    ):
        made[name] = shutil.copytree(good, root / name.replace(" ", "_"))
    (made["no config"] / "config.json").unlink()
    (made["no weights"] / "model.safetensors").unlink()
    data = (good / "model.safetensors").read_bytes()
    (made["truncated weights"] / "model.safetensors").write_bytes(data[: len(data) // 2])
    (made["corrupt weights"] / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json" + data)
    config = made["unsupported architecture"] / "config.json"
    config.write_text(config.read_text().replace("Qwen3ForCausalLM", "MambaForCausalLM"))
    config = made["quantized weights"] / "config.json"
    config.write_text(
        config.read_text().replace("{", '{"quantization_config": {"quant_method": "gptq", "bits": 4},', 1)
    )
    return made


CHECKPOINTS = [
    ("a path that does not exist", FileNotFoundError, "no checkpoint directory at '.*does-not-exist'"),
    ("no config", FileNotFoundError, "has no config.json"),
    ("no weights", FileNotFoundError, r"no \*.safetensors file in"),
    ("truncated weights", ValueError, "model.safetensors is not a readable safetensors file.*truncated or corrupt"),
    ("corrupt weights", ValueError, "model.safetensors is not a readable safetensors file.*truncated or corrupt"),
    ("unsupported architecture", ValueError, "unsupported architecture 'MambaForCausalLM': minillm supports"),
    (
        "quantized weights",
        ValueError,
        r"weights are stored quantized \(quantization_config: quant_method 'gptq'\)"
        ".*use the unquantized checkpoint",
    ),
]


@pytest.mark.parametrize("case, error, message", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_a_bad_checkpoint_is_named(tmp_path, case, error, message):
    path = broken_checkpoints(tmp_path).get(case, tmp_path / "does-not-exist")
    with pytest.raises(error, match=message):
        LLM(path, num_kvcache_blocks=8)
