#!/usr/bin/env bash
# The style gates: ruff over the Python (rules and line length in pyproject.toml) and
# clang-format over the C++ (.clang-format). Fails listing what differs; fix with
# `ruff check --fix .` and `clang-format -i` on the files named.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check .
git ls-files -- 'csrc/*.cc' 'csrc/*.h' 'tests/cpp/*.cc' 'tests/cpp/*.h' 'bench/*.cc' | xargs clang-format --dry-run --Werror
