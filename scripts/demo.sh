#!/usr/bin/env bash
# The main job: set up, build, then `tessel demo` (checks and times every kernel against its
# baseline). Without a CUDA GPU it says so and exits non-zero.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
exec "$root/${TESSEL_BUILD:-build}/tessel" demo "$@"
