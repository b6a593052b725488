#!/usr/bin/env bash
# Whole acceptance run on a GPU machine, in one go (what a lent device call runs):
#   1. builds the Python module for that machine's python3 in build-py/ (in the background),
#   2. scripts/gpu-check.sh: every C++ GPU test with TESSEL_REQUIRE_GPU=1, every bench suite,
#      SASS summary (+ HGMMA count),
#   3. the Python GPU tests with TESSEL_REQUIRE_GPU=1,
#   4. bench/vs_torch.py (ours vs torch eager / torch.compile on the same tensors).
# Usage: scripts/device-check.sh OUTDIR   (C++ binaries in $TESSEL_BUILD, default build/)
# Writes OUTDIR/*.json (bench results) and OUTDIR/logs.tgz (logs, gtest XML, SASS summary).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: scripts/device-check.sh OUTDIR}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$out/work"
mkdir -p "$work"
cd "$root"
build="${TESSEL_BUILD:-build}"
export LD_LIBRARY_PATH="$root/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

(cmake -S . -B build-py -G Ninja -DTESSEL_BUILD_TESTS=OFF -DTESSEL_BUILD_TOOLS=OFF \
   -DTESSEL_BUILD_PYTHON=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
   -DPython_EXECUTABLE="$(command -v python3)" && cmake --build build-py -j "$(nproc)") \
  >"$work/pybuild.log" 2>&1 &
pybuild=$!

bash scripts/gpu-check.sh "$work"
status=$?
cuobjdump --dump-sass "$build/libtessel.so" 2>/dev/null | grep -oE 'HGMMA\.[0-9x]+' | sort | uniq -c \
  >"$work/hgmma.txt"
echo "HGMMA instructions in libtessel.so: $(awk '{s+=$1} END {print s+0}' "$work/hgmma.txt")" \
  | tee -a "$work/summary.txt"

if wait $pybuild; then
  TESSEL_REQUIRE_GPU=1 PYTHONPATH="$root/build-py/python" timeout 900 \
    python3 -m pytest -q -p no:cacheprovider tests/python >"$work/python-tests.log" 2>&1
  rc=$?
  echo "python tests: rc=$rc $(tail -1 "$work/python-tests.log")" | tee -a "$work/summary.txt"
  [ $rc -ne 0 ] && status=1
  PYTHONPATH="$root/build-py/python" timeout 900 python3 bench/vs_torch.py \
    --json "$work/vs_torch.json" >"$work/vs_torch.log" 2>&1
  echo "vs_torch: rc=$? $(tail -1 "$work/vs_torch.log")" | tee -a "$work/summary.txt"
else
  echo "python build: FAIL (see pybuild.log)" | tee -a "$work/summary.txt"
  status=1
fi

cp "$work"/*.json "$out"/ 2>/dev/null
cat "$work/summary.txt"
tar czf "$out/logs.tgz" -C "$work" --exclude='*.json' .
rm -rf "$work"
exit $status
