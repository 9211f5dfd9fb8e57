#!/usr/bin/env bash
# A/B of two builds on the demo: alternates the installed torch_tpu extension (_C) with
# another build's and runs `python -m torch_tpu.demo` with each, printing tokens/s and peak HBM.
# (The editable install's import hook wins over PYTHONPATH, so the builds are swapped in place;
# the installed one is restored on exit.)
# Usage: bench/demo_ab.sh OTHER_C_SO [MODE=strict] [ROUNDS=2] [STEPS=100]
set -euo pipefail
other=$(realpath "$1"); mode=${2:-strict}; rounds=${3:-2}; steps=${4:-100}
installed=$(python3 -c "import torch_tpu._C as c; print(c.__file__)")
saved=$(mktemp)
cp "$installed" "$saved"
trap 'cp --remove-destination "$saved" "$installed"; rm -f "$saved"' EXIT
cd "$(mktemp -d)"
for r in $(seq 1 "$rounds"); do
  for side in other installed; do
    if [ "$side" = other ]; then so=$other; else so=$saved; fi
    cp --remove-destination "$so" "$installed"
    line=$(python3 -m torch_tpu.demo --mode "$mode" --steps "$steps" --out ./out 2>&1 | grep "^{" | tail -1)
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('$mode round $r $side', round(d['tokens_per_s']), 'tokens/s, peak HBM', round(d['estimate']['hbm_peak_bytes']/2**20), 'MiB')" "$line"
  done
done
