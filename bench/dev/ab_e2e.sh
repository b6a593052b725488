#!/usr/bin/env bash
# Development A/B run on a device (not part of CI): GPU tests of a filter, then the e2e batch-1
# decode of the 8B and 1B shapes, default vs each VAR=VALUE given, alternating, one process per
# run (GEMMs tuned ahead), then an op profile of the 1B decode step.
#   bench/dev/ab_e2e.sh OUT GTEST_FILTER [VAR=VALUE ...]
set -uo pipefail
out="$1"; filter="$2"; shift 2
export LD_LIBRARY_PATH="$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$out/gpu.txt"
if [ "$filter" != none ]; then
  TESSEL_REQUIRE_GPU=1 timeout "${TEST_TIMEOUT:-300}" build/tessel_tests --gtest_filter="$filter" >"$out/tests.log" 2>&1
  echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/tests.log" | head -20
fi
cmp=()
for v in "$@"; do cmp+=(--compare "$v"); done
for round in $(seq 1 "${ROUNDS:-1}"); do
  python3 bench/e2e.py --tessel build/tessel --models "${MODELS:-8b,1b}" --batches "${BATCHES:-1}" \
    --new-tokens 128 --no-baseline --pretune "${cmp[@]}" --json "$out/e2e_b1_r$round.json" \
    2>&1 | grep -E '^tessel|weight bandwidth|e2e_' | tee -a "$out/e2e.log"
done
if [ "${PROFILE:-1}" = 1 ]; then
  TESSEL_PROFILE_OPS=1 CUDA_MODULE_LOADING=EAGER build/tessel run --model /tmp/tessel_e2e_1b \
    --backend gpu --temperature 0 --ignore-eos --max-tokens 64 --context 600 \
    --prompt-ids "$(python3 -c 'print(",".join(str(1000 + i * 7919 % 120000) for i in range(512)))')" \
    >"$out/profile_1b.txt" 2>&1
  grep -A16 "decode 1 rows" "$out/profile_1b.txt"
fi
