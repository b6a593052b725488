#!/usr/bin/env bash
# Builds llama.cpp, issue 6's baseline, for Hopper (sm_90a) and stages what bench/e2e.py
# --llama-cpp needs into DEST (default .lcpp/, git-ignored; carry it to the device):
#   bin/   llama-bench, llama-batched-bench (stripped)
#   lib/   their shared libraries (libllama, libggml*, stripped)
#   convert/  convert_hf_to_gguf.py with its conversion/ and gguf-py/ packages
#   tokenizer/ the Llama-3 tokenizer files (the conversion needs a vocabulary)
#   llama.cpp.txt  the version and the build flags
# The source is the llama.cpp that the PyPI sdist of llama-cpp-python (pinned below) vendors:
# fetched by pip, built here, never committed (~1 h on 2 cores: 144 CUDA files; ~5 min with
# JOBS=16 on the device). LLAMA_CPP_SRC=DIR builds an unpacked copy of that source instead
# (a machine without network, e.g. the device: `LLAMA_CPP_PACK=FILE` here writes FILE, the
# source tree without docs and models as .tar.xz, ~8 MB, and exits).
#   bash scripts/build_llama_cpp.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=${1:-$ROOT/.lcpp}
VERSION=0.3.36  # llama-cpp-python; vendors llama.cpp 0c1e570 (2026-10-01)
WORK=${LLAMA_CPP_WORK:-/tmp/tessel_llama_cpp}
TOKENIZER=${TOKENIZER_DIR:-$ROOT/../shared/data/tokenizers/llama3}

mkdir -p "$WORK"
SRC=${LLAMA_CPP_SRC:-$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp}
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  python3 -m pip download --no-deps --no-binary=:all: -d "$WORK" "llama-cpp-python==$VERSION"
  tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
if [ -n "${LLAMA_CPP_PACK:-}" ]; then
  tar -C "$SRC" -cf - CMakeLists.txt CMakePresets.json ggml src common tools include vendor \
    cmake app convert_hf_to_gguf.py conversion gguf-py licenses LICENSE pyproject.toml |
    xz -T2 -6 >"$LLAMA_CPP_PACK"
  exit 0
fi
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
       -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF
       -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF
       # libggml-cuda needs the driver's libcuda.so.1, absent on a build host without a GPU
       -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined)
cmake -S "$SRC" -B "$WORK/build" -G Ninja "${FLAGS[@]}"
ninja -C "$WORK/build" -j "${JOBS:-2}" llama-bench llama-batched-bench

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/convert" "$DEST/tokenizer"
cp "$WORK/build/bin/llama-bench" "$WORK/build/bin/llama-batched-bench" "$DEST/bin/"
find "$WORK/build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$DEST/lib/" \;
strip -s "$DEST/bin/"* "$DEST/lib/"*.so* 2>/dev/null || true
cp "$SRC/convert_hf_to_gguf.py" "$DEST/convert/"
cp -r "$SRC/conversion" "$SRC/gguf-py" "$DEST/convert/"
cp "$TOKENIZER/tokenizer.json" "$TOKENIZER/tokenizer_config.json" "$DEST/tokenizer/"
{
  echo "llama.cpp vendored by llama-cpp-python $VERSION (PyPI sdist)"
  git -C "$SRC" log -1 --format='commit %H %cd' 2>/dev/null || true
  echo "cmake ${FLAGS[*]}"
} >"$DEST/llama.cpp.txt"
du -sh "$DEST"
