"""python -m minillm.bench spec on the default model: the record and its figure, speculation checked token for token
against the plain engine at every batch size (a run whose tokens differ fails)."""

import argparse

import pytest

from minillm.bench import spec
from minillm.bench.cli import main


def test_spec_bench_records_speedup_acceptance_and_where_it_stops_paying(tmp_path, capsys):
    record = main(
        ["spec", "--speculative", "draft:3", "--speculative", "ngram:2,2,1", "--batch-sizes", "1,2",
         "--min-prompts", "2", "--output-len", "12", "--output-json", str(tmp_path / "r.json"),
         "--plot", str(tmp_path / "s.png")]
    )  # fmt: skip
    results = record["results"]
    assert set(results) == {"plain", "draft k=3", "ngram k=2 n=2..1"} and all(
        set(r) == {1, 2} for r in results.values()
    )
    draft = results["draft k=3"][1]
    assert draft["acceptance_rate"] > 0 and draft["mean_acceptance_length"] > 1 and draft["speedup"] > 0
    assert draft["tpot_ms"] > 0 and draft["tpot_speedup"] > 0 and "token_ids" not in draft
    assert set(record["stops_paying_at"]) <= {"draft k=3", "ngram k=2 n=2..1"}
    assert (tmp_path / "r.json").is_file() and (tmp_path / "s.png").stat().st_size > 0
    assert "tokens per verify" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["ngram:4", "draft:", "medusa:3", "ngram:a,b"])
def test_a_bad_speculative_setting_names_the_forms(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"ngram:K,N\[,M\] or draft:K"):
        spec.speculative(text)
