#!/usr/bin/env bash
# Sets everything up on a fresh machine, then runs every test: C++ (GoogleTest
# via ctest) and Python (pytest). This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The optional extras that only tests use install here, not in the main job's set-up.
TORCH_TPU_EXTRAS=${TORCH_TPU_EXTRAS:-test,pallas} ./scripts/setup.sh
./scripts/lint.sh
ctest --test-dir build/py --output-on-failure -j 2
python3 -m pytest -q tests/python "$@"
