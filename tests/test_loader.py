"""The loader says which tensor or architecture is wrong and what it expected."""
import json

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

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


@pytest.mark.parametrize("name,shape,expected", [
    ("model.layers.0.mlp.up_proj.weight", (160, 32), r"\(160, 32\), expected \(160, 64\)"),  # a packed shard
    ("model.layers.0.self_attn.k_proj.weight", (16, 64), r"\(16, 64\), expected \(64, 64\)"),  # too few rows
    ("model.layers.0.self_attn.o_proj.weight", (64, 48), r"\(64, 48\), expected \(64, 64\)"),
    ("model.embed_tokens.weight", (300, 64), r"\(300, 64\), expected \(256, 64\)"),
])
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
