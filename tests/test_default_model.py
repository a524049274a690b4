"""The embedded default model: loads offline with transformers, tells valid stories, and rebuilds reproducibly."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import minillm  # noqa: E402
from minillm.data.quality import evaluate_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = minillm.default_model_path()


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(MODEL, local_files_only=True).eval()
    return model, tok


def test_shipped_files_are_self_describing():
    names = {p.name for p in MODEL.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    } <= names
    assert sum(p.stat().st_size for p in MODEL.iterdir()) < 40e6
    cfg = json.loads((MODEL / "config.json").read_text())
    gen = json.loads((MODEL / "generation_config.json").read_text())
    vocab = json.loads((MODEL / "tokenizer.json").read_text())["model"]["vocab"]
    added = {t["content"]: t["id"] for t in json.loads((MODEL / "tokenizer.json").read_text())["added_tokens"]}
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert (
        (cfg["pad_token_id"], cfg["bos_token_id"], cfg["eos_token_id"])
        == (0, 1, 2)
        == (added["<pad>"], added["<bos>"], added["<eos>"])
    )
    assert gen["eos_token_id"] == 2
    assert cfg["vocab_size"] == len(vocab) and cfg["vocab_size"] % 2 == 0
    assert cfg["num_key_value_heads"] % 2 == 0 and cfg["num_attention_heads"] % 2 == 0
    assert cfg["head_dim"] % 16 == 0 and cfg["tie_word_embeddings"]
    assert cfg["max_position_embeddings"] >= 512
    with safe_open(str(MODEL / "model.safetensors"), "pt") as f:
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())
    card = (MODEL / "README.md").read_text()
    assert "held-out loss" in card and "scripts/build_default_model.py" in card


def test_transformers_loads_it_offline(hf):
    model, tok = hf
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    text = 'Once upon a time, there was a shy fox named Tom. "Can I help you?" asked Mia.'
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == text
    assert 2 < model.num_parameters() / 1e6 < 10


def test_tokenizers_library_reads_the_same_file():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    text = "Mia hugged her red ball and smiled. Ωmega!"
    assert tok.decode(tok.encode(text).ids) == text


@pytest.fixture(scope="module")
def quality(hf):
    model, tok = hf
    return evaluate_model(model, tok, n_stories=200, temperature=0.8, seed=0, n_greedy=20)


@pytest.mark.slow
def test_sampled_stories_are_grammatical(quality):
    """The acceptance figure: at temperature 0.8, at least 98% of generated sentences pass the checker."""
    assert len(quality["sampled"]) == 200
    assert quality["total"] > 200 * 8  # the stories go on (and are counted) beyond the prompt
    assert quality["validity"] >= 0.98, quality["validity"]


@pytest.mark.slow
def test_sampled_stories_keep_their_cast(quality):
    """The model remembers who its story is about: at temperature 0.8 and top-p 0.95, at least 90% of the stories
    name one hero and at most one friend from start to end (the corpus always does; a model that cannot copy a name
    from earlier in its context drifts to new ones)."""
    assert len(quality["kept"]) == 200 and quality["cast_top_p"] == 0.95
    drifted = [p + t for p, t, kept in zip(quality["prompts"], quality["nucleus"], quality["kept"]) if not kept]
    assert quality["cast_kept"] >= 0.90, drifted[:2]


def test_the_demos_stories_keep_their_names():
    """`make demo`'s stories, through minillm's engine: each keeps its hero and friend from start to end."""
    from minillm import LLM
    from minillm.data import keeps_its_cast
    from minillm.demo import demo_requests

    openings, params = demo_requests()
    outputs = LLM().generate(openings, params, use_tqdm=False)
    drifted = [o + out.text for o, out in zip(openings, outputs) if not keeps_its_cast(o + out.text)]
    assert not drifted, drifted


@pytest.mark.slow
def test_greedy_continuations_are_valid_sentences(quality):
    assert quality["greedy_total"] > 20 * 8
    assert quality["greedy_validity"] == 1.0, [t for t in quality["greedy"]][:3]


def _build_script():
    spec = importlib.util.spec_from_file_location("build_default_model", ROOT / "scripts" / "build_default_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_is_reproducible():
    build = _build_script()
    tiny = dict(
        n_stories=64,
        n_heldout=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        batch_size=4,
        steps=10,
        warmup=2,
        threads=torch.get_num_threads(),
    )
    first = build.train(build.BuildConfig(**tiny), progress=False)["record"]
    again = build.train(build.BuildConfig(**tiny), progress=False)["record"]
    other = build.train(build.BuildConfig(**tiny, seed=1), progress=False)["record"]
    assert len(first["losses"]) == 10 and first["losses"][-1] < first["losses"][0]
    assert first["losses"] == pytest.approx(again["losses"], rel=1e-6, abs=1e-6)
    assert first["heldout_loss"] == pytest.approx(again["heldout_loss"], rel=1e-6)
    assert first["losses"] != pytest.approx(other["losses"], rel=1e-6, abs=1e-6)
