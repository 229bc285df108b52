#!/usr/bin/env bash
# The longest real pipeline that exists today (it grows as stages land; nothing is faked).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=runs/demo
mkdir -p "$out"
rlany score -i stages/score/in.jsonl -j stages/score/in.judgments.jsonl -o "$out/scored.jsonl"
echo "demo: wrote $out/scored.jsonl and $out/task_stats.jsonl" >&2
