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
  python - <<'PY' >&2
from rlany.compat import machine_profile
p = machine_profile()
# fp32: 12.1 min measured with AVX2 kernels forced (results/demo-avx2forced-float32.json);
# bf16: not timed as make demo, ~8 from the learning benchmark's grouped runs
kind, minutes = (("AVX-512 + native bf16", "8") if p["dtype"] == "bfloat16"
                 else ("no native bf16 (fp32 training)", "12-16"))
print(f"demo: about {minutes} minutes on a 2-core CPU with {kind}, as this one "
      f"({p['cpu_capability']}, {p['cores']} cores usable); rerun to resume after a kill")
PY
fi
# learn.toml's policy RL with the demo's budget: batches that hold a task's rollouts
# together (each shared prompt computed once: ~5x fewer tokens a training step) and 64
# held-out episodes per evaluation instead of 128
sets=()
[ -n "${DEMO_CONFIG:-}" ] || sets=(--set train_policy.batch_order=grouped --set eval.n=2)
rlany loop "${DEMO_CONFIG:-examples/household/learn.toml}" --name "$name" ${sets[@]+"${sets[@]}"}
rlany report "runs/$name"
echo "demo: see runs/$name/report/report.md and its PNG plots" >&2
