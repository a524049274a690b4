#!/usr/bin/env bash
# The GPU subset, in a few minutes on a CUDA machine: the tests marked `gpu` (skipped on CPU-only machines:
# the CUDA engine, CUDA graphs on and off, compiled layers on and off, each token-identical to the naive loop),
# then a short benchmark of CUDA graphs + compiled layers against the same engine with nothing compiled and
# against transformers, side by side on one random 100M-parameter model.
set -euo pipefail
cd "$(dirname "$0")/.."
make setup
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
export TRITON_INTERPRET=0  # compiled kernels: the CPU tests' modules switch the interpreter on only when unset
.venv/bin/python -m pytest -m gpu -q -p no:cacheprovider
mkdir -p results/gpu
.venv/bin/python -m minillm.bench --device cuda --random-size 100m --workload mixed --num-prompts 256 \
    --backends minillm,minillm-eager,hf-generate --hf-batch-size 64 --output-json results/gpu/bench-mixed-100m.json
