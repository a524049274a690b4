import pytest
import torch
from checkpoints import make_checkpoint  # tests/ is on sys.path: this file lives there

pytest_plugins = ["minillm.course.pytest_plugin"]

# The test models are tiny: one thread avoids OpenMP's start-up and hand-off costs on every small matmul.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random-weight Qwen3 checkpoint directory (GQA, tied, 256 byte tokens), written once per session."""
    path = tmp_path_factory.mktemp("tiny-qwen3")
    make_checkpoint("qwen3-gqa-tied", path)
    return path


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: on a CPU-only machine they are skipped, with the reason shown."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; run scripts/gpu_check.sh on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
