"""One copy of each weight: building an engine grows resident memory by its weights and its KV-cache budget, and
little more (at most 15%), measured in a fresh process on a random 100M-parameter model (the CPU backend packs
every linear weight, the tied LM head too, into the layout its kernel reads and frees the plain one)."""

import json
import subprocess
import sys

import pytest

from minillm.bench.models import num_parameters, save_random_qwen3

pytestmark = pytest.mark.slow

MEASURE = """
import gc, json, sys
import torch
from minillm import LLM
from minillm.bench.memory import process_memory
from minillm.kernels.cpu import cpu_kernels, release_freed_memory
cpu_kernels()  # the C++ kernels' build (or load) happens before the measurement
gc.collect(); release_freed_memory()
before = process_memory()
llm = LLM(sys.argv[1], kvcache_memory_bytes=int(sys.argv[2]), skip_tokenizer_init=True)
gc.collect(); release_freed_memory()
after = process_memory()
growth = None if before is None else after["rss"] - before["rss"]
print(json.dumps(dict(growth=growth, kv=llm.model_runner.kv_cache.nbytes,
                      backend=llm.model_runner.platform.attention_backend.name)))
"""


def test_building_an_engine_grows_memory_by_its_weights_and_kv_cache_only(tmp_path):
    save_random_qwen3("100m", tmp_path)
    budget = 256 * 2**20
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path), str(budget)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    if measured["growth"] is None:
        pytest.skip("this system does not report resident memory")
    weights = num_parameters(tmp_path) * 4
    ratio = measured["growth"] / (weights + budget)
    assert ratio <= 1.15, f"{measured['backend']} backend: resident memory grew {ratio:.2f}x weights + KV budget"
    assert measured["kv"] >= budget * 0.99
