#!/usr/bin/env bash
# The GPU check in one prepared run of under 8 minutes on a CUDA machine (scripts/gpu_check.py says what it covers):
# the tests marked gpu, float32 and bfloat16, CUDA graphs on and off, Triton against torch, a 32k context with
# chunked prefill and a cached prefix, the KV-cache budget, TP=2 over NCCL where two GPUs exist, and the ladder and
# roofline on the real model. It writes notebooks/data/gpu_check.json, which notebook 11 reads.
#   bash scripts/gpu_check.sh                  # sets up .venv first (make setup)
#   PYTHON=python3 bash scripts/gpu_check.sh   # a Python that has torch with CUDA and minillm's requirements already
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    make setup
    PYTHON=.venv/bin/python
fi
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
export TRITON_INTERPRET=0  # compiled kernels: the CPU tests' modules switch the interpreter on only when unset
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 480 "$PYTHON" scripts/gpu_check.py "$@"
