#!/usr/bin/env bash
# Set up dependencies (idempotent) and build everything: libtessel, the tessel CLI, tests,
# the Python module. Build dir: $TESSEL_BUILD (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
build="${TESSEL_BUILD:-build}"
jobs="${TESSEL_JOBS:-$(nproc)}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" -DTESSEL_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$(command -v python3)"
fi
cmake --build "$build" -j "$jobs"
