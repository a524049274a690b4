#!/usr/bin/env bash
# The GPU subset: tests marked `gpu` (skipped on CPU-only machines), run where CUDA is present.
set -euo pipefail
cd "$(dirname "$0")/.."
make setup
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
.venv/bin/python -m pytest -m gpu -q -p no:cacheprovider
