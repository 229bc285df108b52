#!/usr/bin/env bash
# `make demo`: prepare SmolLM2-135M-Instruct (once), run the loop that learns on a 2-core CPU
# (examples/household/learn.toml with grouped batches: base eval, 3 iterations of rollout ->
# score -> train-policy, final eval on 64 held-out episodes; policy-only RL), then its report
# with the gain and its interval. Rerun to resume after a kill. The whole RLAnything loop
# (judge, reward-model training, task adaptation) on a smaller config:
#   DEMO_CONFIG=examples/household/loop.toml make demo     # -> runs/demo-loop
# The run's name follows the config (runs/demo, runs/demo-loop, ...; DEMO_NAME sets it), so
# the two demos never share a run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
config_name=$(basename "${DEMO_CONFIG:-}" .toml)
name=${DEMO_NAME:-demo${DEMO_CONFIG:+-$config_name}}
rlany models prepare smollm2 >/dev/null
if [ -z "${DEMO_CONFIG:-}" ]; then  # benchmarks/bench_demo.py, alone on 2 cores
  # the minutes benchmarks/results/demo-SETTING.json measured on this CPU setting, if any
  echo "$(python benchmarks/bench_demo.py --expected); rerun to resume after a kill" >&2
fi
# learn.toml's policy RL with the demo's budget: batches that hold a task's rollouts
# together (each shared prompt computed once: ~5x fewer tokens a training step) and 64
# held-out episodes per evaluation instead of 128
sets=()
[ -n "${DEMO_CONFIG:-}" ] || sets=(--set train_policy.batch_order=grouped --set eval.n=2)
rlany loop "${DEMO_CONFIG:-examples/household/learn.toml}" --name "$name" ${sets[@]+"${sets[@]}"}
rlany report "runs/$name"
echo "demo: see runs/$name/report/report.md and its PNG plots" >&2
