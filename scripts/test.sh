#!/usr/bin/env bash
# Set up, build, and run the whole test suite: C++ (CTest: cpu and gpu labels) and Python.
# GPU tests skip without a GPU; with TESSEL_REQUIRE_GPU=1 a skip is a failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
cd "$root"
build="${TESSEL_BUILD:-build}"
(cd "$build" && ctest --output-on-failure -j 2)
PYTHONPATH="$root/$build/python:$root/.deps/pytest${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m pytest -q -p no:cacheprovider tests/python
python3 scripts/gen_performance.py --check
