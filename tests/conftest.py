import os

import pytest
import torch
from checkpoints import make_checkpoint  # tests/ is on sys.path: this file lives there

from minillm.engine.scheduler import Scheduler

pytest_plugins = ["minillm.course.pytest_plugin"]

# The test models are tiny: one thread avoids OpenMP's start-up and hand-off costs on every small matmul.
torch.set_num_threads(1)
# One matmul path for the whole suite (and the servers and notebooks it starts): with "auto", which kernel each
# layer gets would depend on how busy the machine was when it was timed. tests/test_autotune.py covers "auto",
# tests/test_cpu_kernels.py the packed kernel, the tests with native_kernels=False F.linear.
os.environ.setdefault("MINILLM_LINEAR_KERNEL", "packed")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random-weight Qwen3 checkpoint directory (GQA, tied, 256 byte tokens), written once per session."""
    path = tmp_path_factory.mktemp("tiny-qwen3")
    make_checkpoint("qwen3-gqa-tied", path)
    return path


@pytest.fixture
def counters(monkeypatch):
    """Counts of what the scheduler did, to prove each setting exercised its path."""
    counts = {"preempt": 0, "chunks": 0, "cached_tokens": 0, "mixed": 0}
    preempt, prefill, schedule = Scheduler.preempt, Scheduler.schedule_prefill, Scheduler.schedule

    def count_mixed(self):
        output = schedule(self)
        seqs = output.scheduled
        decodes = [s for s in seqs if s.num_scheduled_tokens == 1 and s.num_completion_tokens]
        counts["mixed"] += bool(decodes) and any(s.num_scheduled_tokens > 1 for s in seqs)
        counts["chunks"] += sum(not s.samples_this_step for s in seqs)
        return output

    def count_preempt(self, seq):
        counts["preempt"] += 1
        preempt(self, seq)

    def count_prefill(self, budget):
        seqs = prefill(self, budget)
        counts["cached_tokens"] += sum(
            s.num_cached_tokens for s in seqs if s.num_computed_tokens == min(s.num_cached_tokens, len(s) - 1)
        )
        return seqs

    monkeypatch.setattr(Scheduler, "preempt", count_preempt)
    monkeypatch.setattr(Scheduler, "schedule_prefill", count_prefill)
    monkeypatch.setattr(Scheduler, "schedule", count_mixed)
    return counts


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: on a CPU-only machine they are skipped, with the reason shown."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; run scripts/gpu_check.sh on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
