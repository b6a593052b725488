#!/usr/bin/env bash
# Whole acceptance run on a GPU machine, in one go (what a lent device call runs):
#   1. builds the Python module for that machine's python3 in build-py/ (in the background),
#   2. scripts/gpu-check.sh: every C++ GPU test with TESSEL_REQUIRE_GPU=1, every bench suite,
#      SASS summary (+ HGMMA count),
#   3. the Python GPU tests with TESSEL_REQUIRE_GPU=1,
#   4. bench/vs_torch.py (ours vs torch eager / torch.compile on the same tensors).
# Usage: scripts/device-check.sh OUTDIR   (C++ binaries in $TESSEL_BUILD, default build/)
#   TESSEL_SUITES / TESSEL_GTEST_FILTER: see scripts/gpu-check.sh
#   TESSEL_PYTHON=0: skip steps 1, 3 and 4
#   TESSEL_VS_TORCH_OPS=a,b: step 4 for these ops only (bench/vs_torch.py --ops)
# Writes OUTDIR/*.json (bench results) and OUTDIR/logs.tgz (logs, gtest XML, SASS summary).
# Killed early (SIGTERM, e.g. by `timeout`), it still packs what it has into OUTDIR.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: scripts/device-check.sh OUTDIR}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$out/work"
mkdir -p "$work"
cd "$root"
build="${TESSEL_BUILD:-build}"
export LD_LIBRARY_PATH="$root/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pack() {
  cp "$work"/*.json "$out"/ 2>/dev/null
  cat "$work/summary.txt" 2>/dev/null
  tar czf "$out/logs.tgz" -C "$work" --exclude='*.json' .
  rm -rf "$work"
}
# Steps run in the background and are waited for, so that the trap fires at once.
trap 'echo "device-check: interrupted, packing"; pkill -TERM -P $$; pack; exit 124' TERM INT
python_steps="${TESSEL_PYTHON:-1}"

pybuild=""
[ "$python_steps" = 1 ] && { (cmake -S . -B build-py -G Ninja -DTESSEL_BUILD_TESTS=OFF -DTESSEL_BUILD_TOOLS=OFF \
   -DTESSEL_BUILD_PYTHON=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
   -DPython_EXECUTABLE="$(command -v python3)" && cmake --build build-py -j "$(nproc)") \
  >"$work/pybuild.log" 2>&1 &
pybuild=$!; }

bash scripts/gpu-check.sh "$work" &
wait $!
status=$?
cuobjdump --dump-sass "$build/libtessel.so" 2>/dev/null | grep -oE 'HGMMA\.[0-9x]+' | sort | uniq -c \
  >"$work/hgmma.txt"
echo "HGMMA instructions in libtessel.so: $(awk '{s+=$1} END {print s+0}' "$work/hgmma.txt")" \
  | tee -a "$work/summary.txt"

if [ -z "$pybuild" ]; then
  echo "python steps: skipped (TESSEL_PYTHON=0)" | tee -a "$work/summary.txt"
elif wait $pybuild; then
  TESSEL_REQUIRE_GPU=1 PYTHONPATH="$root/build-py/python" timeout 900 \
    python3 -m pytest -q -p no:cacheprovider tests/python >"$work/python-tests.log" 2>&1 &
  wait $!
  rc=$?
  echo "python tests: rc=$rc $(tail -1 "$work/python-tests.log")" | tee -a "$work/summary.txt"
  [ $rc -ne 0 ] && status=1
  PYTHONPATH="$root/build-py/python" timeout 900 python3 bench/vs_torch.py \
    --json "$work/vs_torch.json" ${TESSEL_VS_TORCH_OPS:+--ops "$TESSEL_VS_TORCH_OPS"} \
    >"$work/vs_torch.log" 2>&1 &
  wait $!
  echo "vs_torch: rc=$? $(tail -1 "$work/vs_torch.log")" | tee -a "$work/summary.txt"
else
  echo "python build: FAIL (see pybuild.log)" | tee -a "$work/summary.txt"
  status=1
fi

pack
exit $status
