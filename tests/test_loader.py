"""The loader says which tensor or architecture is wrong and what it expected."""

import json

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

from minillm.config import ModelConfig
from minillm.models import build_model


@pytest.fixture
def ckpt(tmp_path):
    make_checkpoint("qwen3-mha-untied", tmp_path)
    return tmp_path


def rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_tensor_is_named(ckpt):
    rewrite(ckpt, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.self_attn.v_proj.weight'\]"):
        build_model(ckpt)


def test_unexpected_tensor_is_named(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"unexpected tensors \['model.layers.0.extra.weight'\]"):
        build_model(ckpt)


@pytest.mark.parametrize(
    "name,shape,expected",
    [
        ("model.layers.0.mlp.up_proj.weight", (160, 32), r"\(160, 32\), expected \(160, 64\)"),  # a packed shard
        ("model.layers.0.self_attn.k_proj.weight", (16, 64), r"\(16, 64\), expected \(64, 64\)"),  # too few rows
        ("model.layers.0.self_attn.o_proj.weight", (64, 48), r"\(64, 48\), expected \(64, 64\)"),
        ("model.embed_tokens.weight", (300, 64), r"\(300, 64\), expected \(256, 64\)"),
    ],
)
def test_wrong_shape_names_tensor_and_expected_shape(ckpt, name, shape, expected):
    rewrite(ckpt, lambda t: t.update({name: torch.zeros(shape)}))
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*" + expected):
        build_model(ckpt)


def test_unsupported_architecture_is_named(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unsupported architecture 'GPT2LMHeadModel'.*Qwen3ForCausalLM"):
        build_model(ckpt)


def test_not_a_directory_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at"):
        build_model(tmp_path / "no-such-model")


def test_tied_checkpoint_shares_one_table(tmp_path):
    make_checkpoint("qwen3-gqa-tied", tmp_path)
    model = build_model(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


# --- what config.json may say: accepted, ignored, refused (issue 29) ---------------------------------------------


def edit_config(path, edit):
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("name", ["llama-gqa-linear-rope", "qwen2-gqa-bias", "qwen3-gqa-tied"])
def test_model_type_stands_in_for_a_missing_architectures_list(tmp_path, name):
    """Converted checkpoints often carry only model_type: the same model, the same logits."""
    hf = make_checkpoint(name, tmp_path)
    edit_config(tmp_path, lambda cfg: cfg.pop("architectures"))
    model = build_model(tmp_path)
    assert model.config.architecture == type(hf).__name__
    ids = torch.tensor([3, 17, 42, 99, 7])
    with torch.no_grad():
        got = model.compute_logits(model(ids, torch.arange(len(ids))))
        assert (got - hf(ids[None]).logits[0]).abs().max().item() < 1e-4


def small_config(**fields) -> dict:
    cfg = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    cfg.update(fields)
    return {k: v for k, v in cfg.items() if v is not None}


ACCEPTED = [
    ("model_type llama, no architectures", dict(architectures=None), "LlamaForCausalLM"),
    ("model_type qwen2, empty architectures", dict(architectures=[], model_type="qwen2"), "Qwen2ForCausalLM"),
    (
        "a dequantized GGUF's quantization_config",
        dict(quantization_config={"quant_method": "gguf", "dequantize": True}),
        "LlamaForCausalLM",
    ),
    ("hidden_act swish (silu's other name)", dict(hidden_act="swish"), "LlamaForCausalLM"),
    (
        "a sliding window switched off",
        dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=False, sliding_window=4096, max_window_layers=0),
        "Qwen2ForCausalLM",
    ),
    (
        "a window on no layer",
        dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=4096, max_window_layers=2),
        "Qwen2ForCausalLM",
    ),
    ("layer_types all full", dict(layer_types=["full_attention"] * 2), "LlamaForCausalLM"),
]


@pytest.mark.parametrize("fields, arch", [a[1:] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_config_fields_that_are_accepted(fields, arch):
    assert ModelConfig.from_dict(small_config(**fields)).architecture == arch


REFUSED = [
    (
        "unknown model_type, no architectures",
        dict(architectures=None, model_type="gpt2"),
        r"unsupported model_type 'gpt2' \(config.json lists no architectures\): minillm supports model_type llama, "
        "qwen2, qwen3",
    ),
    ("no architectures, no model_type", dict(architectures=None, model_type=None), "unsupported model_type None"),
    (
        "another architecture",
        dict(architectures=["MistralForCausalLM"]),
        "unsupported architecture 'MistralForCausalLM': minillm supports",
    ),
    *[
        (
            f"{method} weights",
            dict(quantization_config={"quant_method": method, "bits": 4}),
            rf"weights are stored quantized \(quantization_config: quant_method '{method}'\).*use the unquantized "
            r"checkpoint, or dequantize this one \(in transformers: from_pretrained, model.dequantize\(\), save_pretrained\)",
        )
        for method in ("gptq", "awq", "bitsandbytes", "fp8", "compressed-tensors")
    ],
    ("another activation", dict(hidden_act="gelu"), r"unsupported hidden_act 'gelu': minillm's MLP is SwiGLU"),
    (
        "a sliding window",
        dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=4096, max_window_layers=1),
        r"sliding-window attention is not supported .*sliding_window 4096.*set use_sliding_window to false",
    ),
    (
        "sliding layer_types",
        dict(layer_types=["sliding_attention", "full_attention"]),
        r"sliding-window attention is not supported \(layer_types \['sliding_attention'\]",
    ),
    (
        "yarn rope scaling",
        dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
        "unsupported rope scaling 'yarn': minillm implements default, linear, llama3",
    ),
    ("partial rotary", dict(partial_rotary_factor=0.5), "unsupported partial_rotary_factor"),
]


@pytest.mark.parametrize("fields, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_config_fields_that_are_refused_say_why_and_what_to_do(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(small_config(**fields))


def test_a_quantized_checkpoint_is_refused_before_its_weights_are_read(ckpt):
    edit_config(ckpt, lambda cfg: cfg.update(quantization_config={"quant_method": "awq", "bits": 4}))
    (ckpt / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(ValueError, match="quant_method 'awq'"):
        build_model(ckpt)
