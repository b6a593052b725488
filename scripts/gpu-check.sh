#!/usr/bin/env bash
# GPU acceptance run: every GPU test (TESSEL_REQUIRE_GPU=1), every bench suite, a SASS summary.
#
#   scripts/gpu-check.sh OUTDIR          (build dir: $TESSEL_BUILD, default "build")
#
# Writes to OUTDIR:
#   gpu-tests.log, gpu-tests.xml   gtest output of tessel_tests --gtest_filter='*Gpu*'
#   <suite>.json, <suite>.log      `tessel bench <suite> --json OUTDIR/<suite>.json`
#   sass-summary.txt               128-bit global loads/stores (LDG.E.128 / STG.E.128) per kernel
#   summary.txt                    one line per step with its status
# Exit status: 0 all passed; 1 a GPU test failed (or the test binary is missing); 2 a bench
# suite failed its correctness checks or could not run; usage errors 64.
# Timings are only meaningful on an otherwise idle GPU.
set -uo pipefail

if [ $# -ne 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 64
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TESSEL_BUILD:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
out="$1"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# Commit for the bench JSON (the device copy of the repository may have no .git).
if [ -z "${TESSEL_COMMIT:-}" ]; then
  if c="$(git -C "$root" rev-parse --short HEAD 2>/dev/null)"; then
    export TESSEL_COMMIT="$c"
  fi
fi

# cuDNN for the softmax baselines: tessel dlopens libcudnn.so.9. If the loader cannot find
# it, look for the pip wheel (nvidia-cudnn-cu1x) and point TESSEL_CUDNN_LIB at it.
if [ -z "${TESSEL_CUDNN_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
  for py in python3 python; do
    d="$("$py" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)" || continue
    if [ -f "$d/libcudnn.so.9" ]; then
      export TESSEL_CUDNN_LIB="$d/libcudnn.so.9"
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
note "gpu-check: build=$build out=$out commit=${TESSEL_COMMIT:-unknown} cudnn=${TESSEL_CUDNN_LIB:-system}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader \
  >>"$summary" 2>&1 || note "nvidia-smi: not available"

status=0

# ---- 1. GPU tests ----------------------------------------------------------------------
# The test binary directly (ctest's files hold absolute paths, which break when the build
# directory is copied to another machine).
tests="$build/tessel_tests"
gfilter="${TESSEL_GTEST_FILTER:-*Gpu*}"
if [ "$gfilter" = none ]; then
  note "gpu tests: skipped (TESSEL_GTEST_FILTER=none)"
elif [ -x "$tests" ]; then
  TESSEL_REQUIRE_GPU=1 "$tests" --gtest_filter="$gfilter" --gtest_output="xml:$out/gpu-tests.xml" \
    >"$out/gpu-tests.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then note "gpu tests: PASS ($(grep -c '^\[       OK \]' "$out/gpu-tests.log") ok)"
  else note "gpu tests: FAIL (rc=$rc, see gpu-tests.log)"; grep '^\[  FAILED  \]' "$out/gpu-tests.log" | sed 's/ ([0-9]* ms)$//' | sort -u | head -40 | tee -a "$summary"; status=1; fi
else
  note "gpu tests: FAIL ($tests not found; build with -DTESSEL_BUILD_TESTS=ON)"
  status=1
fi

# ---- 2. bench suites -------------------------------------------------------------------
cli="$build/tessel"
if [ -x "$cli" ]; then
  suites="${TESSEL_SUITES:-$("$cli" bench --list | cut -f1)}"
  [ "$suites" = none ] && suites=""
  for s in $suites; do
    "$cli" bench "$s" --json "$out/$s.json" >"$out/$s.log" 2>&1
    rc=$?
    cat "$out/$s.log"
    if [ $rc -eq 0 ]; then note "bench $s: OK"
    else note "bench $s: FAIL (rc=$rc, see $s.log)"; [ $status -eq 0 ] && status=2; fi
  done
else
  note "bench: FAIL ($cli not found)"
  [ $status -eq 0 ] && status=2
fi

# ---- 3. SASS summary -------------------------------------------------------------------
# Counts 128-bit global loads/stores per kernel: a bandwidth kernel without LDG.E.128 /
# STG.E.128 (any cache-hint suffix) is not vectorized.
lib="$build/libtessel.so"
cuobjdump="$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")"
if [ -f "$lib" ] && [ -x "$cuobjdump" ]; then
  demangle="cat"
  command -v c++filt >/dev/null && demangle="c++filt"
  {
    echo "# $lib: 128-bit global memory instructions per kernel"
    printf '%8s %8s %8s %8s  %s\n' LDG.128 STG.128 LDG STG kernel
    "$cuobjdump" --dump-sass "$lib" | awk '
      function flush() { if (fn != "") printf "%8d %8d %8d %8d  %s\n", l128, s128, ldg, stg, fn }
      /Function : / { flush(); fn = $NF; l128 = s128 = ldg = stg = 0; next }
      /[ \t]LDG\./ { ldg++; if ($0 ~ /LDG\.E[.A-Z0-9_]*\.128/) l128++ }
      /[ \t]STG\./ { stg++; if ($0 ~ /STG\.E[.A-Z0-9_]*\.128/) s128++ }
      END { flush() }' | $demangle
  } >"$out/sass-summary.txt" 2>&1
  note "sass summary: $(($(wc -l <"$out/sass-summary.txt") - 2)) kernels in sass-summary.txt"
else
  note "sass summary: skipped (libtessel.so or cuobjdump not found)"
fi

note "gpu-check: exit $status"
exit $status
