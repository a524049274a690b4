"""python -m minillm.bench quant: each variant's bytes per weight, decode rate and quality, recorded and plotted."""

import json

from minillm.bench.cli import main


def test_bench_quant_records_every_variant_against_the_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the GGUF files it writes go under results/gguf here
    out, png = tmp_path / "quant.json", tmp_path / "quant.png"
    main(
        [
            "quant",
            "--variants",
            "fp32,int8,q4_1",
            "--prompts",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--eager",
            "--output-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["fp32", "int8", "q4_1"]
    bytes_per_weight = [r["bytes_per_weight"] for r in results.values()]
    assert bytes_per_weight[0] == 4.0 and 1.0 <= bytes_per_weight[1] < 1.1 and bytes_per_weight[2] < 0.75
    assert all(r["decode_tokens_per_second"]["minillm"] > 0 for r in results.values())
    assert results["fp32"]["speedup_over_fp32"] == 1.0
    quality = results["int8"]["quality"]  # the default model has a tokenizer: its held-out stories are scored
    assert quality["reference_perplexity"] == results["fp32"]["quality"]["perplexity"]
    assert abs(quality["perplexity_change"]) < 0.01 and quality["greedy_agreement"] > 0.95
    assert png.stat().st_size > 0
