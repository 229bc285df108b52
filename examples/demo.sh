#!/usr/bin/env bash
# The longest real pipeline that exists today, on SmolLM2-135M-Instruct on the CPU:
# prepare the model (once) -> make tasks -> rollout -> judge -> score.
# It grows as stages land (train-policy, train-rm, adapt-tasks, loop); nothing is faked.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=${DEMO_OUT:-runs/demo}
mkdir -p "$out"
rlany models prepare smollm2 >/dev/null
rlany envs make-tasks reasoning --n 8 --seed 0 -o "$out/tasks.jsonl"
rlany rollout -i "$out/tasks.jsonl" -o "$out/trajectories.jsonl" --model smollm2 --n 4 \
    --max-tokens 96 --temperature 0.8
rlany judge -i "$out/trajectories.jsonl" -o "$out/judgments.jsonl" --model smollm2 --m 3 \
    --max-tokens 96
rlany score -i "$out/trajectories.jsonl" -j "$out/judgments.jsonl" -o "$out/scored.jsonl"
echo "demo: outputs in $out (tasks, trajectories, judgments, scored, task_stats + .meta.json)" >&2
