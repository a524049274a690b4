"""llama.cpp as a peer: the GGUF writer's layout, and llama.cpp's greedy tokens equal minillm's on the same
weights. The GGUF and llama.cpp tests skip, with the reason, where the optional `peers` extra (gguf,
llama-cpp-python) is not installed."""

import importlib.util
import json

import pytest
from checkpoints import make_checkpoint
from safetensors import safe_open

from minillm import LLM, SamplingParams
from minillm.bench import llamacpp
from minillm.bench.gguf_export import export, gguf_name

NO_GGUF = importlib.util.find_spec("gguf") is None
PEERS = "not installed: pip install -e '.[peers]' (builds llama.cpp from source, about 10 minutes)"


def test_tensor_names_follow_llama_cpp():
    assert gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_name("model.norm.weight") == "output_norm.weight"
    assert gguf_name("lm_head.weight") == "output.weight"
    assert gguf_name("model.layers.11.self_attn.q_norm.weight") == "blk.11.attn_q_norm.weight"
    assert gguf_name("model.layers.0.self_attn.o_proj.weight") == "blk.0.attn_output.weight"
    assert gguf_name("model.layers.3.post_attention_layernorm.weight") == "blk.3.ffn_norm.weight"
    assert gguf_name("model.layers.3.mlp.down_proj.weight") == "blk.3.ffn_down.weight"
    with pytest.raises(ValueError, match="model.layers.0.mlp.experts"):
        gguf_name("model.layers.0.mlp.experts.weight")


def test_unavailable_peer_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setattr(llamacpp, "unavailable", lambda: "not installed: llama-cpp-python (test)")
    assert llamacpp.compare(None, None, [[1, 2]], 4) == dict(
        llama_cpp=dict(unavailable="not installed: llama-cpp-python (test)")
    )
    assert "llama.cpp peer skipped: not installed" in capsys.readouterr().out


@pytest.fixture(scope="module", params=["qwen3-gqa-tied", "qwen3-gqa-untied"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_checkpoint(request.param, path)
    return path


@pytest.mark.skipif(NO_GGUF, reason=f"gguf {PEERS}")
def test_gguf_has_the_hyperparameters_and_every_weight_unchanged(checkpoint, tmp_path):
    import gguf

    out = export(checkpoint, tmp_path)
    assert export(checkpoint, tmp_path) == out and len(list(tmp_path.iterdir())) == 1  # written once
    reader = gguf.GGUFReader(out)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert fields["general.architecture"] == "qwen3" and fields["tokenizer.ggml.model"] == "none"
    assert fields["qwen3.block_count"] == cfg["num_hidden_layers"]
    assert fields["qwen3.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert fields["qwen3.attention.key_length"] == fields["qwen3.attention.value_length"] == cfg["head_dim"]
    assert fields["qwen3.vocab_size"] == cfg["vocab_size"]
    tensors = {t.name: t for t in reader.tensors}
    with safe_open(str(checkpoint / "model.safetensors"), "np") as f:
        names = set(f.keys())
        assert ("output.weight" in tensors) == ("lm_head.weight" in names) == (not cfg["tie_word_embeddings"])
        assert set(tensors) == {gguf_name(n) for n in names}
        for name in names:
            t = tensors[gguf_name(name)]
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            assert (t.data.reshape(f.get_tensor(name).shape) == f.get_tensor(name)).all()


@pytest.mark.skipif(llamacpp.unavailable() is not None, reason=f"llama.cpp peer {llamacpp.unavailable()}")
def test_llama_cpp_greedy_tokens_equal_minillms(checkpoint, tmp_path):
    prompts, n = [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11], [3] * 20, list(range(40, 72))], 16
    engine = LLM(checkpoint)
    ours = [
        out.token_ids
        for out in engine.generate(
            prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)] * len(prompts), use_tqdm=False
        )
    ]
    llm = llamacpp.load(export(checkpoint, tmp_path), 64, threads=1)
    theirs = [llamacpp.generate(llm, prompt, n)[0] for prompt in prompts]
    llm.close()
    assert theirs == ours


@pytest.mark.skipif(llamacpp.unavailable() is not None, reason=f"llama.cpp peer {llamacpp.unavailable()}")
@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_a_quantized_file_gives_llama_cpps_greedy_tokens_in_minillm(checkpoint, tmp_path, outtype):
    """minillm runs the GGUF in its blocks (quantization="gguf"), llama.cpp runs the same file: the same tokens,
    as both dequantize bit for bit alike and quantize their inputs in blocks of 32 alike (float16 scales). Q4_1
    is left out: llama.cpp also rounds each input block's d·Σq to float16 for the minimum's term (its Q8_1), which
    minillm keeps in float32, and on these random models that flips a near-tie now and then."""
    prompts, n = [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11], [3] * 20, list(range(40, 72))], 12
    file = export(checkpoint, tmp_path, outtype)
    engine = LLM(file, skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    ours = [out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)]
    llm = llamacpp.load(file, 64, threads=1)
    theirs = [llamacpp.generate(llm, prompt, n)[0] for prompt in prompts]
    llm.close()
    assert theirs == ours


@pytest.mark.skipif(llamacpp.unavailable() is not None, reason=f"llama.cpp peer {llamacpp.unavailable()}")
def test_compare_records_both_engines_and_the_greedy_check(tmp_path, capsys):
    path = tmp_path / "model"
    make_checkpoint("qwen3-gqa-tied", path)
    record = llamacpp.compare(
        path, LLM(path), [[5, 6, 7, 8], [9, 8, 7, 6], [1, 2, 3, 4]], 6, cache_dir=tmp_path / "gguf"
    )
    results = record["llama_cpp"]["results"]
    for name in ("minillm", "llama_cpp"):
        assert results[name]["decode_tokens_per_second"] > 0 and len(results[name]["prompt_tps"]) == 3
    assert results["llama_cpp"]["same_tokens_as_minillm"] == 1 and results["llama_cpp"]["kv_cache"] == "f32"
    assert set(record["llama_cpp"]["minillm_speedup"]) == {"prompt", "decode"}
    assert "minillm / llama.cpp" in capsys.readouterr().out


def test_peer_needs_the_roofline(capsys):
    from minillm.bench.cli import main

    with pytest.raises(SystemExit):
        main(["--peer", "llama-cpp", "--random-size", "tiny"])
    assert "--peer llama-cpp runs with --roofline only" in capsys.readouterr().err


def test_roofline_record_with_the_llama_cpp_peer(tmp_path, monkeypatch):
    """With the peers extra: both engines' batch-1 figures and the greedy check; without: why not, and the
    roofline's own record all the same."""
    from minillm.bench.cli import main

    monkeypatch.setattr(llamacpp, "CACHE_DIR", tmp_path / "gguf")
    out = tmp_path / "r.json"
    main(
        [
            "--roofline",
            "--peer",
            "llama-cpp",
            "--random-size",
            "tiny",
            "--roofline-batch",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--roofline-bytes",
            str(16 * 2**20),
            "--output-json",
            str(out),
        ]
    )
    record = json.loads(out.read_text())
    assert record["roofline"]["batch_1"]["tokens_per_second"] > 0
    if llamacpp.unavailable():
        assert record["llama_cpp"]["unavailable"].startswith("not installed")
    else:
        results = record["llama_cpp"]["results"]
        assert len(results["llama_cpp"]["decode_tps"]) == 6, "a warm-up prompt and 5 timed ones"
        assert results["llama_cpp"]["same_tokens_as_minillm"] == 1
        assert len(list((tmp_path / "gguf").glob("*.gguf"))) == 1
