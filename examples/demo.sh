#!/usr/bin/env bash
# `make demo`: prepare SmolLM2-135M-Instruct (once), run a short RLAnything loop on the CPU
# (examples/household/loop.toml: 2 iterations of rollout -> judge -> score -> train-policy ->
# train-rm -> adapt-tasks -> eval), then write its report. Rerun to resume after a kill.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
name=${DEMO_NAME:-demo}
rlany models prepare smollm2 >/dev/null
rlany loop "${DEMO_CONFIG:-examples/household/loop.toml}" --name "$name"
rlany report "runs/$name"
echo "demo: see runs/$name/report/report.md and its PNG plots" >&2
