#!/usr/bin/env bash
# The main job: set up, build, then
#   1. generate text with the default model (SmolLM2-135M-Instruct, fetched by scripts/setup.sh)
#      through `tessel run`: on the GPU backend when a CUDA GPU is present, else on the CPU one;
#   2. `tessel demo`: check and time every kernel against its baseline (needs a CUDA GPU; without
#      one it says so and is skipped).
# Extra arguments go to `tessel run` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
tessel="$root/${TESSEL_BUILD:-build}/tessel"
model="$root/.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf"
backend=cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then backend=gpu; fi
prompt_args=(--prompt "Explain in two sentences what a GPU is." --chat --max-tokens 96 --repeat-penalty 1.1)
[ $# -gt 0 ] && prompt_args=("$@")
"$tessel" run --model "$model" --backend "$backend" "${prompt_args[@]}"
if [ "$backend" = gpu ]; then
  exec "$tessel" demo
fi
echo "tessel demo: no CUDA GPU found: kernel checks skipped (text above came from the CPU backend)"
