#!/usr/bin/env bash
# Developer loop: incremental rebuild of the C++ after editing, without pip.
# (scripts/setup.sh must have run once: it configures build/py.)
set -euo pipefail
cd "$(dirname "$0")/.."
# One build at a time: several developers (or agents) may share this tree.
exec 9>build/.rebuild.lock
flock 9
cmake --build build/py -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
# --remove-destination: a new inode, so running processes keep the library they mapped
# (overwriting it in place makes every process using it crash).
cp --remove-destination build/py/_C*.so "$site/torch_tpu/"
